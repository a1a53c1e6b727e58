/*
 * CUDA driver API hooks: memory accounting against the slice, the slice as
 * the device's size, launch pacing, and interception of cuGetProcAddress so
 * that the CUDA runtime's way of finding the driver is covered too.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "shim.h"

enum { MODE_UNKNOWN = 0, MODE_ACCOUNT = 1, MODE_PASS = 2, MODE_FAIL_LIMITS = 3, MODE_FAIL_NOLIB = 4 };
static int cu_mode;
static int ord_to_idx[64] = {[0 ... 63] = -2};
static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned prim_refs[FRACGPU_MAX_DEVICES];
static uint64_t prim_ctx[FRACGPU_MAX_DEVICES];

void fracgpu_cuda_reset_after_fork(void)
{
    /* The child holds no contexts, and a parent thread may have held the lock. */
    pthread_mutex_init(&prim_mu, NULL);
    memset(prim_refs, 0, sizeof prim_refs);
    memset(prim_ctx, 0, sizeof prim_ctx);
}

static int slow_mode(void)
{
    if (fracgpu_ensure_core() != 0)
        return __atomic_load_n(&G.state, __ATOMIC_ACQUIRE) == ST_FAILED ? MODE_FAIL_LIMITS
                                                                          : MODE_FAIL_NOLIB;
    int m = MODE_FAIL_NOLIB;
    if (fracgpu_ensure_cuda() == 0)
        m = G.limits.whole ? MODE_PASS : MODE_ACCOUNT;
    if (m == MODE_ACCOUNT)
        fracgpu_ensure_slot(); /* a process using CUDA holds a slot from its first call */
    __atomic_store_n(&cu_mode, m, __ATOMIC_RELEASE);
    return m;
}

/* -1 with *err set, or MODE_ACCOUNT / MODE_PASS. */
static inline int enter(CUresult *err)
{
    int m = __atomic_load_n(&cu_mode, __ATOMIC_ACQUIRE);
    if (UNLIKELY(m != MODE_ACCOUNT)) {
        if (m == MODE_UNKNOWN)
            m = slow_mode();
        if (m == MODE_FAIL_LIMITS) {
            *err = CUDA_ERROR_NOT_PERMITTED;
            return -1;
        }
        if (m == MODE_FAIL_NOLIB) {
            *err = CUDA_ERROR_NOT_INITIALIZED;
            return -1;
        }
    }
    return m;
}

