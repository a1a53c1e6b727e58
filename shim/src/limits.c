/*
 * The limits file: line-based key=value text written by the agent and mounted
 * read-only. The parser is strict (unknown keys, duplicates and out-of-range
 * values are errors) because a mistake must fail closed, never widen a slice.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "shim.h"

#define SEEN_VERSION (1u << 0)
#define SEEN_MODE (1u << 1)
#define SEEN_NS (1u << 2)
#define SEEN_POD (1u << 3)
#define SEEN_CONTAINER (1u << 4)
#define SEEN_POD_UID (1u << 5)
#define SEEN_COUNT (1u << 6)
#define SEEN_COMPUTE (1u << 7)
#define SEEN_PRIORITY (1u << 8)
#define SEEN_CTX (1u << 9)
#define SEEN_BURST (1u << 10)
#define SEEN_HOST_FALLBACK (1u << 11)
#define DSEEN_UUID (1u << 0)
#define DSEEN_MEM (1u << 1)
#define DSEEN_CORE (1u << 2)
#define DSEEN_CORE_MAX (1u << 3)

static int parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int fracgpu_parse_bytes(const char *s, uint64_t *out)
{
    static const struct { const char *sfx; unsigned shift; } units[] = {
        {"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}};
    char num[32];
    size_t n = strlen(s);
    unsigned shift = 0;
    if (n >= 2) {
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
            if (strcmp(s + n - 2, units[i].sfx) == 0) {
                shift = units[i].shift;
                n -= 2;
                break;
            }
        }
    }
    if (n == 0 || n >= sizeof num)
        return -1;
    memcpy(num, s, n);
    num[n] = '\0';
    uint64_t v;
    if (parse_u64(num, &v) != 0)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

static int set_error(char *err, size_t errlen, unsigned line, const char *fmt, const char *a)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a);
    if (line)
        snprintf(err, errlen, "line %u: %s", line, msg);
    else
        snprintf(err, errlen, "%s", msg);
    return -1;
}

static int valid_string(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > FRACGPU_MAX_STRING)
        return 0;
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 || *v == 0x7f)
            return 0;
    return 1;
}

static int valid_uuid(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= FRACGPU_UUID_MAX)
        return 0;
    for (; *v; v++) {
        char c = *v;
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-'))
            return 0;
    }
    return 1;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

static int parse_device_key(const char *key, const char *val, struct fracgpu_limits *out,
                            unsigned *dseen, unsigned line, char *err, size_t errlen)
{
    const char *p = key + strlen(FRACGPU_DEVICE_KEY_PREFIX);
    char idx[8];
    size_t n = 0;
    while (p[n] >= '0' && p[n] <= '9' && n < sizeof idx - 1) {
        idx[n] = p[n];
        n++;
    }
    idx[n] = '\0';
    uint64_t i;
    if (n == 0 || p[n] != '.' || (n > 1 && idx[0] == '0') || parse_u64(idx, &i) != 0 ||
        i >= FRACGPU_MAX_DEVICES)
        return set_error(err, errlen, line,
                         "bad device key '%s': expected device.<index>.<field> with index 0..15",
                         key);
    const char *field = p + n + 1;
    struct fracgpu_device_limits *d = &out->dev[i];
    unsigned bit;
    uint64_t v;
    if (strcmp(field, FRACGPU_DEVICE_KEY_UUID) == 0) {
        bit = DSEEN_UUID;
        if (!valid_uuid(val))
            return set_error(err, errlen, line, "bad %s: a GPU UUID of letters, digits and '-'", key);
        snprintf(d->uuid, sizeof d->uuid, "%s", val);
    } else if (strcmp(field, FRACGPU_DEVICE_KEY_MEMORY_LIMIT_BYTES) == 0) {
        bit = DSEEN_MEM;
        if (parse_u64(val, &v) != 0 || v == 0)
            return set_error(err, errlen, line, "bad %s: a positive number of bytes", key);
        d->memory_limit = v;
    } else if (strcmp(field, FRACGPU_DEVICE_KEY_CORE_LIMIT) == 0) {
        bit = DSEEN_CORE;
        if (parse_u64(val, &v) != 0 || v < 1 || v > 100)
            return set_error(err, errlen, line, "bad %s: a percentage 1..100", key);
        d->core_limit = (unsigned)v;
    } else if (strcmp(field, FRACGPU_DEVICE_KEY_CORE_LIMIT_MAX) == 0) {
        bit = DSEEN_CORE_MAX;
        if (parse_u64(val, &v) != 0 || v < 1 || v > 100)
            return set_error(err, errlen, line, "bad %s: a percentage 1..100", key);
        d->core_limit_max = (unsigned)v;
    } else {
        return set_error(err, errlen, line,
                         "unknown device field in '%s' (allowed: uuid, memory_limit_bytes, "
                         "core_limit, core_limit_max)", key);
    }
    if (dseen[i] & bit)
        return set_error(err, errlen, line, "duplicate key '%s'", key);
    dseen[i] |= bit;
    return 0;
}

static int parse_flag(const char *key, const char *val, int *out, unsigned line, char *err,
                      size_t errlen)
{
    if (strcmp(val, "0") == 0)
        *out = 0;
    else if (strcmp(val, "1") == 0)
        *out = 1;
    else
        return set_error(err, errlen, line, "bad %s: 0 or 1", key);
    return 0;
}

static int parse_line(char *key, char *val, struct fracgpu_limits *out, unsigned *seen,
                      unsigned *dseen, unsigned line, char *err, size_t errlen)
{
    static const struct { const char *key; unsigned bit; size_t off; } strings[] = {
        {FRACGPU_KEY_NAMESPACE, SEEN_NS, offsetof(struct fracgpu_limits, ns)},
        {FRACGPU_KEY_POD, SEEN_POD, offsetof(struct fracgpu_limits, pod)},
        {FRACGPU_KEY_CONTAINER, SEEN_CONTAINER, offsetof(struct fracgpu_limits, container)},
        {FRACGPU_KEY_POD_UID, SEEN_POD_UID, offsetof(struct fracgpu_limits, pod_uid)},
    };
    uint64_t v;
    unsigned bit = 0;
    if (strncmp(key, FRACGPU_DEVICE_KEY_PREFIX, strlen(FRACGPU_DEVICE_KEY_PREFIX)) == 0)
        return parse_device_key(key, val, out, dseen, line, err, errlen);
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        if (strcmp(key, strings[i].key) == 0) {
            if (!valid_string(val))
                return set_error(err, errlen, line,
                                 "bad %s: 1..253 printable characters", key);
            snprintf((char *)out + strings[i].off, FRACGPU_MAX_STRING + 1, "%s", val);
            bit = strings[i].bit;
            break;
        }
    }
    if (bit) {
        /* handled above */
    } else if (strcmp(key, FRACGPU_KEY_VERSION) == 0) {
        return set_error(err, errlen, line, "duplicate key '%s'", key);
    } else if (strcmp(key, FRACGPU_KEY_MODE) == 0) {
        bit = SEEN_MODE;
        if (strcmp(val, FRACGPU_MODE_WHOLE) == 0)
            out->whole = 1;
        else if (strcmp(val, FRACGPU_MODE_SLICED) == 0)
            out->whole = 0;
        else
            return set_error(err, errlen, line, "bad mode '%s': sliced or whole", val);
    } else if (strcmp(key, FRACGPU_KEY_DEVICE_COUNT) == 0) {
        bit = SEEN_COUNT;
        if (parse_u64(val, &v) != 0 || v > FRACGPU_MAX_DEVICES)
            return set_error(err, errlen, line, "bad device_count '%s': 0..16", val);
        out->device_count = (unsigned)v;
    } else if (strcmp(key, FRACGPU_KEY_COMPUTE_LIMIT_ENABLED) == 0) {
        bit = SEEN_COMPUTE;
        if (parse_flag(key, val, &out->compute_limit_enabled, line, err, errlen) != 0)
            return -1;
    } else if (strcmp(key, FRACGPU_KEY_BURST_WHEN_ALONE) == 0) {
        bit = SEEN_BURST;
        if (parse_flag(key, val, &out->burst_when_alone, line, err, errlen) != 0)
            return -1;
    } else if (strcmp(key, FRACGPU_KEY_MEMORY_HOST_FALLBACK) == 0) {
        bit = SEEN_HOST_FALLBACK;
        if (parse_flag(key, val, &out->memory_host_fallback, line, err, errlen) != 0)
            return -1;
    } else if (strcmp(key, FRACGPU_KEY_PRIORITY) == 0) {
        bit = SEEN_PRIORITY;
        if (parse_u64(val, &v) != 0 || v > 1)
            return set_error(err, errlen, line, "bad priority '%s': 0 (high) or 1 (low)", val);
        out->priority = (int)v;
    } else if (strcmp(key, FRACGPU_KEY_CONTEXT_OVERHEAD_BYTES) == 0) {
        bit = SEEN_CTX;
        if (parse_u64(val, &v) != 0)
            return set_error(err, errlen, line, "bad %s: a number of bytes", key);
        out->context_overhead = v;
    } else {
        return set_error(err, errlen, line, "unknown key '%s'", key);
    }
    if (*seen & bit)
        return set_error(err, errlen, line, "duplicate key '%s'", key);
    *seen |= bit;
    return 0;
}

