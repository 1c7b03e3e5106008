/* router: one choice's text stream: incremental detokenization and stop
 * strings.
 *
 * Token ids go through the UTF-8-safe incremental detokenizer
 * (common/tokenizer.h detok_t), so no delta ever ends inside a character.
 * Stop strings (up to HTTP_API_MAX_STOP, matched on the decoded text, also
 * across token boundaries) are searched in the not-yet-emitted text; text
 * that could still become the start of a stop string is held back until the
 * next token decides it (OpenAI semantics: the stop string itself is not
 * returned). Streaming and non-streaming responses use the same stream, so
 * the joined deltas equal the non-streamed text byte for byte. */
#ifndef BATON_ROUTER_STREAM_H
#define BATON_ROUTER_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tokenizer.h"

typedef struct stream stream_t;

/* Creates a stream decoding with `tok` (must outlive it) and the stop
 * strings stops[0..n_stops) of stop_lens bytes each (copied; each must be
 * non-empty). Errors: BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY. */
baton_status_t stream_init(const tokenizer_t *tok, char *const *stops, const size_t *stop_lens,
                           size_t n_stops, stream_t **out);

/* NULL-safe. */
void stream_free(stream_t *s);

/* Adds one generated token. *text / *len receive the text that may be sent
 * now (possibly empty; valid until the next call on `s`); *stopped becomes
 * true when a stop string completed: the text before it is returned and
 * every later push returns nothing. Errors: BATON_ERR_OUT_OF_RANGE (bad
 * id, stream unchanged), BATON_ERR_NO_MEMORY. */
baton_status_t stream_push(stream_t *s, int32_t id, const char **text, size_t *len,
                           bool *stopped);

/* Ends the stream (no stop string completed): returns the held-back text.
 * An incomplete UTF-8 character at the very end (the generation was cut
 * inside a multi-byte character, e.g. by max_tokens) is dropped rather than
 * sent as U+FFFD. After a stop it returns nothing. Errors:
 * BATON_ERR_NO_MEMORY. */
baton_status_t stream_finish(stream_t *s, const char **text, size_t *len);

/* True once a stop string has matched. */
bool stream_stopped(const stream_t *s);

#endif