#define ENTER(name)                                                                              \
    CUresult enter_err_ = 0;                                                                       \
    int mode_ = enter(&enter_err_);                                                              \
    if (UNLIKELY(mode_ < 0))                                                                     \
        return enter_err_;                                                                       \
    if (UNLIKELY(real_##name == NULL))                                                           \
        return CUDA_ERROR_NOT_FOUND;

static void format_uuid(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

int fracgpu_cuda_dev_index(CUdevice dev)
{
    if (dev < 0 || dev >= 64)
        return -1;
    int v = __atomic_load_n(&ord_to_idx[dev], __ATOMIC_ACQUIRE);
    if (LIKELY(v != -2))
        return v;
    CUuuid u;
    char s[FRACGPU_UUID_MAX];
    v = -1;
    if (real_cuDeviceGetUuid != NULL && real_cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS) {
        format_uuid(&u, s, sizeof s);
        for (unsigned i = 0; i < G.limits.device_count; i++)
            if (strcasecmp(G.limits.dev[i].uuid, s) == 0)
                v = (int)i;
        if (v < 0)
            LOGE("CUDA device %d (%s) is not in the limits file: no memory on it is allowed",
                 dev, s);
    } else {
        return -1; /* not cached: the driver may not be initialised yet */
    }
    __atomic_store_n(&ord_to_idx[dev], v, __ATOMIC_RELEASE);
    return v;
}

int fracgpu_current_dev_index(void)
{
    CUdevice d;
    if (real_cuCtxGetDevice == NULL || real_cuCtxGetDevice(&d) != CUDA_SUCCESS)
        return -1;
    return fracgpu_cuda_dev_index(d);
}

/* ---- memory accounting helpers ---- */

static CUresult reserve_on(int di, uint64_t bytes)
{
    if (fracgpu_ensure_slot() != 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* cannot account: fail closed */
    if (di < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Before refusing, take back what pools released at synchronisations since. */
    if (fracgpu_region_reserve(G.region, G.slot, (unsigned)di, bytes,
                               G.limits.dev[di].memory_limit) != 0 &&
        (fracgpu_pool_settle_all() == 0 ||
         fracgpu_region_reserve(G.region, G.slot, (unsigned)di, bytes,
                                G.limits.dev[di].memory_limit) != 0)) {
        LOGI("allocation of %llu bytes refused: the slice of device %d is %llu bytes, %llu in use",
             (unsigned long long)bytes, di, (unsigned long long)G.limits.dev[di].memory_limit,
             (unsigned long long)__atomic_load_n(&G.region->dev[di].memory_used, __ATOMIC_RELAXED));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static void release_on(unsigned di, uint64_t bytes, int host)
{
    if (G.slot >= 0 && bytes)
        fracgpu_region_release(G.region, G.slot, di, bytes, host);
}

/* Device (limits index and CUDA ordinal) and context of the calling thread, for an
 * allocation. */
static CUresult current(int *di, uint64_t *ctx, CUdevice *dev)
{
    CUdevice d;
    CUcontext c = NULL;
    CUresult rc = real_cuCtxGetDevice(&d);
    if (rc != CUDA_SUCCESS)
        return rc;
    real_cuCtxGetCurrent(&c);
    *ctx = (uint64_t)(uintptr_t)c;
    *di = fracgpu_cuda_dev_index(d);
    *dev = d;
    return CUDA_SUCCESS;
}

/*
 * Host fallback: the container's reservation succeeded but the GPU itself is full
 * (its slices add up to more than its memory). Serve the allocation from managed
 * memory that prefers to live on the host and stays mapped for the device, so the
 * program's kernels reach it over the host link without page-fault migrations. Its
 * bytes stay counted against the slice and are marked as host-backed.
 */
static CUresult serve_from_host(CUdeviceptr *dptr, uint64_t bytes, int di, CUdevice dev)
{
    if (real_cuMemAllocManaged == NULL || real_cuMemAdvise == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr p = 0;
    CUresult rc = real_cuMemAllocManaged(&p, (size_t)bytes, CU_MEM_ATTACH_GLOBAL);
    if (rc != CUDA_SUCCESS) {
        LOGI("host fallback: managed allocation of %llu bytes failed (%d)",
             (unsigned long long)bytes, rc);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if ((rc = real_cuMemAdvise(p, (size_t)bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                               CU_DEVICE_CPU)) != CUDA_SUCCESS ||
        (rc = real_cuMemAdvise(p, (size_t)bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, dev)) !=
            CUDA_SUCCESS) {
        /* Unadvised managed memory would migrate onto the full GPU: refuse instead. */
        LOGW("host fallback: cannot place %llu bytes on the host for device %d (%d); "
             "the allocation fails with out-of-memory", (unsigned long long)bytes, dev, rc);
        real_cuMemFree_v2(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fracgpu_region_to_host(G.region, G.slot, (unsigned)di, bytes);
    LOGI("device %d is full: %llu bytes of the slice served from host memory", dev,
         (unsigned long long)bytes);
    *dptr = p;
    return CUDA_SUCCESS;
}

static inline int host_fallback_on(CUresult rc)
{
    return rc == CUDA_ERROR_OUT_OF_MEMORY && G.limits.memory_host_fallback;
}

static void record(uint32_t kind, uint64_t key, uint64_t bytes, int di, uint64_t ctx)
{
    if (fracgpu_table_put(kind, key, bytes, (unsigned)di, ctx) != 0) {
        LOGE("out of host memory tracking an allocation; its %llu bytes stay counted",
             (unsigned long long)bytes);
    }
}

/* fallback_ptr: a linear allocation into that CUdeviceptr * may be served from host
 * memory when the GPU is full (NULL: never). */
#define ALLOC_IN_CURRENT(kind, bytes, realcall, keyexpr, fallback_ptr)                           \
    do {                                                                                         \
        if (mode_ == MODE_PASS)                                                                  \
            return realcall;                                                                     \
        int di_;                                                                                 \
        uint64_t ctx_;                                                                           \
        CUdevice dev_;                                                                           \
        CUresult rc_ = current(&di_, &ctx_, &dev_);                                              \
        if (rc_ != CUDA_SUCCESS)                                                                 \
            return rc_;                                                                          \
        uint64_t n_ = (bytes);                                                                   \
        if ((rc_ = reserve_on(di_, n_)) != CUDA_SUCCESS)                                         \
            return rc_;                                                                          \
        rc_ = realcall;                                                                          \
        CUdeviceptr *fb_ = (fallback_ptr);                                                       \
        if (fb_ != NULL && UNLIKELY(host_fallback_on(rc_)) &&                                    \
            serve_from_host(fb_, n_, di_, dev_) == CUDA_SUCCESS) {                               \
            record(ALLOC_HOST_PTR, *fb_, n_, di_, ctx_);                                         \
            return CUDA_SUCCESS;                                                                 \
        }                                                                                        \
        if (rc_ != CUDA_SUCCESS) {                                                               \
            release_on((unsigned)di_, n_, 0);                                                    \
            return rc_;                                                                          \
        }                                                                                        \
        record(kind, (keyexpr), n_, di_, ctx_);                                                  \
        return CUDA_SUCCESS;                                                                     \
    } while (0)

/* Take the record first, so the address cannot be reused by another thread
 * before we release it; put it back if the driver refuses the free. */
#define FREE_KIND(kind, key, realcall)                                                           \
    do {                                                                                         \
        if (mode_ == MODE_PASS)                                                                  \
            return realcall;                                                                     \
        uint64_t sz_, k_ = (key);                                                                \
        unsigned di_;                                                                            \
        int had_ = fracgpu_table_take(kind, k_, &sz_, &di_) == 0;                                \
        CUresult rc_ = realcall;                                                                 \
        if (had_) {                                                                              \
            if (rc_ == CUDA_SUCCESS)                                                             \
                release_on(di_, sz_, 0);                                                         \
            else                                                                                 \
                fracgpu_table_put(kind, k_, sz_, di_, 0);                                        \
        }                                                                                        \
        return rc_;                                                                              \
    } while (0)

/* ---- initialisation and lookup ---- */

EXPORT CUresult cuInit(unsigned int flags)
{
    ENTER(cuInit);
    (void)mode_;
    return real_cuInit(flags);
}

static void swap_in_hook(void **pfn)
{
    if (pfn != NULL && *pfn != NULL) {
        void *h = fracgpu_hook_for_real(*pfn);
        if (h != NULL)
            *pfn = h;
    }
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    ENTER(cuGetProcAddress);
    CUresult rc = real_cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        swap_in_hook(pfn);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    ENTER(cuGetProcAddress_v2);
    CUresult rc = real_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        swap_in_hook(pfn);
    return rc;
}

/* ---- the slice as the device's size ---- */

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem_v2);
    CUresult rc = real_cuDeviceTotalMem_v2(bytes, dev);
    if (rc != CUDA_SUCCESS || mode_ == MODE_PASS)
        return rc;
    int di = fracgpu_cuda_dev_index(dev);
    uint64_t limit = di < 0 ? 0 : G.limits.dev[di].memory_limit;
    /* With host fallback the slice may be larger than the GPU: it is still the size. */
    if (limit < *bytes || G.limits.memory_host_fallback)
        *bytes = (size_t)limit;
    return rc;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    ENTER(cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    CUresult rc = real_cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT) {
        fracgpu_region_reclaim_dead(G.region); /* report no memory of dead processes */
        int di = fracgpu_current_dev_index();
        uint64_t limit = di < 0 ? 0 : G.limits.dev[di].memory_limit;
        uint64_t used = di < 0 ? 0 : __atomic_load_n(&G.region->dev[di].memory_used,
                                                     __ATOMIC_ACQUIRE);
        uint64_t left = used < limit ? limit - used : 0;
        if (G.limits.memory_host_fallback) {
            /* What the GPU lacks comes from the host: the slice is the whole story. */
            t = (size_t)limit;
            f = (size_t)left;
        } else {
            if (limit < t)
                t = (size_t)limit;
            if (left < f)
                f = (size_t)left;
        }
    }
    if (rc == CUDA_SUCCESS) {
        if (free_bytes)
            *free_bytes = f;
        if (total_bytes)
            *total_bytes = t;
    }
    return rc;
}

/* ---- contexts: their overhead counts against the slice ---- */

/* Raised whenever a context is made (it may reuse a destroyed one's handle) or a stack is
 * set: a launch's check that its kernel's stack is counted (stack_counted) is made again. */
static uint64_t stack_generation;

static void stack_changed(void)
{
    __atomic_fetch_add(&stack_generation, 1, __ATOMIC_ACQ_REL);
}

static CUresult ctx_create_common(CUdevice dev, CUcontext *pctx, CUresult (*create)(void *),
                                  void *arg, int mode)
{
    stack_changed();
    if (mode == MODE_PASS)
        return create(arg);
    int di = fracgpu_cuda_dev_index(dev);
    uint64_t n = G.limits.context_overhead;
    CUresult rc = reserve_on(di, n);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = create(arg);
    if (rc != CUDA_SUCCESS) {
        release_on((unsigned)di, n, 0);
        return rc;
    }
    record(ALLOC_CTX, (uint64_t)(uintptr_t)*pctx, n, di, (uint64_t)(uintptr_t)*pctx);
    return rc;
}

struct ctx_args { CUcontext *pctx; void *p; int np; unsigned flags; CUdevice dev; };
static CUresult create_v2(void *a)
{
    struct ctx_args *c = a;
    return real_cuCtxCreate_v2(c->pctx, c->flags, c->dev);
}
static CUresult create_v3(void *a)
{
    struct ctx_args *c = a;
    return real_cuCtxCreate_v3(c->pctx, c->p, c->np, c->flags, c->dev);
}
static CUresult create_v4(void *a)
{
    struct ctx_args *c = a;
    return real_cuCtxCreate_v4(c->pctx, c->p, c->flags, c->dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v2);
    struct ctx_args a = {pctx, NULL, 0, flags, dev};
    return ctx_create_common(dev, pctx, create_v2, &a, mode_);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v3);
    struct ctx_args a = {pctx, paramsArray, numParams, flags, dev};
    return ctx_create_common(dev, pctx, create_v3, &a, mode_);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags,
                               CUdevice dev)
{
    ENTER(cuCtxCreate_v4);
    struct ctx_args a = {pctx, ctxCreateParams, 0, flags, dev};
    return ctx_create_common(dev, pctx, create_v4, &a, mode_);
}

static void release_cb(unsigned di, uint64_t size, uint32_t kind)
{
    release_on(di, size, kind == ALLOC_HOST_PTR);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2);
    if (mode_ == MODE_PASS)
        return real_cuCtxDestroy_v2(ctx);
    uint64_t key = (uint64_t)(uintptr_t)ctx, sz;
    unsigned di;
    fracgpu_pace_ctx_gone(ctx); /* pacing: charge its launches before its events go */
    int had = fracgpu_table_take(ALLOC_CTX, key, &sz, &di) == 0;
    CUresult rc = real_cuCtxDestroy_v2(ctx);
    if (rc == CUDA_SUCCESS) {
        if (had)
            release_on(di, sz, 0);
        /* destroying a context frees everything allocated in it */
        fracgpu_table_take_ctx(key, release_cb);
    } else if (had) {
        fracgpu_table_put(ALLOC_CTX, key, sz, di, key);
    }
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRetain);
    stack_changed();
    if (mode_ == MODE_PASS)
        return real_cuDevicePrimaryCtxRetain(pctx, dev);
    int di = fracgpu_cuda_dev_index(dev);
    if (di < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&prim_mu);
    CUresult rc = CUDA_SUCCESS;
    uint64_t n = G.limits.context_overhead;
    int first = prim_refs[di] == 0;
    if (first)
        rc = reserve_on(di, n);
    if (rc == CUDA_SUCCESS) {
        rc = real_cuDevicePrimaryCtxRetain(pctx, dev);
        if (rc == CUDA_SUCCESS) {
            prim_refs[di]++;
            prim_ctx[di] = (uint64_t)(uintptr_t)*pctx;
        } else if (first) {
            release_on((unsigned)di, n, 0);
        }
    }
    pthread_mutex_unlock(&prim_mu);
    return rc;
}

static void primary_gone(int di)
{
    prim_refs[di] = 0;
    release_on((unsigned)di, G.limits.context_overhead, 0);
    fracgpu_table_take_ctx(prim_ctx[di], release_cb);
}

/* The _v2 entry points and the pre-11.0 ones (still exported, and what
 * cuGetProcAddress returns for a cudaVersion below 11000) behave alike. */
static CUresult primary_release(CUdevice dev, CUresult (*real)(CUdevice), int mode)
{
    if (mode == MODE_PASS)
        return real(dev);
    int di = fracgpu_cuda_dev_index(dev);
    pthread_mutex_lock(&prim_mu);
    if (di >= 0 && prim_refs[di] == 1) /* pacing: the last release destroys it */
        fracgpu_pace_ctx_gone((CUcontext)(uintptr_t)prim_ctx[di]);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && di >= 0 && prim_refs[di] > 0 && --prim_refs[di] == 0)
        primary_gone(di);
    pthread_mutex_unlock(&prim_mu);
    return rc;
}

static CUresult primary_reset(CUdevice dev, CUresult (*real)(CUdevice), int mode)
{
    if (mode == MODE_PASS)
        return real(dev);
    int di = fracgpu_cuda_dev_index(dev);
    pthread_mutex_lock(&prim_mu);
    fracgpu_pace_ctx_gone(di >= 0 && prim_refs[di] > 0 ? (CUcontext)(uintptr_t)prim_ctx[di] : NULL);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && di >= 0 && prim_refs[di] > 0)
        primary_gone(di);
    pthread_mutex_unlock(&prim_mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease_v2);
    return primary_release(dev, real_cuDevicePrimaryCtxRelease_v2, mode_);
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease);
    return primary_release(dev, real_cuDevicePrimaryCtxRelease, mode_);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset_v2);
    return primary_reset(dev, real_cuDevicePrimaryCtxReset_v2, mode_);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset);
    return primary_reset(dev, real_cuDevicePrimaryCtxReset, mode_);
}

/* ---- context limits: heaps and buffers the driver allocates outside cuMemAlloc ---- */

#define LIMIT_STACK 0
#define LIMIT_PRINTF_FIFO 1
#define LIMIT_MALLOC_HEAP 2
/* The defaults are part of every context (context_overhead_bytes estimates them). */
static const uint64_t limit_default[3] = {1024, 1u << 20, 8u << 20};

/* Device memory a limit's value takes beyond its default: the stack is per resident
 * thread (multiprocessors x threads per multiprocessor; when the driver will not say,
 * 256 x 2048, more than any GPU has, so never too little). */
static uint64_t limit_bytes(CUlimit limit, uint64_t v, CUdevice dev)
{
    uint64_t per = 1;
    if (limit == LIMIT_STACK) {
        int sms = 0, threads = 0;
        if (real_cuDeviceGetAttribute == NULL ||
            real_cuDeviceGetAttribute(&sms, 16, dev) != CUDA_SUCCESS ||
            real_cuDeviceGetAttribute(&threads, 39, dev) != CUDA_SUCCESS || sms <= 0 ||
            threads <= 0) {
            sms = 256;
            threads = 2048;
        }
        per = (uint64_t)sms * (uint64_t)threads;
    }
    uint64_t base = limit_default[limit] * per;
    if (v > UINT64_MAX / per)
        return UINT64_MAX;
    return v * per > base ? v * per - base : 0;
}

/* A limit of the current context set to value, what it takes counted (the three limits
 * that take device memory). */
static CUresult set_limit_counted(CUlimit limit, size_t value)
{
    if (limit == LIMIT_STACK)
        stack_changed();
    int di;
    uint64_t ctx, had = 0;
    CUdevice dev;
    unsigned hd;
    CUresult rc = current(&di, &ctx, &dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint32_t kind = ALLOC_LIMIT + (uint32_t)limit;
    int held = fracgpu_table_take(kind, ctx, &had, &hd) == 0;
    uint64_t want = limit_bytes(limit, value, dev);
    if (want > had && (rc = reserve_on(di, want - had)) != CUDA_SUCCESS) {
        if (held)
            record(kind, ctx, had, di, ctx);
        return rc;
    }
    uint64_t counted = want > had ? want : had;
    rc = real_cuCtxSetLimit(limit, value);
    if (rc == CUDA_SUCCESS) {
        /* Settle on what the driver took (it rounds the stack size up). */
        size_t got = value;
        if (real_cuCtxGetLimit != NULL && real_cuCtxGetLimit(&got, limit) == CUDA_SUCCESS) {
            uint64_t actual = limit_bytes(limit, got, dev);
            if (actual > counted && reserve_on(di, actual - counted) != CUDA_SUCCESS) {
                size_t old = (size_t)limit_default[limit];
                real_cuCtxSetLimit(limit, old); /* back to the default: nothing counted */
                release_on((unsigned)di, counted, 0);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            if (actual > counted)
                counted = actual;
            want = actual;
        }
    } else {
        want = had; /* unchanged */
    }
    if (counted > want)
        release_on((unsigned)di, counted - want, 0);
    if (want)
        record(kind, ctx, want, di, ctx); /* destroying the context releases it */
    return rc;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    ENTER(cuCtxSetLimit);
    if (mode_ == MODE_PASS || limit < LIMIT_STACK || limit > LIMIT_MALLOC_HEAP)
        return real_cuCtxSetLimit(limit, value);
    return set_limit_counted(limit, value);
}

/* A launch makes the driver raise the context's stack to what the kernel needs per
 * thread (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES), for every resident thread of the GPU, and
 * keep it raised: device memory outside any allocation call. Before the first launch of
 * a kernel in a context (and again after any change of a stack), the stack is raised
 * here instead, counted like cuCtxSetLimit: out of memory past the slice, as the driver
 * says when it cannot. *settle: the launch is a first one, after which stack_settle
 * counts what the driver really raised the stack to. A kernel already checked in this
 * context by this thread (stack_seen) costs one cuCtxGetCurrent and a table lookup. */
/* Kernels this thread has checked in ctx since the stack generation gen: a direct-mapped
 * table by handle, emptied when either changes. */
#define STACK_SEEN 64
struct stack_seen {
    CUcontext ctx;
    uint64_t gen;
    const void *h[STACK_SEEN]; /* kernels, and graph execs (stack_settle_exec) */
};
static __thread struct stack_seen stack_seen;

static unsigned stack_slot(const void *h)
{
    uintptr_t x = (uintptr_t)h;
    return (unsigned)((x >> 4) ^ (x >> 12)) & (STACK_SEEN - 1);
}

static int stack_is_seen(CUcontext ctx, uint64_t gen, const void *h)
{
    return ctx == stack_seen.ctx && gen == stack_seen.gen && stack_seen.h[stack_slot(h)] == h;
}

static void stack_mark_seen(CUcontext ctx, uint64_t gen, const void *h)
{
    if (ctx != stack_seen.ctx || gen != stack_seen.gen) {
        memset(&stack_seen, 0, sizeof stack_seen);
        stack_seen.ctx = ctx;
        stack_seen.gen = gen;
    }
    stack_seen.h[stack_slot(h)] = h;
}

/* Local memory per thread kernel f (a CUfunction, or a library CUkernel) needs; 0 when
 * the driver does not say: the settle after the launch still counts what it takes. */
static int kernel_local_size(CUfunction f)
{
    int local = 0;
    CUdevice dev;
    if (real_cuFuncGetAttribute != NULL &&
        real_cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) == CUDA_SUCCESS)
        return local;
    if (real_cuKernelGetAttribute != NULL && real_cuCtxGetDevice != NULL &&
        real_cuCtxGetDevice(&dev) == CUDA_SUCCESS &&
        real_cuKernelGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f, dev) ==
            CUDA_SUCCESS)
        return local;
    return 0;
}

/* The current context's stack raised to local bytes per thread, counted, unless it is
 * that large already: out of memory past the slice. */
static CUresult stack_raise(int local)
{
    size_t stack = 0;
    if (local <= 0 || real_cuCtxGetLimit == NULL ||
        real_cuCtxGetLimit(&stack, LIMIT_STACK) != CUDA_SUCCESS || (size_t)local <= stack)
        return CUDA_SUCCESS;
    return set_limit_counted(LIMIT_STACK, (size_t)local);
}

static CUresult stack_counted(CUfunction f, int *settle)
{
    CUcontext ctx = NULL;
    if (f == NULL || real_cuCtxGetCurrent == NULL || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        ctx == NULL)
        return CUDA_SUCCESS; /* the driver answers for these */
    if (LIKELY(stack_is_seen(ctx, __atomic_load_n(&stack_generation, __ATOMIC_ACQUIRE), f)))
        return CUDA_SUCCESS;
    CUresult rc = stack_raise(kernel_local_size(f));
    if (rc != CUDA_SUCCESS)
        return rc;
    stack_mark_seen(ctx, __atomic_load_n(&stack_generation, __ATOMIC_ACQUIRE), f);
    *settle = 1;
    return CUDA_SUCCESS;
}

/* After a first launch: the stack the driver settled on (its own needs may exceed the
 * kernel's local size) counted, past the slice if it must be, so that later allocations
 * are refused rather than the memory going uncounted. */
static void stack_settle(void)
{
    int di;
    uint64_t ctx, had = 0;
    CUdevice dev;
    unsigned hd;
    size_t v = 0;
    if (real_cuCtxGetLimit == NULL || current(&di, &ctx, &dev) != CUDA_SUCCESS ||
        real_cuCtxGetLimit(&v, LIMIT_STACK) != CUDA_SUCCESS)
        return;
    uint32_t kind = ALLOC_LIMIT + LIMIT_STACK;
    int held = fracgpu_table_take(kind, ctx, &had, &hd) == 0;
    uint64_t want = limit_bytes(LIMIT_STACK, v, dev);
    if (want > had) {
        if (reserve_on(di, want - had) != CUDA_SUCCESS) {
            LOGW("a launch raised the stack of device %d by %llu bytes past the slice: counted, "
                 "further allocations are refused", di, (unsigned long long)(want - had));
            fracgpu_region_reserve(G.region, G.slot, (unsigned)di, want - had, UINT64_MAX);
        }
        record(kind, ctx, want, di, ctx);
    } else if (held) {
        record(kind, ctx, had, di, ctx);
    }
}

/* After an exec's first upload or launch in this context (and again after any change of
 * a stack): what its kernels raised the stack to, beyond what its instantiation raised it
 * to, counted as after a kernel's first launch. */
static void stack_settle_exec(CUgraphExec e)
{
    CUcontext ctx = NULL;
    if (real_cuCtxGetCurrent == NULL || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        ctx == NULL || stack_is_seen(ctx, __atomic_load_n(&stack_generation, __ATOMIC_ACQUIRE), e))
        return;
    stack_settle();
    stack_mark_seen(ctx, __atomic_load_n(&stack_generation, __ATOMIC_ACQUIRE), e);
}

/* ---- linear memory ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ENTER(cuMemAlloc_v2);
    ALLOC_IN_CURRENT(ALLOC_PTR, bytesize, real_cuMemAlloc_v2(dptr, bytesize), *dptr, dptr);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ENTER(cuMemAllocManaged);
    ALLOC_IN_CURRENT(ALLOC_PTR, bytesize, real_cuMemAllocManaged(dptr, bytesize, flags), *dptr,
                     NULL);
}

/*
 * Stream-ordered allocations come from a memory pool, which keeps freed memory until
 * it releases it (pool.c): they count against the pool's device as the pool holds
 * memory. pool NULL: the device's current pool (cuMemAllocAsync), which may fall back
 * to host memory when the GPU is full; an explicit pool never does.
 */
typedef CUresult (*pool_alloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult async_plain(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    (void)p;
    return real_cuMemAllocAsync(d, n, s);
}

static CUresult async_plain_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    (void)p;
    return real_cuMemAllocAsync_ptsz(d, n, s);
}

/* In a _ptsz entry point the null stream is the thread's own: name it, so that a
 * capture check asks about the stream the call really uses. */
static CUstream per_thread(CUstream s)
{
    return s == NULL ? CU_STREAM_PER_THREAD : s;
}

/* Under stream capture an asynchronous allocation is a node of the captured graph: it
 * takes no memory now, and the graph's memory is counted when an exec of it is backed. */
static int capturing(CUstream s)
{
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    return real_cuStreamIsCapturing != NULL && real_cuStreamIsCapturing(s, &status) == 0 &&
           status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s,
                           pool_alloc_fn real)
{
    if (capturing(s))
        return real(dptr, n, pool, s);
    int di;
    uint64_t ctx;
    CUdevice dev;
    CUresult rc = current(&di, &ctx, &dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    int fallback = pool == NULL;
    CUmemoryPool p = pool;
    if (p == NULL && (real_cuDeviceGetMemPool == NULL ||
                      real_cuDeviceGetMemPool(&p, dev) != CUDA_SUCCESS || p == NULL))
        p = NULL;
    uint64_t key = (uint64_t)(uintptr_t)p;
    int pdi = p == NULL ? di : fracgpu_pool_device(POOL_MEM, key);
    if (pdi < 0)
        pdi = di; /* a pool the shim has not seen made: the current device's */
    uint64_t took = 0;
    if (p != NULL)
        rc = fracgpu_pool_take(POOL_MEM, key, pdi, dev, n, &took);
    else
        rc = reserve_on(di, n); /* the driver named no pool: count it as plain memory */
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(dptr, n, pool, s);
    if (rc == CUDA_SUCCESS) {
        if (p != NULL) {
            fracgpu_pool_settle(POOL_MEM, key); /* what the driver took, rounding included */
            record(ALLOC_POOL_PTR, *dptr, n, pdi, key);
        } else {
            record(ALLOC_PTR, *dptr, n, di, ctx);
        }
        return rc;
    }
    if (p != NULL)
        fracgpu_pool_untake(POOL_MEM, key, n, took);
    else
        release_on((unsigned)di, n, 0);
    if (fallback && UNLIKELY(host_fallback_on(rc)) && reserve_on(di, n) == CUDA_SUCCESS) {
        if (serve_from_host(dptr, n, di, dev) == CUDA_SUCCESS) {
            record(ALLOC_HOST_PTR, *dptr, n, di, ctx);
            return CUDA_SUCCESS;
        }
        release_on((unsigned)di, n, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync);
    if (mode_ == MODE_PASS)
        return real_cuMemAllocAsync(dptr, bytesize, hStream);
    return pool_alloc(dptr, bytesize, NULL, hStream, async_plain);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync_ptsz);
    if (mode_ == MODE_PASS)
        return real_cuMemAllocAsync_ptsz(dptr, bytesize, hStream);
    return pool_alloc(dptr, bytesize, NULL, per_thread(hStream), async_plain_ptsz);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync);
    if (mode_ == MODE_PASS || pool == NULL)
        return real_cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
    return pool_alloc(dptr, bytesize, pool, hStream, real_cuMemAllocFromPoolAsync);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync_ptsz);
    if (mode_ == MODE_PASS || pool == NULL)
        return real_cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream);
    return pool_alloc(dptr, bytesize, pool, per_thread(hStream),
                      real_cuMemAllocFromPoolAsync_ptsz);
}

