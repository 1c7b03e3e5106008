/* libFuzzer target: proto_decode on arbitrary bytes must return a status,
 * never crash, leak or allocate beyond the input's size; whatever it
 * accepts must re-encode into a message that decodes again to the same
 * bytes (encode(decode(x)) is a fixed point). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/messages.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    proto_limits_t lim;
    proto_limits_default(49152, &lim);
    lim.max_msg_bytes = 1u << 20;
    proto_msg_t msg;
    if (proto_decode(data, size, &lim, &msg) != BATON_OK) return 0;
    msgpack_sbuffer a, b;
    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    if (proto_encode(&msg, &a) != BATON_OK) abort();
    proto_msg_t again;
    if (proto_decode(a.data, a.size, &lim, &again) != BATON_OK) abort();
    if (proto_encode(&again, &b) != BATON_OK) abort();
    if (a.size != b.size || memcmp(a.data, b.data, a.size) != 0) abort();
    proto_msg_free(&again);
    proto_msg_free(&msg);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
    return 0;
}