static int check_devices(struct fracgpu_limits *out, const unsigned *dseen, char *err, size_t errlen)
{
    char idx[8];
    for (unsigned i = 0; i < FRACGPU_MAX_DEVICES; i++) {
        snprintf(idx, sizeof idx, "%u", i);
        if (i >= out->device_count) {
            if (dseen[i])
                return set_error(err, errlen, 0, "device.%s.* given but device_count is smaller", idx);
            continue;
        }
        if (!(dseen[i] & DSEEN_UUID))
            return set_error(err, errlen, 0, "missing device.%s.uuid", idx);
        if (!(dseen[i] & DSEEN_MEM))
            return set_error(err, errlen, 0, "missing device.%s.memory_limit_bytes", idx);
        struct fracgpu_device_limits *d = &out->dev[i];
        if (!(dseen[i] & DSEEN_CORE))
            d->core_limit = 100;
        if (!(dseen[i] & DSEEN_CORE_MAX))
            d->core_limit_max = d->core_limit;
        if (d->core_limit_max < d->core_limit)
            return set_error(err, errlen, 0, "device.%s.core_limit_max is below core_limit", idx);
        for (unsigned j = 0; j < i; j++)
            if (strcasecmp(out->dev[j].uuid, d->uuid) == 0)
                return set_error(err, errlen, 0, "device UUID '%s' listed twice", d->uuid);
    }
    return 0;
}