/* ---- memory pools: where a pool's memory counts, and when the pool gives it back ---- */

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    ENTER(cuMemPoolCreate);
    CUresult rc = real_cuMemPoolCreate(pool, props);
    /* A pool of host memory is not sliced; a device pool counts on its own device,
     * whatever context allocates from it. */
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT && props != NULL &&
        props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        fracgpu_pool_known(POOL_MEM, (uint64_t)(uintptr_t)*pool,
                           fracgpu_cuda_dev_index(props->location.id), props->location.id);
    return rc;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    ENTER(cuDeviceGetDefaultMemPool);
    CUresult rc = real_cuDeviceGetDefaultMemPool(pool, dev);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        fracgpu_pool_known(POOL_MEM, (uint64_t)(uintptr_t)*pool, fracgpu_cuda_dev_index(dev), dev);
    return rc;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    ENTER(cuDeviceGetMemPool);
    CUresult rc = real_cuDeviceGetMemPool(pool, dev);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        fracgpu_pool_known(POOL_MEM, (uint64_t)(uintptr_t)*pool, fracgpu_cuda_dev_index(dev), dev);
    return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    ENTER(cuMemPoolTrimTo);
    CUresult rc = real_cuMemPoolTrimTo(pool, minBytesToKeep);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        fracgpu_pool_settle(POOL_MEM, (uint64_t)(uintptr_t)pool);
    return rc;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    ENTER(cuMemPoolDestroy);
    CUresult rc = real_cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        fracgpu_pool_destroyed((uint64_t)(uintptr_t)pool);
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch_v2);
    if (mode_ == MODE_PASS)
        return real_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    int di;
    uint64_t ctx;
    CUdevice dev;
    CUresult rc = current(&di, &ctx, &dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* Reserve an estimate, then settle on what the driver really gave. */
    uint64_t row = ((uint64_t)WidthInBytes + 511) / 512 * 512;
    uint64_t est = row * (uint64_t)Height;
    if ((rc = reserve_on(di, est)) != CUDA_SUCCESS)
        return rc;
    rc = real_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (UNLIKELY(host_fallback_on(rc)) && pPitch != NULL &&
        serve_from_host(dptr, est, di, dev) == CUDA_SUCCESS) {
        /* Rows 512-byte aligned, as wide as the estimate: valid for 2D copies and
         * textures (the driver's pitch alignment is at most that). */
        *pPitch = (size_t)row;
        record(ALLOC_HOST_PTR, *dptr, est, di, ctx);
        return CUDA_SUCCESS;
    }
    if (rc != CUDA_SUCCESS) {
        release_on((unsigned)di, est, 0);
        return rc;
    }
    uint64_t actual = (uint64_t)*pPitch * (uint64_t)Height;
    if (actual > est && reserve_on(di, actual - est) != CUDA_SUCCESS) {
        real_cuMemFree_v2(*dptr);
        release_on((unsigned)di, est, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < est)
        release_on((unsigned)di, est - actual, 0);
    record(ALLOC_PTR, *dptr, actual, di, ctx);
    return CUDA_SUCCESS;
}

/*
 * Frees of linear memory. A pointer the shim served from host memory is managed
 * memory whatever the program asked for, so it is always freed with cuMemFree;
 * an asynchronous free of one first waits for its stream, which keeps the
 * stream order the program relied on (the host-backed path is the slow path).
 * sync: the stream synchronisation matching the async variant (NULL: cuMemFree_v2).
 */
static CUresult free_linear(CUdeviceptr dptr, CUstream stream, CUresult (*sync)(CUstream),
                            CUresult (*realfree)(CUdeviceptr, CUstream))
{
    /* On a capturing stream the free is a node of the graph being captured: nothing is
     * freed until the graph runs, if it ever does, so the memory stays counted. (A free
     * the shim cannot see later over-counts; releasing now would let a capture that never
     * runs give the slice back while the memory stays allocated.) */
    if (stream != NULL && capturing(stream))
        return realfree(dptr, stream);
    uint64_t sz;
    unsigned di;
    uint32_t kind = ALLOC_PTR;
    uint64_t pool = 0;
    int had = fracgpu_table_take(ALLOC_PTR, dptr, &sz, &di) == 0;
    if (!had && fracgpu_table_take(ALLOC_HOST_PTR, dptr, &sz, &di) == 0) {
        had = 1;
        kind = ALLOC_HOST_PTR;
    }
    if (!had && fracgpu_table_take_aux(ALLOC_POOL_PTR, dptr, &sz, &di, &pool) == 0) {
        had = 1;
        kind = ALLOC_POOL_PTR;
    }
    CUresult rc;
    if (kind == ALLOC_HOST_PTR) {
        rc = sync != NULL ? sync(stream) : CUDA_SUCCESS;
        if (rc == CUDA_SUCCESS)
            rc = real_cuMemFree_v2 != NULL ? real_cuMemFree_v2(dptr) : CUDA_ERROR_NOT_FOUND;
    } else {
        rc = realfree(dptr, stream);
    }
    if (had && kind == ALLOC_POOL_PTR) {
        /* Back into its pool: counted until the pool gives the memory back. */
        if (rc == CUDA_SUCCESS)
            fracgpu_pool_put(POOL_MEM, pool, sz);
        else
            fracgpu_table_put(kind, dptr, sz, di, pool);
    } else if (had) {
        if (rc == CUDA_SUCCESS)
            release_on(di, sz, kind == ALLOC_HOST_PTR);
        else
            fracgpu_table_put(kind, dptr, sz, di, 0);
    }
    return rc;
}

static CUresult free_sync(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    return real_cuMemFree_v2(dptr);
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream)
{
    return real_cuMemFreeAsync(dptr, stream);
}

static CUresult free_async_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return real_cuMemFreeAsync_ptsz(dptr, stream);
}

