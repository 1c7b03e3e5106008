/* libFuzzer target: kv_transfer_descriptor_parse must reject or accept any
 * byte string without crashing, and an accepted descriptor's fields must
 * satisfy the documented ranges. (The UCX address and rkey bytes inside a
 * well-framed descriptor are UCX's to parse and are not fuzzed here.) */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/kv_transfer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_transfer_remote_info_t info;
    baton_status_t st = kv_transfer_descriptor_parse(data, size, &info);
    if (st == BATON_OK) {
        if (info.n_layers <= 0 || info.n_blocks <= 0 || info.block_bytes == 0 || !info.k_addr ||
            !info.v_addr)
            abort();
    } else if (st != BATON_ERR_FORMAT && st != BATON_ERR_VERSION) {
        abort();
    }
    return 0;
}