int fracgpu_limits_parse(const char *text, size_t len, struct fracgpu_limits *out, char *err,
                         size_t errlen)
{
    unsigned seen = 0, dseen[FRACGPU_MAX_DEVICES] = {0}, line = 0;
    char buf[FRACGPU_LIMITS_MAX_LINE + 1];
    memset(out, 0, sizeof *out);
    out->priority = FRACGPU_DEFAULT_PRIORITY;
    out->compute_limit_enabled = FRACGPU_DEFAULT_COMPUTE_LIMIT_ENABLED;
    out->burst_when_alone = FRACGPU_DEFAULT_BURST_WHEN_ALONE;
    out->context_overhead = FRACGPU_DEFAULT_CONTEXT_OVERHEAD_BYTES;
    out->memory_host_fallback = FRACGPU_DEFAULT_MEMORY_HOST_FALLBACK;
    if (len > FRACGPU_LIMITS_MAX_BYTES)
        return set_error(err, errlen, 0, "file is larger than %s bytes", "65536");
    if (memchr(text, '\0', len) != NULL)
        return set_error(err, errlen, 0, "file contains a NUL byte%s", "");
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
        line++;
        if (n > FRACGPU_LIMITS_MAX_LINE)
            return set_error(err, errlen, line, "line longer than %s bytes", "1024");
        memcpy(buf, text + pos, n);
        buf[n] = '\0';
        pos += n + (nl ? 1 : 0);
        char *s = trim(buf);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL)
            return set_error(err, errlen, line, "expected key=value, got '%.64s'", s);
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        if (!(seen & SEEN_VERSION)) {
            uint64_t v;
            if (strcmp(key, FRACGPU_KEY_VERSION) != 0)
                return set_error(err, errlen, line, "the first setting must be version=1, got '%s'", key);
            if (parse_u64(val, &v) != 0 || v != FRACGPU_LIMITS_VERSION)
                return set_error(err, errlen, line,
                                 "unsupported limits version '%s' (this shim reads version 1)", val);
            seen |= SEEN_VERSION;
            continue;
        }
        if (parse_line(key, val, out, &seen, dseen, line, err, errlen) != 0)
            return -1;
    }
    if (!(seen & SEEN_VERSION))
        return set_error(err, errlen, 0, "empty limits file: expected version=1 first%s", "");
    if (!out->whole && !(seen & SEEN_COUNT))
        return set_error(err, errlen, 0, "missing device_count%s", "");
    if (!out->whole && out->device_count == 0)
        return set_error(err, errlen, 0, "device_count must be at least 1 in %s mode", "sliced");
    return check_devices(out, dseen, err, errlen);
}