static CUresult sync_stream(CUstream stream)
{
    return real_cuStreamSynchronize != NULL ? real_cuStreamSynchronize(stream)
                                            : CUDA_ERROR_NOT_FOUND;
}

static CUresult sync_stream_ptsz(CUstream stream)
{
    return real_cuStreamSynchronize_ptsz != NULL ? real_cuStreamSynchronize_ptsz(stream)
                                                 : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    ENTER(cuMemFree_v2);
    if (mode_ == MODE_PASS)
        return real_cuMemFree_v2(dptr);
    return free_linear(dptr, NULL, NULL, free_sync);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    ENTER(cuMemFreeAsync);
    if (mode_ == MODE_PASS)
        return real_cuMemFreeAsync(dptr, hStream);
    return free_linear(dptr, hStream, sync_stream, free_async);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    ENTER(cuMemFreeAsync_ptsz);
    if (mode_ == MODE_PASS)
        return real_cuMemFreeAsync_ptsz(dptr, hStream);
    return free_linear(dptr, per_thread(hStream), sync_stream_ptsz, free_async_ptsz);
}

/* ---- virtual memory management ---- */

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER(cuMemCreate);
    if (mode_ == MODE_PASS || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real_cuMemCreate(handle, size, prop, flags); /* host memory is not sliced */
    int di = fracgpu_cuda_dev_index(prop->location.id);
    CUresult rc = reserve_on(di, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real_cuMemCreate(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) {
        release_on((unsigned)di, size, 0);
        return rc;
    }
    if (fracgpu_vmm_created(*handle, size, (unsigned)di) != 0)
        LOGE("out of host memory tracking a memory handle; its %zu bytes stay counted", size);
    return rc;
}

static void vmm_gone(unsigned di, uint64_t bytes)
{
    release_on(di, bytes, 0);
}

/* Released while mapped, the memory stays until the last unmap: so does the count. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    ENTER(cuMemRelease);
    if (mode_ == MODE_PASS)
        return real_cuMemRelease(handle);
    return fracgpu_vmm_release(handle, real_cuMemRelease, vmm_gone);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    ENTER(cuMemMap);
    CUresult rc = real_cuMemMap(ptr, size, offset, handle, flags);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT)
        fracgpu_vmm_mapped(ptr, size, handle);
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemUnmap);
    if (mode_ == MODE_PASS)
        return real_cuMemUnmap(ptr, size);
    return fracgpu_vmm_unmap(ptr, size, real_cuMemUnmap, vmm_gone);
}

/* ---- arrays ---- */

static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case 0x01: case 0x08: return 1;  /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2; /* int16, half */
    case 0x03: case 0x0a: case 0x20: return 4; /* int32, float */
    default: return 16; /* other formats: count the widest element, never too little */
    }
}

