/* baton status codes and the per-thread error detail.
 *
 * One status enum for the whole project (UCX style): 0 is success, every
 * error is negative. A function that fails returns a status and, where a
 * human needs more than the code, records a one-line detail with
 * baton_error(); the caller reads it with baton_last_error() on the same
 * thread. Output parameters are written only on success. */
#ifndef BATON_COMMON_STATUS_H
#define BATON_COMMON_STATUS_H

typedef enum baton_status {
    BATON_OK = 0,
    BATON_ERR_INVALID_ARG = -1,  /* caller passed a bad argument */
    BATON_ERR_NO_MEMORY = -2,    /* allocation failed */
    BATON_ERR_IO = -3,           /* open/read/mmap/socket failure */
    BATON_ERR_FORMAT = -4,       /* malformed input: file, message, JSON */
    BATON_ERR_UNSUPPORTED = -5,  /* well-formed but not supported (type, arch) */
    BATON_ERR_OUT_OF_RANGE = -6, /* value outside its allowed range */
    BATON_ERR_NO_SPACE = -7,     /* out of KV blocks or another pool */
    BATON_ERR_TIMEOUT = -8,      /* a deadline passed */
    BATON_ERR_PEER = -9,         /* remote peer failed or disconnected */
    BATON_ERR_VERSION = -10,     /* newer major schema/format version */
    BATON_ERR_NOT_FOUND = -11,   /* key, tensor, request id unknown */
    BATON_ERR_BUSY = -12,        /* try again later */
    BATON_ERR_CANCELLED = -13,   /* aborted by the client or a peer */
    BATON_ERR_INTERNAL = -14,    /* broken internal invariant */
} baton_status_t;

/* Short constant name of a status ("invalid argument", ...). Never NULL. */
const char *baton_status_str(baton_status_t status);

/* Records a printf-style detail for the calling thread and returns `status`,
 * so a failing path reads `return baton_error(BATON_ERR_FORMAT, "...", ...)`.
 * The detail replaces any earlier one; it is truncated at 511 bytes. */
baton_status_t baton_error(baton_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's most recent detail, or its status string if none was
 * recorded since baton_clear_error(). Valid until the next baton_error() on
 * this thread. Never NULL. */
const char *baton_last_error(void);

/* Forgets the calling thread's detail. */
void baton_clear_error(void);

#endif
