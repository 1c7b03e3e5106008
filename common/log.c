#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static log_level_t g_level = LOG_LEVEL_INFO;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void log_init(void) {
    const char *env = getenv("BATON_LOG_LEVEL");
    if (env == NULL) return;
    if (strcasecmp(env, "error") == 0) g_level = LOG_LEVEL_ERROR;
    else if (strcasecmp(env, "warn") == 0) g_level = LOG_LEVEL_WARN;
    else if (strcasecmp(env, "info") == 0) g_level = LOG_LEVEL_INFO;
    else if (strcasecmp(env, "debug") == 0) g_level = LOG_LEVEL_DEBUG;
}

void log_set_level(log_level_t level) {
    pthread_once(&g_once, log_init);
    g_level = level;
}

log_level_t log_get_level(void) {
    pthread_once(&g_once, log_init);
    return g_level;
}

void log_write(log_level_t level, const char *component, const char *fmt, ...) {
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    if (level > log_get_level()) return;
    char line[2048];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), names[level],
                     component ? component : "-");
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2) len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