static uint64_t dim(size_t v)
{
    return v ? (uint64_t)v : 1;
}

static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned level)
{
    uint64_t w = dim(d->Width >> level), h = d->Height ? dim(d->Height >> level) : 1,
             z = d->Depth ? dim(d->Depth >> level) : 1;
    return w * h * z * dim(d->NumChannels) * format_bytes(d->Format);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    ENTER(cuArrayCreate_v2);
    if (desc == NULL)
        return real_cuArrayCreate_v2(pHandle, desc);
    uint64_t n = dim(desc->Width) * dim(desc->Height) * dim(desc->NumChannels) *
                 format_bytes(desc->Format);
    ALLOC_IN_CURRENT(ALLOC_ARRAY, n, real_cuArrayCreate_v2(pHandle, desc),
                     (uint64_t)(uintptr_t)*pHandle, NULL);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    ENTER(cuArray3DCreate_v2);
    if (desc == NULL)
        return real_cuArray3DCreate_v2(pHandle, desc);
    ALLOC_IN_CURRENT(ALLOC_ARRAY, array3d_bytes(desc, 0), real_cuArray3DCreate_v2(pHandle, desc),
                     (uint64_t)(uintptr_t)*pHandle, NULL);
}

EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    ENTER(cuArrayDestroy);
    FREE_KIND(ALLOC_ARRAY, (uint64_t)(uintptr_t)hArray, real_cuArrayDestroy(hArray));
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                       unsigned int numMipmapLevels)
{
    ENTER(cuMipmappedArrayCreate);
    if (desc == NULL)
        return real_cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    uint64_t n = 0;
    for (unsigned l = 0; l < numMipmapLevels && l < 64; l++)
        n += array3d_bytes(desc, l);
    ALLOC_IN_CURRENT(ALLOC_MIPMAP, n, real_cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels),
                     (uint64_t)(uintptr_t)*pHandle, NULL);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    ENTER(cuMipmappedArrayDestroy);
    FREE_KIND(ALLOC_MIPMAP, (uint64_t)(uintptr_t)h, real_cuMipmappedArrayDestroy(h));
}

