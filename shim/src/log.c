/* Logging to stderr only: tools parse nvidia-smi's stdout. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "shim.h"

int fracgpu_log_level = LOG_ERROR;

void fracgpu_log_init(const char *v)
{
    if (v == NULL || *v == '\0')
        return;
    /* The environment may only raise verbosity above the default. */
    if (strcmp(v, "warn") == 0) fracgpu_log_level = LOG_WARN;
    else if (strcmp(v, "info") == 0) fracgpu_log_level = LOG_INFO;
    else if (strcmp(v, "debug") == 0) fracgpu_log_level = LOG_DEBUG;
    else if (strcmp(v, "error") != 0)
        fracgpu_log(LOG_ERROR, "ignoring %s=%s: allowed values are error, warn, info, debug",
                    FRACGPU_ENV_LOG_LEVEL, v);
}

void fracgpu_log(int level, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char buf[1024];
    if (level > fracgpu_log_level)
        return;
    int n = snprintf(buf, sizeof buf, "fracgpu[%d] %s: ", (int)getpid(), names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}
