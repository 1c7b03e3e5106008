/* router: detokenization + stop strings for one choice (see stream.h). */
#include "router/stream.h"

#include <stdlib.h>
#include <string.h>

#include "router/http_api.h"

struct stream {
    detok_t *detok;
    char *stops[HTTP_API_MAX_STOP];
    size_t stop_lens[HTTP_API_MAX_STOP];
    size_t n_stops;
    char *pending; /* decoded text not yet emitted: [0, n_pending) */
    size_t n_pending, cap_pending;
    char *out;     /* what the last call returned */
    size_t cap_out;
    bool stopped;
};

baton_status_t stream_init(const tokenizer_t *tok, char *const *stops, const size_t *stop_lens,
                           size_t n_stops, stream_t **out) {
    if (!tok || !out || n_stops > HTTP_API_MAX_STOP || (n_stops && (!stops || !stop_lens)))
        return baton_error(BATON_ERR_INVALID_ARG, "stream_init: bad argument");
    for (size_t i = 0; i < n_stops; i++)
        if (!stops[i] || stop_lens[i] == 0)
            return baton_error(BATON_ERR_INVALID_ARG, "stream_init: empty stop string %zu", i);
    stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return baton_error(BATON_ERR_NO_MEMORY, "stream_init: out of memory");
    baton_status_t st = detok_init(tok, 0, &s->detok);
    if (st != BATON_OK) {
        free(s);
        return st;
    }
    for (size_t i = 0; i < n_stops; i++) {
        s->stops[i] = malloc(stop_lens[i]);
        if (!s->stops[i]) {
            s->n_stops = i;
            stream_free(s);
            return baton_error(BATON_ERR_NO_MEMORY, "stream_init: out of memory");
        }
        memcpy(s->stops[i], stops[i], stop_lens[i]);
        s->stop_lens[i] = stop_lens[i];
    }
    s->n_stops = n_stops;
    *out = s;
    return BATON_OK;
}

void stream_free(stream_t *s) {
    if (!s)
        return;
    detok_free(s->detok);
    for (size_t i = 0; i < s->n_stops; i++)
        free(s->stops[i]);
    free(s->pending);
    free(s->out);
    free(s);
}

bool stream_stopped(const stream_t *s) { return s && s->stopped; }

static baton_status_t reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return BATON_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    char *b = realloc(*buf, c);
    if (!b)
        return baton_error(BATON_ERR_NO_MEMORY, "stream: out of memory");
    *buf = b;
    *cap = c;
    return BATON_OK;
}

/* Moves pending[0, n) to the output buffer and shifts the rest down. */
static baton_status_t emit(stream_t *s, size_t n, const char **text, size_t *len) {
    baton_status_t st = reserve(&s->out, &s->cap_out, n + 1);
    if (st != BATON_OK)
        return st;
    memcpy(s->out, s->pending, n);
    s->out[n] = 0;
    memmove(s->pending, s->pending + n, s->n_pending - n);
    s->n_pending -= n;
    *text = s->out;
    *len = n;
    return BATON_OK;
}

/* Earliest stop-string match in pending: its offset, or SIZE_MAX. */
static size_t find_stop(const stream_t *s) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < s->n_stops; i++) {
        size_t L = s->stop_lens[i];
        for (size_t off = 0; off + L <= s->n_pending && off < best; off++)
            if (memcmp(s->pending + off, s->stops[i], L) == 0) {
                best = off;
                break;
            }
    }
    return best;
}

/* Longest suffix of pending that is a proper prefix of some stop string. */
static size_t held_suffix(const stream_t *s) {
    size_t hold = 0;
    for (size_t i = 0; i < s->n_stops; i++) {
        size_t L = s->stop_lens[i];
        size_t k = L - 1 < s->n_pending ? L - 1 : s->n_pending;
        for (; k > hold; k--)
            if (memcmp(s->pending + s->n_pending - k, s->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

baton_status_t stream_push(stream_t *s, int32_t id, const char **text, size_t *len,
                           bool *stopped) {
    if (!s || !text || !len || !stopped)
        return baton_error(BATON_ERR_INVALID_ARG, "stream_push: NULL argument");
    static const char empty[] = "";
    if (s->stopped) {
        *text = empty;
        *len = 0;
        *stopped = true;
        return BATON_OK;
    }
    const char *piece;
    size_t n_piece;
    baton_status_t st = detok_push(s->detok, id, &piece, &n_piece);
    if (st != BATON_OK)
        return st;
    if ((st = reserve(&s->pending, &s->cap_pending, s->n_pending + n_piece + 1)) != BATON_OK)
        return st;
    memcpy(s->pending + s->n_pending, piece, n_piece);
    s->n_pending += n_piece;
    size_t at = find_stop(s);
    if (at != SIZE_MAX) {
        if ((st = emit(s, at, text, len)) != BATON_OK)
            return st;
        s->n_pending = 0;
        s->stopped = true;
        *stopped = true;
        return BATON_OK;
    }
    *stopped = false;
    return emit(s, s->n_pending - held_suffix(s), text, len);
}

baton_status_t stream_finish(stream_t *s, const char **text, size_t *len) {
    if (!s || !text || !len)
        return baton_error(BATON_ERR_INVALID_ARG, "stream_finish: NULL argument");
    static const char empty[] = "";
    if (s->stopped) {
        *text = empty;
        *len = 0;
        return BATON_OK;
    }
    /* What the detokenizer still holds is only an incomplete trailing
     * character (everything complete was returned by detok_push); its
     * flush would turn it into U+FFFD. A generation cut there (max_tokens)
     * drops the partial character instead, so no delta carries U+FFFD. */
    const char *piece;
    size_t n_piece;
    baton_status_t st = detok_flush(s->detok, &piece, &n_piece);
    if (st != BATON_OK)
        return st;
    return emit(s, s->n_pending, text, len);
}