/*
 * ---- graph memory nodes ----
 * A graph's allocation nodes take no memory until an exec of it is uploaded or
 * launched; then the device's graph memory pool backs them, and keeps that memory
 * after frees and exec destruction until cuDeviceGraphMemTrim (pool.c counts it). The
 * shim asks the driver for the graph's allocation nodes at instantiation (every
 * instantiate entry point; nodes added, captured from a stream or cloned alike), gives
 * their bytes per device to the exec, and reserves them when the exec is first uploaded
 * or launched - refused with out-of-memory past the slice, as the driver refuses when
 * the GPU is full. After every upload and launch the device's graph pool is also
 * settled against the driver's figure, so nothing the driver took goes uncounted.
 */
static unsigned unbacked_execs; /* atomic: execs with memory not yet backed */

static int launch_dev_index_any(void)
{
    return G.limits.device_count == 1 ? 0 : fracgpu_current_dev_index();
}

static uint64_t key_of(const void *h)
{
    return (uint64_t)(uintptr_t)h;
}

/* Child graphs nest at most this deep before an instantiation is refused: each level
 * is a graph the program built, and the count must end. */
#define GRAPH_DEPTH_MAX 16

/* What a graph takes when it runs: its allocation nodes' bytes per limits index (device
 * ordinals in dev), and the most local memory per thread any of its kernels needs (the
 * driver raises the context's stack to it, as for a launched kernel). */
struct graph_needs {
    uint64_t sz[FRACGPU_MAX_DEVICES];
    uint64_t dev[FRACGPU_MAX_DEVICES];
    int local;
};

static void kernel_node_needs(CUgraphNode node, struct graph_needs *need)
{
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    if (real_cuGraphKernelNodeGetParams_v2 == NULL ||
        real_cuGraphKernelNodeGetParams_v2(node, &p) != CUDA_SUCCESS)
        return; /* unknown: the settle after each launch still counts the stack */
    CUfunction f = p.func != NULL ? p.func : (CUfunction)p.kern;
    int local = f != NULL ? kernel_local_size(f) : 0;
    if (local > need->local)
        need->local = local;
}

/* Adds what g's nodes need to need, child graphs included: a child moved into its parent
 * (12.9) may hold allocation nodes. -1: an allocation on a device outside the slice, or
 * nesting too deep. */
