/* Logging to stderr with levels.
 *
 * The level comes from BATON_LOG_LEVEL (error, warn, info, debug; default
 * info) read once at the first call, or from log_set_level(). Each line is
 * "<iso time> <level> <component>: message". Thread-safe (one write per
 * line). */
#ifndef BATON_COMMON_LOG_H
#define BATON_COMMON_LOG_H

typedef enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN = 1,
    LOG_LEVEL_INFO = 2,
    LOG_LEVEL_DEBUG = 3,
} log_level_t;

void log_set_level(log_level_t level);
log_level_t log_get_level(void);

/* Writes one line if `level` is enabled. `component` names the module
 * ("gguf", "kv_pool", ...). */
void log_write(log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_ERROR(comp, ...) log_write(LOG_LEVEL_ERROR, comp, __VA_ARGS__)
#define LOG_WARN(comp, ...) log_write(LOG_LEVEL_WARN, comp, __VA_ARGS__)
#define LOG_INFO(comp, ...) log_write(LOG_LEVEL_INFO, comp, __VA_ARGS__)
#define LOG_DEBUG(comp, ...)                                                  \
    do {                                                                      \
        if (log_get_level() >= LOG_LEVEL_DEBUG)                               \
            log_write(LOG_LEVEL_DEBUG, comp, __VA_ARGS__);                    \
    } while (0)

#endif
