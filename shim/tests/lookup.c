/*
 * Interception of every way a program finds a hooked driver function: the
 * dynamic linker, dlsym on the driver handle, dlsym(RTLD_DEFAULT) and
 * cuGetProcAddress (plain, _v2, versioned and per-thread-stream). Prints
 * "<symbol> <way> <object that implements it>" for pytest to check.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "harness.h"

#define CUHOOK(name, params, args) extern CUresult name params;
#include "hooks.def"
extern char fracgpu_probe_next_of_a(void);

static const char *where(const void *p)
{
    Dl_info info;
    if (p == NULL)
        return "null";
    if (dladdr(p, &info) == 0 || info.dli_fname == NULL)
        return "unknown";
    const char *s = strrchr(info.dli_fname, '/');
    return s ? s + 1 : info.dli_fname;
}

/* cuGetProcAddress arguments that select this exact versioned symbol */
static void query_for(const char *sym, char *base, int *version, cuuint64_t *flags)
{
    size_t n = strlen(sym);
    *version = 12040;
    *flags = CU_GET_PROC_ADDRESS_DEFAULT;
    snprintf(base, 128, "%s", sym);
    if (n > 5 && strcmp(sym + n - 5, "_ptsz") == 0) {
        base[n - 5] = '\0';
        *flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    } else if (n > 3 && sym[n - 3] == '_' && sym[n - 2] == 'v') {
        base[n - 3] = '\0';
        if (strcmp(sym, "cuCtxCreate_v2") == 0 || strcmp(sym, "cuGraphInstantiate_v2") == 0)
            *version = 11000;
        else if (strcmp(sym, "cuCtxCreate_v3") == 0)
            *version = 11040;
        else if (strcmp(sym, "cuCtxCreate_v4") == 0)
            *version = 12050;
    } else if (strcmp(sym, "cuGetProcAddress") == 0) {
        *version = 11030;
    } else if (strcmp(sym, "cuDevicePrimaryCtxRelease") == 0 ||
               strcmp(sym, "cuDevicePrimaryCtxReset") == 0) {
        *version = 10000; /* superseded by _v2 in 11.0 */
    } else if (strcmp(sym, "cuGraphInstantiate") == 0) {
        *version = 10000; /* then _v2 (11.0), then cuGraphInstantiateWithFlags (12.0) */
    } else if (strcmp(sym, "cuCtxSetLimit") == 0) {
        *version = 3010;
    }
}

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
    typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
    gpa2_fn gpa2 = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
    gpa1_fn gpa1 = (gpa1_fn)dlsym(h, "cuGetProcAddress");
#define CUHOOK(name, params, args)                                                               \
    {                                                                                            \
        char base[128];                                                                          \
        int ver;                                                                                 \
        cuuint64_t fl;                                                                           \
        void *p = NULL;                                                                          \
        CUdriverProcAddressQueryResult st = -1;                                                  \
        printf("%s linker %s\n", #name, where((void *)name));                                    \
        printf("%s dlsym %s\n", #name, where(dlsym(h, #name)));                                  \
        printf("%s default %s\n", #name, where(dlsym(RTLD_DEFAULT, #name)));                     \
        query_for(#name, base, &ver, &fl);                                                       \
        CUresult rc = gpa2(base, &p, ver, fl, &st);                                              \
        printf("%s procaddr_v2 %s %d %d\n", #name, where(p), rc, st);                            \
        p = NULL;                                                                                \
        rc = gpa1(base, &p, ver, fl);                                                            \
        printf("%s procaddr %s %d\n", #name, where(p), rc);                                      \
    }
#include "hooks.def"
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = -1;
    CUresult rc = gpa2("cuNoSuchFunction", &p, 12040, 0, &st);
    printf("missing %d %d %s\n", rc, st, p == NULL ? "null" : "set");
    rc = gpa2("cuMemAlloc", &p, 3000, 0, &st);
    printf("too_old %d %d\n", rc, st);
    printf("rtld_next %c\n", fracgpu_probe_next_of_a());
    return 0;
}