static int graph_needs_at(CUgraph g, struct graph_needs *need, int depth)
{
    uint64_t *sz = need->sz, *dev = need->dev;
    size_t n = 0;
    if (real_cuGraphGetNodes(g, NULL, &n) != 0 || n == 0)
        return 0; /* unknown: the graph pool is still settled after each launch */
    CUgraphNode *nodes = malloc(n * sizeof *nodes);
    if (nodes == NULL || real_cuGraphGetNodes(g, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        return 0;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int type = -1;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        CUgraph child = NULL;
        if (real_cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS)
            continue;
        if (type == CU_GRAPH_NODE_TYPE_GRAPH && real_cuGraphChildGraphNodeGetGraph != NULL &&
            real_cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS) {
            if (depth >= GRAPH_DEPTH_MAX) {
                LOGW("child graphs nested deeper than %d: instantiation refused",
                     GRAPH_DEPTH_MAX);
                rc = -1;
            } else {
                rc = graph_needs_at(child, need, depth + 1);
            }
            continue;
        }
        if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
            kernel_node_needs(nodes[i], need);
            continue;
        }
        if (type != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
            real_cuGraphMemAllocNodeGetParams(nodes[i], &p) != CUDA_SUCCESS ||
            p.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            continue;
        int di = fracgpu_cuda_dev_index(p.poolProps.location.id);
        if (di < 0) {
            rc = -1;
            break;
        }
        sz[di] = sz[di] + p.bytesize < sz[di] ? UINT64_MAX : sz[di] + p.bytesize;
        dev[di] = (uint64_t)p.poolProps.location.id;
    }
    free(nodes);
    return rc;
}

/* What g needs when it runs, from the driver's own view of the graph (however its nodes
 * were made: added, captured from a stream, cloned, moved in as a child). -1: a node
 * allocates on a device not in the limits (nothing is allowed there), or child graphs
 * nest too deep. */
static int graph_needs(CUgraph g, struct graph_needs *need)
{
    if (real_cuGraphGetNodes == NULL || real_cuGraphNodeGetType == NULL ||
        real_cuGraphMemAllocNodeGetParams == NULL)
        return 0; /* unknown: the graph pool is still settled after each launch */
    return graph_needs_at(g, need, 0);
}

/* Undo backing of exec e on limits indexes below upto (they are ALLOC_EXEC_BACKED). */
static void unback(CUgraphExec e, unsigned upto, const uint64_t *took)
{
    for (unsigned i = 0; i < upto; i++) {
        uint64_t sz, dev;
        unsigned d;
        if (fracgpu_table_take_aux(ALLOC_EXEC_BACKED + i, key_of(e), &sz, &d, &dev) == 0) {
            fracgpu_pool_untake(POOL_GRAPH, dev, sz, took[i]);
            record(ALLOC_EXEC + i, key_of(e), sz, (int)i, dev);
        }
    }
}

/* Reserves what exec e's memory nodes need in the graph pool, if not yet done. */
static CUresult back_exec(CUgraphExec e)
{
    if (__atomic_load_n(&unbacked_execs, __ATOMIC_ACQUIRE) == 0)
        return CUDA_SUCCESS;
    uint64_t took[FRACGPU_MAX_DEVICES] = {0};
    int any = 0;
    for (unsigned i = 0; i < G.limits.device_count; i++) {
        uint64_t sz, dev;
        unsigned d;
        if (fracgpu_table_take_aux(ALLOC_EXEC + i, key_of(e), &sz, &d, &dev) != 0)
            continue;
        CUresult rc = fracgpu_pool_take(POOL_GRAPH, dev, (int)i, (CUdevice)dev, sz, &took[i]);
        if (rc != CUDA_SUCCESS) {
            record(ALLOC_EXEC + i, key_of(e), sz, (int)i, dev);
            unback(e, i, took);
            return rc;
        }
        record(ALLOC_EXEC_BACKED + i, key_of(e), sz, (int)i, dev);
        any = 1;
    }
    if (any)
        __atomic_fetch_sub(&unbacked_execs, 1, __ATOMIC_ACQ_REL);
    return CUDA_SUCCESS;
}

/* After the driver backed (or failed to back) e: settle the graph pools it touched. */
static void after_backing(CUgraphExec e, CUresult rc)
{
    int undo = rc == CUDA_ERROR_OUT_OF_MEMORY;
    for (unsigned i = 0; i < G.limits.device_count; i++) {
        uint64_t sz, dev;
        unsigned d;
        if (undo && fracgpu_table_take_aux(ALLOC_EXEC_BACKED + i, key_of(e), &sz, &d, &dev) == 0) {
            /* The driver could not back it: it is unbacked again. */
            fracgpu_pool_put(POOL_GRAPH, dev, sz);
            record(ALLOC_EXEC + i, key_of(e), sz, (int)i, dev);
            __atomic_fetch_add(&unbacked_execs, 1, __ATOMIC_ACQ_REL);
        }
    }
    int di = launch_dev_index_any();
    CUdevice dev;
    if (di >= 0 && real_cuCtxGetDevice != NULL && real_cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
        fracgpu_pool_known(POOL_GRAPH, (uint64_t)dev, di, dev);
        fracgpu_pool_settle(POOL_GRAPH, (uint64_t)dev);
    }
    stack_settle_exec(e);
}

/* Instantiation: the exec gets the graph's memory-node bytes, reserved now when it is
 * uploaded at once (upload), else at its first upload or launch. */
typedef CUresult (*instantiate_fn)(CUgraphExec *e, CUgraph g, void *arg);

static CUresult instantiate(CUgraphExec *e, CUgraph g, int upload, instantiate_fn real,
                            void *arg, int mode)
{
    if (mode != MODE_ACCOUNT)
        return real(e, g, arg);
    struct graph_needs need;
    memset(&need, 0, sizeof need);
    uint64_t *sz = need.sz, *dev = need.dev;
    uint64_t took[FRACGPU_MAX_DEVICES] = {0};
    if (graph_needs(g, &need) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* outside the slice, or nested too deep */
    /* Its kernels' stack, raised and counted now, as before a kernel's first launch. */
    CUresult stack_rc = stack_raise(need.local);
    if (stack_rc != CUDA_SUCCESS)
        return stack_rc;
    int any = 0;
    for (unsigned i = 0; i < G.limits.device_count; i++)
        any |= sz[i] != 0;
    for (unsigned i = 0; upload && any && i < G.limits.device_count; i++) {
        CUresult rc = sz[i] ? fracgpu_pool_take(POOL_GRAPH, dev[i], (int)i, (CUdevice)dev[i],
                                                sz[i], &took[i])
                            : CUDA_SUCCESS;
        if (rc != CUDA_SUCCESS) {
            for (unsigned j = 0; j < i; j++)
                if (sz[j])
                    fracgpu_pool_untake(POOL_GRAPH, dev[j], sz[j], took[j]);
            return rc;
        }
    }
    CUresult rc = real(e, g, arg);
    for (unsigned i = 0; any && i < G.limits.device_count; i++) {
        if (!sz[i])
            continue;
        if (rc != CUDA_SUCCESS && upload)
            fracgpu_pool_untake(POOL_GRAPH, dev[i], sz[i], took[i]);
        else if (rc == CUDA_SUCCESS)
            record(upload ? ALLOC_EXEC_BACKED + i : ALLOC_EXEC + i, key_of(*e), sz[i], (int)i,
                   dev[i]);
    }
    if (rc == CUDA_SUCCESS && any && !upload)
        __atomic_fetch_add(&unbacked_execs, 1, __ATOMIC_ACQ_REL);
    if (rc == CUDA_SUCCESS && upload)
        after_backing(*e, rc);
    return rc;
}

static CUresult inst_flags(CUgraphExec *e, CUgraph g, void *arg)
{
    return real_cuGraphInstantiateWithFlags(e, g, *(unsigned long long *)arg);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    ENTER(cuGraphInstantiateWithFlags);
    return instantiate(e, g, (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0, inst_flags,
                       &flags, mode_);
}

static CUresult inst_params(CUgraphExec *e, CUgraph g, void *arg)
{
    return real_cuGraphInstantiateWithParams(e, g, arg);
}

static CUresult inst_params_ptsz(CUgraphExec *e, CUgraph g, void *arg)
{
    return real_cuGraphInstantiateWithParams_ptsz(e, g, arg);
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    ENTER(cuGraphInstantiateWithParams);
    int upload = params != NULL && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    return instantiate(e, g, upload, inst_params, params, mode_);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    ENTER(cuGraphInstantiateWithParams_ptsz);
    int upload = params != NULL && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    return instantiate(e, g, upload, inst_params_ptsz, params, mode_);
}

/* The pre-12.0 forms (error node and log buffer, no flags). */
struct inst_legacy { CUgraphNode *err; char *log; size_t size; };

static CUresult inst_v2(CUgraphExec *e, CUgraph g, void *arg)
{
    struct inst_legacy *a = arg;
    return real_cuGraphInstantiate_v2(e, g, a->err, a->log, a->size);
}

static CUresult inst_v1(CUgraphExec *e, CUgraph g, void *arg)
{
    struct inst_legacy *a = arg;
    return real_cuGraphInstantiate(e, g, a->err, a->log, a->size);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                      size_t size)
{
    ENTER(cuGraphInstantiate_v2);
    struct inst_legacy a = {err, log, size};
    return instantiate(e, g, 0, inst_v2, &a, mode_);
}

EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                   size_t size)
{
    ENTER(cuGraphInstantiate);
    struct inst_legacy a = {err, log, size};
    return instantiate(e, g, 0, inst_v1, &a, mode_);
}

static CUresult graph_upload(CUgraphExec e, CUstream s, CUresult (*real)(CUgraphExec, CUstream),
                             int mode)
{
    if (mode != MODE_ACCOUNT)
        return real(e, s);
    CUresult rc = back_exec(e);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real(e, s);
    after_backing(e, rc);
    return rc;
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
    ENTER(cuGraphUpload);
    return graph_upload(e, s, real_cuGraphUpload, mode_);
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s)
{
    ENTER(cuGraphUpload_ptsz);
    return graph_upload(e, s, real_cuGraphUpload_ptsz, mode_);
}

/* The exec's memory goes back to the graph pool, which keeps it until a trim. */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    ENTER(cuGraphExecDestroy);
    CUresult rc = real_cuGraphExecDestroy(e);
    int unbacked = 0;
    for (unsigned i = 0; rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT &&
                         i < G.limits.device_count; i++) {
        uint64_t sz, dev;
        unsigned d;
        if (fracgpu_table_take_aux(ALLOC_EXEC_BACKED + i, key_of(e), &sz, &d, &dev) == 0)
            fracgpu_pool_put(POOL_GRAPH, dev, sz);
        if (fracgpu_table_take_aux(ALLOC_EXEC + i, key_of(e), &sz, &d, &dev) == 0)
            unbacked = 1;
    }
    if (unbacked)
        __atomic_fetch_sub(&unbacked_execs, 1, __ATOMIC_ACQ_REL);
    return rc;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    ENTER(cuDeviceGraphMemTrim);
    CUresult rc = real_cuDeviceGraphMemTrim(dev);
    if (rc == CUDA_SUCCESS && mode_ == MODE_ACCOUNT) {
        fracgpu_pool_known(POOL_GRAPH, (uint64_t)dev, fracgpu_cuda_dev_index(dev), dev);
        fracgpu_pool_settle(POOL_GRAPH, (uint64_t)dev);
    }
    return rc;
}

/* ---- launches: paced only when a compute limit applies ---- */

/* With one GPU in the limits every usable context is on it (creating one
 * elsewhere fails), so a launch needs no driver call to find its device. */
static inline int launch_dev_index(void)
{
    return G.limits.device_count == 1 ? 0 : fracgpu_current_dev_index();
}

#define LAUNCH(name, fn, stream, ptsz, callargs)                                                 \
    ENTER(name);                                                                                 \
    int settle_ = 0;                                                                             \
    if (mode_ == MODE_ACCOUNT) {                                                                 \
        CUresult stack_rc_ = stack_counted((fn), &settle_);                                      \
        if (UNLIKELY(stack_rc_ != CUDA_SUCCESS))                                                 \
            return stack_rc_;                                                                    \
    }                                                                                            \
    int paced_ = G.launch_hooks && mode_ == MODE_ACCOUNT;                                        \
    if (LIKELY(!settle_ && !paced_))                                                             \
        return real_##name callargs;                                                             \
    struct fracgpu_pace_token tok_;                                                              \
    if (paced_) {                                                                                \
        int di_ = launch_dev_index();                                                            \
        fracgpu_pace_before(di_, fracgpu_priority_before(di_), (stream), (ptsz), &tok_);         \
    }                                                                                            \
    CUresult rc_ = real_##name callargs;                                                         \
    if (paced_)                                                                                  \
        fracgpu_pace_after((stream), (ptsz), &tok_, rc_);                                        \
    if (settle_)                                                                                 \
        stack_settle();                                                                          \
    return rc_;

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz,
                               unsigned int shm, CUstream s, void **params, void **extra)
{
    LAUNCH(cuLaunchKernel, f, s, 0, (f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int shm, CUstream s, void **params,
                                    void **extra)
{
    LAUNCH(cuLaunchKernel_ptsz, f, s, 1, (f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                 void **extra)
{
    LAUNCH(cuLaunchKernelEx, f, config ? config->hStream : NULL, 0, (config, f, params, extra))
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra)
{
    LAUNCH(cuLaunchKernelEx_ptsz, f, config ? config->hStream : NULL, 1,
           (config, f, params, extra))
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                          unsigned int gz, unsigned int bx, unsigned int by,
                                          unsigned int bz, unsigned int shm, CUstream s,
                                          void **params)
{
    LAUNCH(cuLaunchCooperativeKernel, f, s, 0, (f, gx, gy, gz, bx, by, bz, shm, s, params))
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx, unsigned int by,
                                               unsigned int bz, unsigned int shm, CUstream s,
                                               void **params)
{
    LAUNCH(cuLaunchCooperativeKernel_ptsz, f, s, 1, (f, gx, gy, gz, bx, by, bz, shm, s, params))
}

/* A graph launch backs the exec's memory nodes first, then is paced like a kernel. */
static CUresult graph_launch(CUgraphExec g, CUstream s, int ptsz,
                             CUresult (*real)(CUgraphExec, CUstream), int mode)
{
    if (mode != MODE_ACCOUNT)
        return real(g, s);
    CUresult rc = back_exec(g);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (LIKELY(!G.launch_hooks)) {
        rc = real(g, s);
    } else {
        struct fracgpu_pace_token tok;
        int di = launch_dev_index();
        int bounded = fracgpu_priority_before(di);
        fracgpu_pace_before(di, bounded, s, ptsz, &tok);
        rc = real(g, s);
        fracgpu_pace_after(s, ptsz, &tok, rc);
    }
    after_backing(g, rc);
    return rc;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    ENTER(cuGraphLaunch);
    return graph_launch(g, s, 0, real_cuGraphLaunch, mode_);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    ENTER(cuGraphLaunch_ptsz);
    return graph_launch(g, s, 1, real_cuGraphLaunch_ptsz, mode_);
}

/* ---- deprecated and multi-device launch entry points: paced like the rest ---- */

EXPORT CUresult cuLaunch(CUfunction f)
{
    LAUNCH(cuLaunch, f, NULL, 0, (f))
}

EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    LAUNCH(cuLaunchGrid, f, NULL, 0, (f, grid_width, grid_height))
}

EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream s)
{
    LAUNCH(cuLaunchGridAsync, f, s, 0, (f, grid_width, grid_height, s))
}

EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
                                                     unsigned int numDevices, unsigned int flags)
{
    ENTER(cuLaunchCooperativeKernelMultiDevice);
    if (mode_ != MODE_ACCOUNT)
        return real_cuLaunchCooperativeKernelMultiDevice(list, numDevices, flags);
    if (list == NULL || numDevices == 0 || numDevices > FRACGPU_MAX_DEVICES)
        return CUDA_ERROR_INVALID_VALUE; /* one kernel per device, at most every device */
    if (real_cuStreamGetCtx == NULL || real_cuCtxPushCurrent_v2 == NULL ||
        real_cuCtxPopCurrent_v2 == NULL)
        return CUDA_ERROR_NOT_SUPPORTED; /* cannot measure it: refuse, never run it unpaced */
    int paced = G.launch_hooks;
    struct fracgpu_pace_token tok[FRACGPU_MAX_DEVICES];
    CUcontext ctx[FRACGPU_MAX_DEVICES];
    /* Each kernel's stack, in its stream's context, raised and counted before anything
     * waits (stack_counted). */
    for (unsigned i = 0; i < numDevices; i++) {
        tok[i].di = -1;
        CUcontext popped;
        if (real_cuStreamGetCtx(list[i].hStream, &ctx[i]) != CUDA_SUCCESS ||
            real_cuCtxPushCurrent_v2(ctx[i]) != CUDA_SUCCESS) {
            ctx[i] = NULL;
            continue; /* the driver refuses this launch list too */
        }
        CUresult stack_rc = stack_raise(kernel_local_size(list[i].function));
        real_cuCtxPopCurrent_v2(&popped);
        if (stack_rc != CUDA_SUCCESS)
            return stack_rc;
    }
    for (unsigned i = 0; paced && i < numDevices; i++) {
        CUcontext popped;
        if (ctx[i] == NULL || real_cuCtxPushCurrent_v2(ctx[i]) != CUDA_SUCCESS)
            continue;
        int di = fracgpu_current_dev_index();
        fracgpu_pace_before(di, fracgpu_priority_before(di), list[i].hStream, 0, &tok[i]);
        real_cuCtxPopCurrent_v2(&popped);
    }
    CUresult rc = real_cuLaunchCooperativeKernelMultiDevice(list, numDevices, flags);
    /* What each kernel was charged, and the stack its context settled on. */
    for (unsigned i = 0; i < numDevices; i++) {
        CUcontext popped;
        if (ctx[i] == NULL || real_cuCtxPushCurrent_v2(ctx[i]) != CUDA_SUCCESS)
            continue;
        if (paced)
            fracgpu_pace_after(list[i].hStream, 0, &tok[i], rc);
        stack_settle();
        real_cuCtxPopCurrent_v2(&popped);
    }
    return rc;
}
