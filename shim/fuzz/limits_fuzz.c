/*
 * libFuzzer harness for the shim's limits-file parser (src/limits.c).
 *
 * Every input is parsed as a whole limits file. When the input holds a NUL
 * byte, the bytes before it are also parsed as a file and the bytes after it
 * are two environment values (FRACGPU_MEMORY_LIMIT, then FRACGPU_CORE_LIMIT,
 * split at the next NUL) applied to the result: they may only lower limits.
 * Any broken invariant aborts, which libFuzzer reports as a crash.
 * Build: make -C shim fuzz; run: shim/build/fuzz/limits_fuzz -dict=shim/fuzz/limits.dict CORPUS
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "limits_fuzz: invariant broken: %s (line %d)\n", #cond,  \
                    __LINE__);                                                        \
            abort();                                                                  \
        }                                                                             \
    } while (0)

static void check_text(const char *s, size_t cap, int uuid)
{
    size_t n = strnlen(s, cap);
    CHECK(n < cap);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (uuid)
            CHECK((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  c == '-');
        else
            CHECK(c >= 0x20 && c != 0x7f);
    }
}

/* What docs/shim.md promises about an accepted file. */
static void check_accepted(const struct fracgpu_limits *l)
{
    static const struct fracgpu_device_limits zero;
    CHECK(l->whole == 0 || l->whole == 1);
    CHECK(l->device_count <= FRACGPU_MAX_DEVICES);
    CHECK(l->whole || l->device_count >= 1);
    CHECK(l->compute_limit_enabled == 0 || l->compute_limit_enabled == 1);
    CHECK(l->burst_when_alone == 0 || l->burst_when_alone == 1);
    CHECK(l->priority == 0 || l->priority == 1);
    CHECK(l->memory_host_fallback == 0 || l->memory_host_fallback == 1);
    check_text(l->ns, sizeof l->ns, 0);
    check_text(l->pod, sizeof l->pod, 0);
    check_text(l->container, sizeof l->container, 0);
    check_text(l->pod_uid, sizeof l->pod_uid, 0);
    for (unsigned i = 0; i < FRACGPU_MAX_DEVICES; i++) {
        const struct fracgpu_device_limits *d = &l->dev[i];
        if (i >= l->device_count) {
            CHECK(memcmp(d, &zero, sizeof zero) == 0);
            continue;
        }
        check_text(d->uuid, sizeof d->uuid, 1);
        CHECK(d->uuid[0] != '\0');
        CHECK(d->memory_limit >= 1);
        CHECK(d->core_limit >= 1 && d->core_limit <= 100);
        CHECK(d->core_limit_max >= d->core_limit && d->core_limit_max <= 100);
        for (unsigned j = 0; j < i; j++)
            CHECK(strcasecmp(l->dev[j].uuid, d->uuid) != 0);
    }
}

static int parse_checked(const char *text, size_t len, struct fracgpu_limits *out)
{
    char err[512];
    memset(err, 0, sizeof err);
    int rc = fracgpu_limits_parse(text, len, out, err, sizeof err);
    CHECK(rc == 0 || rc == -1);
    if (rc == 0)
        check_accepted(out);
    else
        CHECK(err[0] != '\0' && strnlen(err, sizeof err) < sizeof err); /* every refusal says why */
    return rc;
}

/* The environment may only lower a limit, never raise one. */
static void check_env(const struct fracgpu_limits *parsed, const char *mem, const char *core)
{
    static struct fracgpu_limits lowered;
    lowered = *parsed;
    fracgpu_limits_apply_env(&lowered, mem, core);
    uint64_t mem_v = 0;
    int mem_ok = fracgpu_parse_bytes(mem, &mem_v) == 0 && mem_v > 0;
    CHECK(lowered.device_count == parsed->device_count);
    for (unsigned i = 0; i < parsed->device_count; i++) {
        CHECK(lowered.dev[i].memory_limit <= parsed->dev[i].memory_limit);
        CHECK(lowered.dev[i].memory_limit >= 1);
        if (mem_ok)
            CHECK(lowered.dev[i].memory_limit <= mem_v);
        CHECK(lowered.dev[i].core_limit <= parsed->dev[i].core_limit);
        CHECK(lowered.dev[i].core_limit >= 1);
        CHECK(strcmp(lowered.dev[i].uuid, parsed->dev[i].uuid) == 0);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fracgpu_log_level = -1; /* the env checks log every malformed value; keep the run quiet */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fracgpu_limits lim;
    /* Parse the exact libFuzzer buffer so ASan sees any read past its end. */
    parse_checked((const char *)data, size, &lim);

    const uint8_t *nul = memchr(data, '\0', size);
    if (nul == NULL)
        return 0;
    size_t file_len = (size_t)(nul - data);
    if (parse_checked((const char *)data, file_len, &lim) != 0)
        return 0;
    size_t rest = size - file_len - 1;
    char *env = malloc(rest + 2); /* two NUL-terminated values */
    if (env == NULL)
        return 0;
    memcpy(env, nul + 1, rest);
    env[rest] = '\0';
    env[rest + 1] = '\0';
    const char *mem = env;
    const char *core = env + strlen(env) + 1;
    check_env(&lim, mem, core);
    free(env);
    return 0;
}
