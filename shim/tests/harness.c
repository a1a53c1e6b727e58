#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "harness.h"

struct api A;

#define API(base, sym, params) extern CUresult sym params;
#include "api.def"
extern CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);

const char *harness_lookup(void)
{
    const char *m = getenv("FRACGPU_T_LOOKUP");
    return m && *m ? m : "direct";
}

static void need(void *p, const char *name)
{
    if (p == NULL) {
        fprintf(stderr, "harness: cannot resolve %s (%s)\n", name, harness_lookup());
        exit(90);
    }
}

/* The version each entry point is asked for: 12.4, except cuCtxCreate, which the
 * harness calls with the v2 signature (flags, device): 12.4 would give _v3, whose
 * signature differs, so ask for it as a program built before 11.4 does. */
static int api_version(const char *base)
{
    return strcmp(base, "cuCtxCreate") == 0 ? 11000 : 12040;
}

void harness_resolve(void)
{
    const char *m = harness_lookup();
    if (strcmp(m, "direct") == 0) {
#define API(base, sym, params) A.base = sym;
#include "api.def"
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    need(h, "libcuda.so.1");
    if (strcmp(m, "dlsym") == 0) {
#define API(base, sym, params) A.base = (CUresult(*) params)dlsym(h, #sym); need((void *)A.base, #sym);
#include "api.def"
        return;
    }
    int ptds = strcmp(m, "procaddr_ptds") == 0;
    typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    need((void *)gpa, "cuGetProcAddress_v2");
    /* the runtime first asks the driver for cuGetProcAddress itself */
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa("cuGetProcAddress", &self, 12040, 0, &st) == CUDA_SUCCESS && self != NULL)
        gpa = (gpa_fn)self;
    cuuint64_t flags = ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                            : CU_GET_PROC_ADDRESS_DEFAULT;
#define API(base, sym, params)                                                                   \
    {                                                                                            \
        void *p_ = NULL;                                                                         \
        gpa(#base, &p_, api_version(#base), flags, &st);                                         \
        need(p_, #base);                                                                         \
        A.base = (CUresult(*) params)p_;                                                         \
    }
#include "api.def"
}

CUresult harness_context(int dev)
{
    CUdevice d;
    CUcontext c;
    CUresult rc = A.cuInit(0);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = A.cuDeviceGet(&d, dev)) != CUDA_SUCCESS)
        return rc;
    if ((rc = A.cuDevicePrimaryCtxRetain(&c, d)) != CUDA_SUCCESS)
        return rc;
    return A.cuCtxSetCurrent(c);
}

uint64_t harness_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int harness_parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    if (strcmp(end, "Ki") == 0) v <<= 10;
    else if (strcmp(end, "Mi") == 0) v <<= 20;
    else if (strcmp(end, "Gi") == 0) v <<= 30;
    else if (*end != '\0') return -1;
    *out = v;
    return 0;
}