int fracgpu_limits_load(const char *path, struct fracgpu_limits *out, char *err, size_t errlen)
{
    char *text = malloc(FRACGPU_LIMITS_MAX_BYTES + 1);
    if (text == NULL)
        return set_error(err, errlen, 0, "out of host memory reading the limits file%s", "");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open limits file %s: %s", path, strerror(errno));
        free(text);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "limits file %s is not a regular file", path);
        close(fd);
        free(text);
        return -1;
    }
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, text + len, FRACGPU_LIMITS_MAX_BYTES + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "cannot read limits file %s: %s", path, strerror(errno));
            close(fd);
            free(text);
            return -1;
        }
        if (r == 0 || (len += (size_t)r) > FRACGPU_LIMITS_MAX_BYTES)
            break;
    }
    close(fd);
    char perr[400];
    int rc = fracgpu_limits_parse(text, len, out, perr, sizeof perr);
    if (rc != 0)
        snprintf(err, errlen, "malformed limits file %s: %s", path, perr);
    free(text);
    return rc;
}

void fracgpu_limits_apply_env(struct fracgpu_limits *lim, const char *mem_env, const char *core_env)
{
    uint64_t v;
    if (mem_env != NULL && *mem_env != '\0') {
        if (fracgpu_parse_bytes(mem_env, &v) != 0 || v == 0) {
            LOGE("ignoring %s=%s: expected a positive byte count, optionally with Ki, Mi, Gi "
                 "or Ti", FRACGPU_ENV_MEMORY_LIMIT, mem_env);
        } else {
            for (unsigned i = 0; i < lim->device_count; i++) {
                if (v < lim->dev[i].memory_limit)
                    lim->dev[i].memory_limit = v;
                else if (v > lim->dev[i].memory_limit)
                    LOGW("%s cannot raise device %u's memory limit above %llu bytes",
                         FRACGPU_ENV_MEMORY_LIMIT, i, (unsigned long long)lim->dev[i].memory_limit);
            }
        }
    }
    if (core_env != NULL && *core_env != '\0') {
        if (parse_u64(core_env, &v) != 0 || v < 1 || v > 100) {
            LOGE("ignoring %s=%s: expected a percentage 1..100", FRACGPU_ENV_CORE_LIMIT, core_env);
        } else {
            for (unsigned i = 0; i < lim->device_count; i++) {
                if (v < lim->dev[i].core_limit)
                    lim->dev[i].core_limit = (unsigned)v;
                else if (v > lim->dev[i].core_limit)
                    LOGW("%s cannot raise device %u's core limit above %u%%",
                         FRACGPU_ENV_CORE_LIMIT, i, lim->dev[i].core_limit);
            }
        }
    }
}
