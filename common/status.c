#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char tls_detail[512];
static _Thread_local baton_status_t tls_status;

const char *baton_status_str(baton_status_t status) {
    switch (status) {
    case BATON_OK: return "ok";
    case BATON_ERR_INVALID_ARG: return "invalid argument";
    case BATON_ERR_NO_MEMORY: return "out of memory";
    case BATON_ERR_IO: return "i/o error";
    case BATON_ERR_FORMAT: return "malformed input";
    case BATON_ERR_UNSUPPORTED: return "unsupported";
    case BATON_ERR_OUT_OF_RANGE: return "out of range";
    case BATON_ERR_NO_SPACE: return "no space";
    case BATON_ERR_TIMEOUT: return "timed out";
    case BATON_ERR_PEER: return "peer failure";
    case BATON_ERR_VERSION: return "unsupported version";
    case BATON_ERR_NOT_FOUND: return "not found";
    case BATON_ERR_BUSY: return "busy";
    case BATON_ERR_CANCELLED: return "cancelled";
    case BATON_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

baton_status_t baton_error(baton_status_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_detail, sizeof(tls_detail), fmt, ap);
    va_end(ap);
    tls_status = status;
    return status;
}

const char *baton_last_error(void) {
    if (tls_detail[0] != '\0') {
        return tls_detail;
    }
    return baton_status_str(tls_status);
}

void baton_clear_error(void) {
    tls_detail[0] = '\0';
    tls_status = BATON_OK;
}
