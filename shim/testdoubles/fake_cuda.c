/*
 * libcuda.so.1 test double. Real bookkeeping, fake hardware: fixed device
 * memory shared by every process that uses the same state file (allocations
 * fail when it is full; memory of dead processes is freed, like the driver
 * does), contexts that cost memory, and a device timeline on
 * CLOCK_MONOTONIC where kernels take the time encoded in their name
 * ("..._2000us"), serialised across processes so contention is real.
 * Events and synchronisation follow that timeline. Managed memory lives in
 * host memory (host_memory_bytes), never on the device, and records the
 * advice given for it (cuMemAdvise, read back with cuMemRangeGetAttribute).
 */
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "fake.h"

#define EXPORT __attribute__((visibility("default")))
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* limit: cuCtxSetLimit values; limit_bytes: device memory they take beyond the defaults. */
#define N_LIMITS 7
struct CUctx_st { int dev; int primary; int destroyed; /* a destroyed context is kept, marked */
                  uint64_t limit[N_LIMITS]; uint64_t limit_bytes;
                  unsigned flags; unsigned long long id; /* cuCtxGetFlags, cuCtxGetId */ };
#define QUEUE_DEPTH 1024
/* A launch blocks while QUEUE_DEPTH earlier operations of its stream are
 * still pending, like a hardware queue that is full. */
/* capture: the graph a stream capture builds (cuStreamBeginCapture .. EndCapture). */
struct CUstream_st { int dev; uint64_t tail; pthread_mutex_t mu; unsigned head; uint64_t ends[QUEUE_DEPTH];
                     struct CUctx_st *ctx; /* the context it was created in */
                     struct CUgraph_st *capture;
                     unsigned flags; int priority; unsigned long long id;
                     unsigned long long capture_id; /* of the capture in progress */
                     struct CUgraphNode_st *capture_last; /* its last node: the dependency */
                     unsigned char edge_data[8]; /* one default CUgraphEdgeData */ };
struct CUevent_st { uint64_t ts; int recorded;
                    struct CUctx_st *ctx; /* an event belongs to the context it was created in */ };
/* local_bytes: local memory each thread of the kernel needs ("local<bytes>" in its name);
 * a launch grows its context's stack to it, as the driver does. */
struct CUfunc_st { uint64_t dur_ns; uint64_t local_bytes; };
struct CUmod_st { int unused; };
/* mem_bytes, mem_dev: what the graph's memory allocation nodes take, and where;
 * local_bytes: the most local memory per thread any of its kernels needs. */
struct CUgraph_st { uint64_t dur_ns; uint64_t mem_bytes; int mem_dev; uint64_t local_bytes;
                    struct CUgraphNode_st **nodes; size_t n_nodes; };
/* type: CU_GRAPH_NODE_TYPE_KERNEL, _MEM_ALLOC (bytes on dev at dptr), _MEM_FREE or
 * _GRAPH (child: the graph it runs, owned by the node); freed: an allocation node whose
 * memory a free node of the graph frees. */
struct CUgraphNode_st { int type; uint64_t bytes; int dev; CUdeviceptr dptr; int freed;
                        struct CUgraph_st *child; CUfunction func; };
/* backed: its allocations have physical memory from the device's graph pool;
 * launched: it has run; unfreed: its allocation nodes no free node frees (address and
 * size, n_unfreed of them), of which outstanding are still allocated from its last run. */
struct unfreed_alloc { CUdeviceptr dptr; uint64_t bytes; };
struct CUgraphExec_st { uint64_t dur_ns; uint64_t mem_bytes; int mem_dev; uint64_t local_bytes;
                        int backed; int launched; struct unfreed_alloc *unfreed;
                        size_t n_unfreed, outstanding; };
/* A stream-ordered memory pool: reserved is the physical memory it holds (taken from
 * the device when allocations need more than it has free, given back at a
 * synchronisation above the release threshold, on cuMemPoolTrimTo, on destroy). */
/* pending: bytes freed by stream-ordered frees that no synchronisation has passed yet;
 * the pool may serve them again (stream order) but a trim cannot release them. */
struct CUmemPoolHandle_st { int dev; int destroyed; uint64_t reserved, used, threshold, pending; };
struct CUarray_st { uint64_t size; int dev; };
struct CUmipmappedArray_st { uint64_t size; int dev; };

/* Managed allocations keep their advice: preferred location (a device, CU_DEVICE_CPU
 * or CU_DEVICE_INVALID), the devices with accessed-by set (bit d; bit 31 the CPU),
 * read-mostly. */
struct alloc {
    uint64_t key;
    uint64_t size;
    int dev;
    int managed;
    int preferred;
    int read_mostly;
    uint32_t accessed_by;
    const struct CUctx_st *ctx; /* freed with this context (NULL: not context-bound) */
    int vmm;                    /* a cuMemCreate handle: */
    int released;               /*   cuMemRelease called */
    unsigned maps;              /*   live cuMemMap mappings; freed when released and 0 */
    struct CUmemPoolHandle_st *pool; /* from a memory pool: a free returns it there */
    unsigned char *bytes; /* its contents, mapped at the first copy or set (see backing) */
    int pinned; /* host memory: PINNED_ALLOCATED (cuMemHostAlloc) or PINNED_REGISTERED */
    unsigned host_flags; /* the flags it was allocated or registered with */
};
#define PINNED_ALLOCATED 1
#define PINNED_REGISTERED 2
/* Virtual memory management: reserved address ranges and what is mapped in them. */
struct vrange { uint64_t ptr, size, handle; };
static struct vrange *vres, *vmaps;
static size_t n_vres, n_vmaps;
#define ACCESSED_BY_CPU (1u << 31)

static int initialized;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs;
static size_t n_allocs, cap_allocs;
static uint64_t next_addr = 0x7f0000000000ull;
static uint64_t next_handle = 1;
static struct CUctx_st primary[FAKE_MAX_DEVICES];
static unsigned primary_refs[FAKE_MAX_DEVICES];
static struct CUstream_st default_stream[FAKE_MAX_DEVICES];
static uint64_t proc_tail[FAKE_MAX_DEVICES];
static int my_slot = -1, my_slot_pid;
static __thread struct CUctx_st *cur_ctx;
static struct CUctx_st *cur_ctx_of_thread(void) { return cur_ctx; }

static const struct fake_config *cfg(void) { return fake_config(0); }

#define CHECK_INIT(name)                                                                         \
    do {                                                                                         \
        if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))                                    \
            return CUDA_ERROR_NOT_INITIALIZED;                                                   \
        const struct fake_config *c_ = cfg();                                                    \
        if (c_->n_cuda_errors) {                                                                 \
            int e_ = fake_error_for(c_->cuda_errors, c_->n_cuda_errors, name);                   \
            if (e_)                                                                              \
                return e_;                                                                       \
        }                                                                                        \
    } while (0)

static int valid_dev(CUdevice d) { return d >= 0 && (unsigned)d < cfg()->device_count; }

/* ---- shared device memory ---- */

static struct fake_proc *my_proc(void)
{
    struct fake_state *s = fake_state();
    int pid = getpid();
    if (my_slot >= 0 && my_slot_pid == pid)
        return &s->procs[my_slot];
    for (int i = 0; i < FAKE_MAX_PROCS; i++) {
        int32_t expect = 0;
        if (__atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE) == pid ||
            __atomic_compare_exchange_n(&s->procs[i].pid, &expect, pid, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            my_slot = i;
            my_slot_pid = pid;
            return &s->procs[i];
        }
    }
    return NULL;
}

static void reclaim_dead(void)
{
    struct fake_state *s = fake_state();
    for (int i = 0; i < FAKE_MAX_PROCS; i++) {
        int32_t pid = __atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE);
        if (pid <= 0 || fake_pid_alive(pid))
            continue;
        if (!__atomic_compare_exchange_n(&s->procs[i].pid, &pid, -1, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;
        for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
            uint64_t u = __atomic_exchange_n(&s->procs[i].used[d], 0, __ATOMIC_ACQ_REL);
            __atomic_fetch_sub(&s->mem_used[d], u, __ATOMIC_ACQ_REL);
        }
        uint64_t h = __atomic_exchange_n(&s->procs[i].host_used, 0, __ATOMIC_ACQ_REL);
        __atomic_fetch_sub(&s->host_used, h, __ATOMIC_ACQ_REL);
        __atomic_store_n(&s->procs[i].pid, 0, __ATOMIC_RELEASE);
    }
}

static CUresult take_memory(int dev, uint64_t size)
{
    struct fake_state *s = fake_state();
    uint64_t cap = cfg()->dev[dev].memory;
    struct fake_proc *p = my_proc();
    for (int pass = 0; pass < 2; pass++) {
        uint64_t used = __atomic_load_n(&s->mem_used[dev], __ATOMIC_ACQUIRE);
        while (size <= cap && used <= cap - size) {
            if (__atomic_compare_exchange_n(&s->mem_used[dev], &used, used + size, 1,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                if (p)
                    __atomic_fetch_add(&p->used[dev], size, __ATOMIC_ACQ_REL);
                return CUDA_SUCCESS;
            }
        }
        reclaim_dead();
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void give_memory(int dev, uint64_t size)
{
    struct fake_state *s = fake_state();
    struct fake_proc *p = my_proc();
    __atomic_fetch_sub(&s->mem_used[dev], size, __ATOMIC_ACQ_REL);
    if (p)
        __atomic_fetch_sub(&p->used[dev], size, __ATOMIC_ACQ_REL);
}

/* Managed memory: host memory shared by every process of the state file. */
static CUresult take_host_memory(uint64_t size)
{
    struct fake_state *s = fake_state();
    uint64_t cap = cfg()->host_memory;
    struct fake_proc *p = my_proc();
    for (int pass = 0; pass < 2; pass++) {
        uint64_t used = __atomic_load_n(&s->host_used, __ATOMIC_ACQUIRE);
        while (size <= cap && used <= cap - size) {
            if (__atomic_compare_exchange_n(&s->host_used, &used, used + size, 1,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                if (p)
                    __atomic_fetch_add(&p->host_used, size, __ATOMIC_ACQ_REL);
                return CUDA_SUCCESS;
            }
        }
        reclaim_dead();
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void give_host_memory(uint64_t size)
{
    struct fake_proc *p = my_proc();
    __atomic_fetch_sub(&fake_state()->host_used, size, __ATOMIC_ACQ_REL);
    if (p)
        __atomic_fetch_sub(&p->host_used, size, __ATOMIC_ACQ_REL);
}

static int put_alloc_rec(struct alloc a)
{
    pthread_mutex_lock(&mu);
    if (n_allocs == cap_allocs) {
        size_t n = cap_allocs ? cap_allocs * 2 : 256;
        struct alloc *a = realloc(allocs, n * sizeof *a);
        if (a == NULL) {
            pthread_mutex_unlock(&mu);
            return -1;
        }
        allocs = a;
        cap_allocs = n;
    }
    allocs[n_allocs++] = a;
    pthread_mutex_unlock(&mu);
    return 0;
}

static struct CUctx_st *cur_ctx_of_thread(void);

static int put_alloc(uint64_t key, uint64_t size, int dev)
{
    return put_alloc_rec(
        (struct alloc){key, size, dev, 0, CU_DEVICE_INVALID, 0, 0, cur_ctx_of_thread(), 0, 0, 0});
}

/* The managed allocation holding [ptr, ptr + count), or NULL; call with mu held. */
static struct alloc *managed_range(uint64_t ptr, uint64_t count)
{
    for (size_t i = 0; i < n_allocs; i++) {
        struct alloc *a = &allocs[i];
        if (a->managed && ptr >= a->key && count <= a->size && ptr - a->key <= a->size - count)
            return a;
    }
    return NULL;
}

static int take_alloc(uint64_t key, int pinned, struct alloc *out)
{
    int rc = -1;
    pthread_mutex_lock(&mu);
    for (size_t i = n_allocs; i-- > 0;) {
        if (allocs[i].key == key && allocs[i].pinned == pinned) {
            *out = allocs[i];
            allocs[i] = allocs[--n_allocs];
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* The contents of an allocation: anonymous memory reserved without swap and mapped
 * when a copy or set first reaches it, so untouched gigabytes cost nothing. */
static void drop_bytes(struct alloc *a)
{
    if (a->bytes != NULL)
        munmap(a->bytes, a->size);
    a->bytes = NULL;
}

static uint64_t new_address(uint64_t size)
{
    uint64_t span = (size + 0xfffffull) & ~0xfffffull;
    return __atomic_fetch_add(&next_addr, span ? span : 0x100000ull, __ATOMIC_RELAXED);
}

static CUresult alloc_on(int dev, uint64_t size, CUdeviceptr *dptr)
{
    if (dptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = take_memory(dev, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t a = new_address(size);
    if (put_alloc(a, size, dev) != 0) {
        give_memory(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = a;
    return CUDA_SUCCESS;
}

/* ---- stream-ordered memory pools and the graph memory pool, per device ---- */

static struct CUmemPoolHandle_st default_pool[FAKE_MAX_DEVICES];
static struct CUmemPoolHandle_st *current_pool[FAKE_MAX_DEVICES];
static struct CUmemPoolHandle_st *pools[256]; /* every pool of this process */
static size_t n_pools;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t graph_reserved[FAKE_MAX_DEVICES], graph_used[FAKE_MAX_DEVICES];
/* Allocations a graph run made and no node freed: they outlive the exec until the
 * program frees the address (cuMemFree, cuMemFreeAsync). exec: NULL once destroyed. */
#define GRAPH_LIVE_MAX 1024
static struct graph_live { CUdeviceptr dptr; uint64_t bytes; int dev;
                           struct CUgraphExec_st *exec; } graph_live[GRAPH_LIVE_MAX];
static size_t n_graph_live;

static struct CUmemPoolHandle_st *pool_of_dev(int dev)
{
    pthread_mutex_lock(&pool_mu);
    if (default_pool[dev].dev != dev + 1) { /* first use: dev is stored plus one */
        default_pool[dev].dev = dev + 1;
        if (n_pools < 256)
            pools[n_pools++] = &default_pool[dev];
    }
    struct CUmemPoolHandle_st *p = current_pool[dev] ? current_pool[dev] : &default_pool[dev];
    pthread_mutex_unlock(&pool_mu);
    return p;
}

static CUgraphNode add_node(CUgraph g, int type, uint64_t bytes, int dev);

/* Captured: a stream-ordered allocation becomes an allocation node of the graph being
 * captured and takes no memory now (the graph pool backs it at upload or launch). */
static int captured_alloc(CUstream s, uint64_t n, CUdeviceptr *dptr, CUresult *rc)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || s->capture == NULL)
        return 0;
    if (dptr == NULL || n == 0) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return 1;
    }
    struct CUgraph_st *g = s->capture;
    if ((s->capture_last = add_node(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, n, s->dev)) == NULL) {
        *rc = CUDA_ERROR_OUT_OF_MEMORY;
        return 1;
    }
    g->mem_bytes += n;
    g->mem_dev = s->dev;
    *dptr = s->capture_last->dptr = new_address(n);
    *rc = CUDA_SUCCESS;
    return 1;
}

static CUresult pool_alloc(struct CUmemPoolHandle_st *p, uint64_t n, CUdeviceptr *dptr)
{
    if (dptr == NULL || n == 0 || p == NULL || p->destroyed)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    uint64_t idle = p->reserved - p->used, more = n > idle ? n - idle : 0;
    CUresult rc = more ? take_memory(p->dev - 1, more) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        p->reserved += more;
        p->used += n;
        if (p->pending > p->reserved - p->used) /* served from pending frees */
            p->pending = p->reserved - p->used;
    }
    pthread_mutex_unlock(&pool_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t a = new_address(n);
    put_alloc_rec((struct alloc){a, n, p->dev - 1, 0, CU_DEVICE_INVALID, 0, 0, NULL, 0, 0, 0, p});
    *dptr = a;
    return CUDA_SUCCESS;
}

/* Freed memory stays in the pool (reserved) until a synchronisation, a trim or destroy.
 * ordered: a stream-ordered free, which a trim cannot release before a synchronisation
 * (the driver kept such a block through cuMemPoolTrimTo on an H200). */
static void pool_free(struct CUmemPoolHandle_st *p, uint64_t n, int ordered)
{
    pthread_mutex_lock(&pool_mu);
    p->used -= n;
    if (p->destroyed) {
        p->reserved -= n;
        give_memory(p->dev - 1, n);
    } else if (ordered) {
        p->pending += n;
    }
    pthread_mutex_unlock(&pool_mu);
}

static void pool_trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    uint64_t held = p->used + p->pending;
    uint64_t floor = held > keep ? held : keep;
    if (p->reserved > floor) {
        give_memory(p->dev - 1, p->reserved - floor);
        p->reserved = floor;
    }
}

/* At a stream, event or context synchronisation every pool above its release
 * threshold gives back what it holds beyond it. */
static void pools_synchronised(void)
{
    pthread_mutex_lock(&pool_mu);
    for (size_t i = 0; i < n_pools; i++) {
        pools[i]->pending = 0;
        if (pools[i]->reserved > pools[i]->threshold)
            pool_trim_locked(pools[i], pools[i]->threshold);
    }
    pthread_mutex_unlock(&pool_mu);
}

/* ordered: a stream-ordered free (cuMemFreeAsync). */
static CUresult free_key_ordered(uint64_t key, int ordered)
{
    struct alloc a;
    if (take_alloc(key, 0, &a) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    drop_bytes(&a);
    if (a.pool != NULL) {
        pool_free(a.pool, a.size, ordered);
        return CUDA_SUCCESS;
    }
    if (a.managed)
        give_host_memory(a.size);
    else
        give_memory(a.dev, a.size);
    return CUDA_SUCCESS;
}

static CUresult free_key(uint64_t key)
{
    return free_key_ordered(key, 0);
}

/* Destroying a context frees everything allocated in it, as the driver does.
 * Call with mu held. */
static void free_ctx_memory(struct CUctx_st *c)
{
    uint64_t dev_bytes[FAKE_MAX_DEVICES] = {0}, host = 0;
    for (size_t i = n_allocs; i-- > 0;) {
        if (allocs[i].ctx != c || allocs[i].vmm)
            continue;
        if (allocs[i].pinned == PINNED_ALLOCATED) {
            host += allocs[i].size;
            munmap((void *)(uintptr_t)allocs[i].key, allocs[i].size);
        } else if (allocs[i].pinned == PINNED_REGISTERED) {
        } else if (allocs[i].managed)
            host += allocs[i].size;
        else
            dev_bytes[allocs[i].dev] += allocs[i].size;
        drop_bytes(&allocs[i]);
        allocs[i] = allocs[--n_allocs];
    }
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        if (dev_bytes[d])
            give_memory(d, dev_bytes[d]);
    if (host)
        give_host_memory(host);
    if (c->limit_bytes)
        give_memory(c->dev, c->limit_bytes);
    c->limit_bytes = 0;
    memset(c->limit, 0, sizeof c->limit);
}

static CUresult need_ctx(int *dev)
{
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = cur_ctx->dev;
    return CUDA_SUCCESS;
}

/* ---- the device timeline ---- */

static struct CUstream_st *stream_of(CUstream s)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return cur_ctx ? &default_stream[cur_ctx->dev] : NULL;
    return s;
}

/* Put an operation of dur_ns on the device after everything submitted
 * before it (by any process); returns its start time. */
static void sleep_until(uint64_t t);

static uint64_t submit(struct CUstream_st *st, uint64_t dur_ns)
{
    struct fake_state *s = fake_state();
    pthread_mutex_lock(&st->mu);
    sleep_until(st->ends[st->head]);
    uint64_t now = fake_now_ns(), stail = __atomic_load_n(&st->tail, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&s->dev_tail_ns[st->dev], __ATOMIC_ACQUIRE), start, end;
    do {
        start = now;
        if (stail > start)
            start = stail;
        if (tail > start)
            start = tail;
        end = start + dur_ns;
    } while (!__atomic_compare_exchange_n(&s->dev_tail_ns[st->dev], &tail, end, 1,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    __atomic_store_n(&st->tail, end, __ATOMIC_RELEASE);
    st->ends[st->head] = end;
    st->head = (st->head + 1) % QUEUE_DEPTH;
    pthread_mutex_unlock(&st->mu);
    uint64_t pt = __atomic_load_n(&proc_tail[st->dev], __ATOMIC_ACQUIRE);
    while (pt < end && !__atomic_compare_exchange_n(&proc_tail[st->dev], &pt, end, 1,
                                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    if (dur_ns)
        __atomic_fetch_add(&s->busy_ns[st->dev], dur_ns, __ATOMIC_RELAXED);
    return start;
}

static void sleep_until(uint64_t t)
{
    uint64_t now = fake_now_ns();
    if (t <= now)
        return;
    uint64_t d = t - now;
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static CUresult set_limit(struct CUctx_st *c, int limit, size_t value);
static uint64_t ctx_limit(const struct CUctx_st *c, int limit);

static CUresult launch(CUfunction f, CUstream s, uint64_t extra_ns)
{
    int dev;
    CUresult rc = need_ctx(&dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* The driver raises the context's stack to what the kernel needs per thread, for
     * every resident thread, and keeps it raised; out of memory if the GPU cannot. */
    if (f != NULL && f->local_bytes > ctx_limit(cur_ctx, 0) &&
        (rc = set_limit(cur_ctx, 0, f->local_bytes)) != CUDA_SUCCESS)
        return rc;
    struct CUstream_st *st = stream_of(s);
    if (st == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    submit(st, (f ? f->dur_ns : 0) + extra_ns);
    return CUDA_SUCCESS;
}

/* ---- initialisation, devices ---- */

/* Device addresses come from 16 TiB of this process's address space reserved without
 * access or swap, so no host pointer (which cuMemcpy and the pointer queries tell apart
 * from device ones, as unified addressing does) can fall among them. */
static void reserve_once(void)
{
    void *m = mmap(NULL, 1ull << 44, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m != MAP_FAILED)
        __atomic_store_n(&next_addr, (uint64_t)(uintptr_t)m, __ATOMIC_RELAXED);
}

static void reserve_addresses(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, reserve_once);
}

EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    const struct fake_config *c = cfg();
    int e = fake_error_for(c->cuda_errors, c->n_cuda_errors, "cuInit");
    if (e)
        return e;
    if (c->device_count == 0)
        return CUDA_ERROR_NO_DEVICE;
    for (unsigned i = 0; i < FAKE_MAX_DEVICES; i++) {
        primary[i].dev = (int)i;
        primary[i].primary = 1;
        default_stream[i].dev = (int)i;
        pthread_mutex_init(&default_stream[i].mu, NULL);
    }
    reserve_addresses();
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *v = cfg()->cuda_version;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    CHECK_INIT("cuDeviceGetCount");
    *count = (int)cfg()->device_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CHECK_INIT("cuDeviceGet");
    if (!valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CHECK_INIT("cuDeviceGetName");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", cfg()->dev[dev].name);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    CHECK_INIT("cuDeviceGetUuid");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, cfg()->dev[dev].uuid_bytes, 16);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CHECK_INIT("cuDeviceTotalMem_v2");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)cfg()->dev[dev].memory;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CHECK_INIT("cuMemGetInfo_v2");
    int dev;
    CUresult rc = need_ctx(&dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t total = cfg()->dev[dev].memory;
    uint64_t used = __atomic_load_n(&fake_state()->mem_used[dev], __ATOMIC_ACQUIRE);
    *free_bytes = (size_t)(used < total ? total - used : 0);
    *total_bytes = (size_t)total;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

static int valid_ctx_flags(unsigned flags);
static CUresult ctx_create(CUcontext *pctx, CUdevice dev, unsigned flags)
{
    CHECK_INIT("cuCtxCreate");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (pctx == NULL || !valid_ctx_flags(flags))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t n = cfg()->context_bytes;
    if (n && take_memory(dev, n) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (c == NULL) {
        if (n)
            give_memory(dev, n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->dev = dev;
    c->flags = flags;
    cur_ctx = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, dev, flags);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *p, int n, unsigned int flags, CUdevice dev)
{
    (void)p, (void)n;
    return ctx_create(pctx, dev, flags);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *p, unsigned int flags, CUdevice dev)
{
    (void)p;
    return ctx_create(pctx, dev, flags);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CHECK_INIT("cuCtxDestroy_v2");
    if (ctx == NULL || ctx->primary || ctx->destroyed)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (cfg()->context_bytes)
        give_memory(ctx->dev, cfg()->context_bytes);
    pthread_mutex_lock(&mu);
    free_ctx_memory(ctx);
    pthread_mutex_unlock(&mu);
    if (cur_ctx == ctx)
        cur_ctx = NULL;
    /* Kept, marked destroyed: its events then fail as the driver's would (their
     * handles are gone), and a new context never reuses its address. */
    ctx->destroyed = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CHECK_INIT("cuCtxSetCurrent");
    cur_ctx = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    CHECK_INIT("cuCtxGetCurrent");
    *ctx = cur_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    CHECK_INIT("cuCtxGetDevice");
    return need_ctx(dev);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    CHECK_INIT("cuCtxSynchronize");
    int dev;
    CUresult rc = need_ctx(&dev);
    if (rc == CUDA_SUCCESS)
        sleep_until(__atomic_load_n(&proc_tail[dev], __ATOMIC_ACQUIRE));
    pools_synchronised();
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CHECK_INIT("cuDevicePrimaryCtxRetain");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_SUCCESS;
    if (primary_refs[dev] == 0 && cfg()->context_bytes)
        rc = take_memory(dev, cfg()->context_bytes);
    if (rc == CUDA_SUCCESS) {
        primary_refs[dev]++;
        *pctx = &primary[dev];
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- context flags, ids and the primary context's state ---- */

#define CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE 708
static unsigned primary_flags[FAKE_MAX_DEVICES];
static unsigned long long next_ctx_id = 1;

/* CU_CTX_SCHED_AUTO 0, SPIN 1, YIELD 2, BLOCKING_SYNC 4 (one of them), MAP_HOST 0x8,
 * LMEM_RESIZE_TO_MAX 0x10, COREDUMP_ENABLE 0x20, USER_COREDUMP_ENABLE 0x40,
 * SYNC_MEMOPS 0x80. */
static int valid_ctx_flags(unsigned flags)
{
    unsigned sched = flags & 7u;
    return (flags & ~0xffu) == 0 && (sched == 0 || sched == 1 || sched == 2 || sched == 4);
}

static CUresult primary_set_flags(CUdevice dev, unsigned flags, int while_active)
{
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!valid_ctx_flags(flags))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_SUCCESS;
    if (primary_refs[dev] && !while_active)
        rc = CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE; /* before 11.0 flags were fixed once active */
    else
        primary_flags[dev] = flags;
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    CHECK_INIT("cuDevicePrimaryCtxSetFlags");
    return primary_set_flags(dev, flags, 0);
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CHECK_INIT("cuDevicePrimaryCtxSetFlags_v2");
    return primary_set_flags(dev, flags, 1);
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CHECK_INIT("cuDevicePrimaryCtxGetState");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *flags = primary_flags[dev];
    *active = primary_refs[dev] > 0;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    CHECK_INIT("cuCtxGetFlags");
    if (flags == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *flags = cur_ctx->primary ? primary_flags[cur_ctx->dev] : cur_ctx->flags;
    return CUDA_SUCCESS;
}

/* ctx NULL: the current context. */
static struct CUctx_st *ctx_or_current(CUcontext ctx)
{
    struct CUctx_st *c = ctx ? ctx : cur_ctx;
    return c == NULL || c->destroyed ? NULL : c;
}

/* Contexts made through the _v2 API (all of them here) have API version 3020. */
EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    CHECK_INIT("cuCtxGetApiVersion");
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx_or_current(ctx) == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

/* A context's id is unique for the life of the process; given at first ask. */
EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    CHECK_INIT("cuCtxGetId");
    if (id == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = ctx_or_current(ctx);
    if (c == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    if (c->id == 0)
        c->id = next_ctx_id++;
    *id = c->id;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* PCI addresses as CUDA writes them: "%04x:%02x:%02x.%x" (domain, bus, device, function). */
static int parse_pci(const char *text, unsigned v[4])
{
    char end;
    return sscanf(text, "%x:%x:%x.%x%c", &v[0], &v[1], &v[2], &v[3], &end) == 4;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev)
{
    CHECK_INIT("cuDeviceGetPCIBusId");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    unsigned v[4];
    if (out == NULL || len <= 0 || !parse_pci(cfg()->dev[dev].pci_bus_id, v))
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(out, (size_t)len, "%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id)
{
    CHECK_INIT("cuDeviceGetByPCIBusId");
    unsigned want[4], have[4];
    if (dev == NULL || bus_id == NULL || !parse_pci(bus_id, want))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < cfg()->device_count; i++)
        if (parse_pci(cfg()->dev[i].pci_bus_id, have) && memcmp(want, have, sizeof want) == 0) {
            *dev = (CUdevice)i;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* Every pair of distinct GPUs here can reach each other (as over NVLink). */
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    CHECK_INIT("cuDeviceCanAccessPeer");
    if (can == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev) || !valid_dev(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

static void drop_primary(CUdevice dev)
{
    if (cfg()->context_bytes)
        give_memory(dev, cfg()->context_bytes);
    free_ctx_memory(&primary[dev]);
    primary_refs[dev] = 0;
    if (cur_ctx == &primary[dev])
        cur_ctx = NULL;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CHECK_INIT("cuDevicePrimaryCtxRelease_v2");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult rc = primary_refs[dev] ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS && --primary_refs[dev] == 0)
        drop_primary(dev);
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CHECK_INIT("cuDevicePrimaryCtxReset_v2");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (primary_refs[dev])
        drop_primary(dev);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* The pre-11.0 entry points: same behaviour, still exported and still what
 * cuGetProcAddress returns for a cudaVersion below 11000. */
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

/* ---- limits of the current context: heaps and buffers the driver allocates ---- */

#define THREADS_PER_SM 2048u
static const uint64_t limit_default[N_LIMITS] = {1024, 1u << 20, 8u << 20, 2, 2048, 0, 0};

/* Device memory a limit's value takes: the stack per resident thread, the printf
 * FIFO and the malloc heap as they are; the other limits take none. */
static uint64_t limit_memory(int limit, uint64_t v)
{
    if (limit == 0)
        return v * cfg()->multiprocessor_count * THREADS_PER_SM;
    return limit == 1 || limit == 2 ? v : 0;
}

static uint64_t ctx_limit(const struct CUctx_st *c, int limit)
{
    return c->limit[limit] ? c->limit[limit] : limit_default[limit];
}

EXPORT CUresult cuCtxGetLimit(size_t *value, int limit)
{
    CHECK_INIT("cuCtxGetLimit");
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (value == NULL || limit < 0 || limit >= N_LIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    *value = (size_t)ctx_limit(cur_ctx, limit);
    return CUDA_SUCCESS;
}

static CUresult set_limit(struct CUctx_st *c, int limit, size_t value)
{
    if (limit == 0)
        value = (value + 15) / 16 * 16; /* the stack size is rounded up */
    uint64_t total = 0;
    for (int l = 0; l < N_LIMITS; l++) {
        uint64_t v = l == limit ? value : ctx_limit(c, l);
        uint64_t m = limit_memory(l, v), base = limit_memory(l, limit_default[l]);
        total += m > base ? m - base : 0;
    }
    if (total > c->limit_bytes && take_memory(c->dev, total - c->limit_bytes) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (total < c->limit_bytes)
        give_memory(c->dev, c->limit_bytes - total);
    c->limit_bytes = total;
    c->limit[limit] = value;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
    CHECK_INIT("cuCtxSetLimit");
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (limit < 0 || limit >= N_LIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    return set_limit(cur_ctx, limit, value);
}

/* Attributes of an sm_80 data-centre GPU (A100-like), indexed by CUdevice_attribute;
 * 0 is a feature the device lacks, as the driver reports it. -1 marks values that come
 * from the configuration. Attributes past ATTR_MAX (those newer drivers added) are
 * CUDA_ERROR_INVALID_VALUE, as on a driver that does not know them. */
#define ATTR_MAX 134
#define ATTR_FROM_CONFIG (-1)
static const int device_attrs[ATTR_MAX] = {
    [1] = 1024, [2] = 1024, [3] = 1024, [4] = 64, [5] = 2147483647, [6] = 65535, [7] = 65535,
    [8] = 49152, [9] = 65536, [10] = 32, [11] = 2147483647, [12] = 65536, [13] = 1410000,
    [14] = 512, [15] = 1, [16] = ATTR_FROM_CONFIG, [19] = 1, [21] = 131072, [22] = 131072,
    [23] = 65536, [24] = 16384, [25] = 16384, [26] = 16384, [27] = 32768, [28] = 32768,
    [29] = 2048, [30] = 512, [31] = 1, [32] = 1, [33] = ATTR_FROM_CONFIG, [36] = 1215000,
    [37] = 5120, [38] = 41943040, [39] = (int)THREADS_PER_SM, [40] = 3, [41] = 1,
    [42] = 32768, [43] = 2048, [44] = 1, [45] = 32768, [46] = 32768, [47] = 8192, [48] = 8192,
    [49] = 32768, [50] = ATTR_FROM_CONFIG, [51] = 32, [52] = 32768, [53] = 32768, [54] = 2046,
    [55] = 32768, [56] = 131072, [57] = 65536, [58] = 16384, [59] = 16384, [60] = 16384,
    [61] = 32768, [62] = 2048, [63] = 32768, [64] = 32768, [65] = 2048, [66] = 32768,
    [67] = 32768, [68] = 2046, [69] = 268435456, [70] = 131072, [71] = 65000,
    [72] = 2097120, [73] = 32768, [74] = 32768, [75] = 8, [76] = 0, [77] = 32768, [78] = 1,
    [79] = 1, [80] = 1, [81] = 167936, [82] = 65536, [83] = 1, [87] = 2, [89] = 1, [90] = 1,
    [92] = 1, [93] = 1, [95] = 1, [96] = 1, [97] = 166912, [99] = 1, [102] = 1, [103] = 1,
    [106] = 32, [107] = 1, [108] = 31457280, [109] = 134213632, [110] = 1, [111] = 1024,
    [112] = 1, [113] = 1, [114] = 1, [115] = 1, [119] = 1, [121] = 1, [122] = 1, [125] = 1,
    [126] = 1,
};

EXPORT CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    CHECK_INIT("cuDeviceGetAttribute");
    if (value == NULL || !valid_dev(dev) || attrib <= 0 || attrib >= ATTR_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_dev *d = &cfg()->dev[dev];
    unsigned domain = 0, bus = 0;
    sscanf(d->pci_bus_id, "%x:%x", &domain, &bus);
    if (attrib == 16) /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
        *value = (int)cfg()->multiprocessor_count;
    else if (attrib == 33) /* CU_DEVICE_ATTRIBUTE_PCI_BUS_ID */
        *value = (int)bus;
    else if (attrib == 50) /* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID */
        *value = (int)domain;
    else
        *value = device_attrs[attrib];
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

#define ALLOC_CURRENT(name, size, dptr)                                                          \
    CHECK_INIT(name);                                                                            \
    int dev_;                                                                                    \
    CUresult rc_ = need_ctx(&dev_);                                                              \
    if (rc_ != CUDA_SUCCESS)                                                                     \
        return rc_;                                                                              \
    return alloc_on(dev_, (size), (dptr));

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) { ALLOC_CURRENT("cuMemAlloc_v2", n, dptr) }
/* Managed memory is populated where it is first touched; nothing touches memory here,
 * so it stays in host memory and takes no device memory, like untouched pages do. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags)
{
    CHECK_INIT("cuMemAllocManaged");
    int dev;
    CUresult rc = need_ctx(&dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dptr == NULL || n == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = take_host_memory(n)) != CUDA_SUCCESS)
        return rc;
    /* With unified addressing the host reads and writes managed memory at its device
     * address: it is host memory, mapped without swap reservation (untouched pages cost
     * nothing), and the same bytes the copies and sets of the device side see. */
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    uint64_t a = (uint64_t)(uintptr_t)m;
    if (m == MAP_FAILED ||
        put_alloc_rec((struct alloc){a, n, dev, 1, CU_DEVICE_INVALID, 0, 0, cur_ctx, 0, 0, 0,
                                     NULL, m}) != 0) {
        if (m != MAP_FAILED)
            munmap(m, n);
        give_host_memory(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = a;
    return CUDA_SUCCESS;
}

/* Advice applies to the whole managed allocation that holds the range. */
EXPORT CUresult cuMemAdvise(CUdeviceptr ptr, size_t count, CUmem_advise advice, CUdevice device)
{
    CHECK_INIT("cuMemAdvise");
    if (device != CU_DEVICE_CPU && !valid_dev(device))
        return CUDA_ERROR_INVALID_DEVICE;
    uint32_t bit = device == CU_DEVICE_CPU ? ACCESSED_BY_CPU : 1u << device;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    struct alloc *a = managed_range(ptr, count);
    if (a == NULL || count == 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (advice == CU_MEM_ADVISE_SET_READ_MOSTLY)
        a->read_mostly = 1;
    else if (advice == CU_MEM_ADVISE_UNSET_READ_MOSTLY)
        a->read_mostly = 0;
    else if (advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION)
        a->preferred = device;
    else if (advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION)
        a->preferred = CU_DEVICE_INVALID;
    else if (advice == CU_MEM_ADVISE_SET_ACCESSED_BY)
        a->accessed_by |= bit;
    else if (advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        a->accessed_by &= ~bit;
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&mu);
    return rc;
}

/* 12.2's form: the location is a CUmemLocation {type, id} passed by value. */
typedef struct { int type; int id; } fake_mem_location;
EXPORT CUresult cuMemAdvise_v2(CUdeviceptr ptr, size_t count, CUmem_advise advice,
                               fake_mem_location loc)
{
    CHECK_INIT("cuMemAdvise_v2");
    CUdevice dev;
    if (loc.type == 1) /* CU_MEM_LOCATION_TYPE_DEVICE */
        dev = loc.id;
    else if (loc.type == 2 || loc.type == 4) /* _HOST, _HOST_NUMA_CURRENT */
        dev = CU_DEVICE_CPU;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemAdvise(ptr, count, advice, dev);
}

EXPORT CUresult cuMemRangeGetAttribute(void *data, size_t size, CUmem_range_attribute attr,
                                       CUdeviceptr ptr, size_t count)
{
    CHECK_INIT("cuMemRangeGetAttribute");
    if (data == NULL || size == 0 || size % sizeof(int) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int *out = data;
    size_t n = size / sizeof(int);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    struct alloc *a = managed_range(ptr, count);
    if (a == NULL || count == 0) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (attr == CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY && n == 1) {
        out[0] = a->read_mostly;
    } else if (attr == CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION && n == 1) {
        out[0] = a->preferred;
    } else if (attr == CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY) {
        /* The CPU first, then devices in order; the rest CU_DEVICE_INVALID. */
        size_t k = 0;
        if ((a->accessed_by & ACCESSED_BY_CPU) && k < n)
            out[k++] = CU_DEVICE_CPU;
        for (int d = 0; d < FAKE_MAX_DEVICES && k < n; d++)
            if (a->accessed_by & (1u << d))
                out[k++] = d;
        while (k < n)
            out[k++] = CU_DEVICE_INVALID;
    } else {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
/* Stream-ordered allocations come from the device's current pool (or the one named). */
#define ALLOC_POOL(name, size, dptr, pool)                                                       \
    CHECK_INIT(name);                                                                            \
    int dev_;                                                                                    \
    CUresult rc_ = need_ctx(&dev_);                                                              \
    if (rc_ != CUDA_SUCCESS)                                                                     \
        return rc_;                                                                              \
    return pool_alloc((pool) ? (pool) : pool_of_dev(dev_), (size), (dptr));

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CUresult crc;
    if (captured_alloc(s, n, dptr, &crc))
        return crc;
    ALLOC_POOL("cuMemAllocAsync", n, dptr, NULL)
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CUresult crc;
    if (captured_alloc(s, n, dptr, &crc))
        return crc;
    ALLOC_POOL("cuMemAllocAsync_ptsz", n, dptr, NULL)
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s)
{
    (void)s;
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    ALLOC_POOL("cuMemAllocFromPoolAsync", n, dptr, p)
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool p,
                                             CUstream s)
{
    (void)s;
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    ALLOC_POOL("cuMemAllocFromPoolAsync_ptsz", n, dptr, p)
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CHECK_INIT("cuDeviceGetDefaultMemPool");
    if (pool == NULL || !valid_dev(dev))
        return CUDA_ERROR_INVALID_VALUE;
    pool_of_dev(dev);
    *pool = &default_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CHECK_INIT("cuDeviceGetMemPool");
    if (pool == NULL || !valid_dev(dev))
        return CUDA_ERROR_INVALID_VALUE;
    *pool = pool_of_dev(dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CHECK_INIT("cuDeviceSetMemPool");
    if (pool == NULL || !valid_dev(dev) || pool->dev != dev + 1)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    current_pool[dev] = pool;
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    CHECK_INIT("cuMemPoolCreate");
    if (pool == NULL || props == NULL || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->dev = props->location.id + 1;
    pthread_mutex_lock(&pool_mu);
    if (n_pools < 256)
        pools[n_pools++] = p;
    pthread_mutex_unlock(&pool_mu);
    *pool = p;
    return CUDA_SUCCESS;
}

/* Outstanding allocations keep their memory until freed; the rest goes now. The
 * handle stays valid memory here (never reused), as a destroyed pool is never used. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CHECK_INIT("cuMemPoolDestroy");
    if (pool == NULL || pool->destroyed || pool == &default_pool[pool->dev - 1])
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    pool->destroyed = 1;
    pool_trim_locked(pool, 0);
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        if (current_pool[d] == pool)
            current_pool[d] = NULL;
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    CHECK_INIT("cuMemPoolTrimTo");
    if (pool == NULL || pool->destroyed)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    pool_trim_locked(pool, keep);
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    CHECK_INIT("cuMemPoolSetAttribute");
    if (pool == NULL || pool->destroyed || value == NULL || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    pool->threshold = *(cuuint64_t *)value;
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
    CHECK_INIT("cuMemPoolGetAttribute");
    if (pool == NULL || pool->destroyed || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pool_mu);
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        *(cuuint64_t *)value = pool->threshold;
    else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        *(cuuint64_t *)value = pool->reserved;
    else if (attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        *(cuuint64_t *)value = pool->used;
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pool_mu);
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                   unsigned int elem)
{
    (void)elem;
    if (pitch == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pitch = (w + 511) / 512 * 512;
    ALLOC_CURRENT("cuMemAllocPitch_v2", *pitch * h, dptr)
}

/* A free of an address a graph run allocated: back to the graph pool (still reserved).
 * 1 if it was one. */
static int free_graph_address(CUdeviceptr p)
{
    int found = 0;
    pthread_mutex_lock(&pool_mu);
    for (size_t i = 0; i < n_graph_live && !found; i++) {
        if (graph_live[i].dptr != p)
            continue;
        graph_used[graph_live[i].dev] -= graph_live[i].bytes;
        if (graph_live[i].exec != NULL)
            graph_live[i].exec->outstanding--;
        graph_live[i] = graph_live[--n_graph_live];
        found = 1;
    }
    pthread_mutex_unlock(&pool_mu);
    return found;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    CHECK_INIT("cuMemFree_v2");
    return free_graph_address(p) ? CUDA_SUCCESS : free_key(p);
}
/* A stream-ordered free of managed memory is refused (CUDA_ERROR_NOT_SUPPORTED, seen on
 * an H200); the memory stays allocated. */
static CUresult free_async_key(uint64_t key)
{
    int managed = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_allocs && !managed; i++)
        managed = allocs[i].key == key && allocs[i].pinned == 0 && allocs[i].managed;
    pthread_mutex_unlock(&mu);
    if (managed)
        return CUDA_ERROR_NOT_SUPPORTED;
    return free_graph_address(key) ? CUDA_SUCCESS : free_key_ordered(key, 1);
}

static CUresult graph_free_node(CUgraph g, CUdeviceptr dptr, CUgraphNode *node);
static int free_graph_address(CUdeviceptr p);

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    CHECK_INIT("cuMemFreeAsync");
    if (s != NULL && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && s->capture != NULL) {
        /* a free node of the captured graph (the double records it for the graph's own) */
        (void)graph_free_node(s->capture, p, NULL);
        return CUDA_SUCCESS;
    }
    return free_async_key(p);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    (void)s;
    CHECK_INIT("cuMemFreeAsync_ptsz");
    return free_async_key(p);
}

/* ---- copies and sets: device memory holds real bytes ---- */

/* The bytes behind [ptr, ptr + n) of one device or managed allocation of this process,
 * or NULL when the range is not inside one (the driver's CUDA_ERROR_INVALID_VALUE). */
static unsigned char *backing(uint64_t ptr, uint64_t n)
{
    unsigned char *out = NULL;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_allocs; i++) {
        struct alloc *a = &allocs[i];
        if (a->vmm || a->pinned || ptr < a->key || n > a->size || ptr - a->key > a->size - n)
            continue;
        if (a->bytes == NULL) {
            void *m = mmap(NULL, a->size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED)
                break;
            a->bytes = m;
        }
        out = a->bytes + (ptr - a->key);
        break;
    }
    pthread_mutex_unlock(&mu);
    return out;
}

/* Which side of a cuMemcpy an address is on: device (or managed) memory this process
 * allocated, or host memory. */
static unsigned char *resolve_ptr(uint64_t p, uint64_t n)
{
    unsigned char *b = backing(p, n);
    return b ? b : (unsigned char *)(uintptr_t)p;
}

/* A copy is done when it is submitted (no kernel here reads or writes memory, so
 * nothing can observe the difference) and takes no time on the stream. */
static CUresult copy_bytes(unsigned char *dst, const unsigned char *src, size_t n, CUstream s,
                           int on_stream)
{
    if (dst == NULL || src == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (on_stream) {
        struct CUstream_st *st = stream_of(s);
        if (st == NULL)
            return CUDA_ERROR_INVALID_HANDLE;
        submit(st, 0);
    }
    if (n)
        memmove(dst, src, n);
    return CUDA_SUCCESS;
}

#define COPY_FNS(name, dst, src, ...)                                                            \
    EXPORT CUresult name(__VA_ARGS__)                                                            \
    {                                                                                            \
        CHECK_INIT(#name);                                                                       \
        return copy_bytes(dst, src, n, NULL, 0);                                                 \
    }                                                                                            \
    EXPORT CUresult name##_ptds(__VA_ARGS__)                                                     \
    {                                                                                            \
        CHECK_INIT(#name "_ptds");                                                               \
        return copy_bytes(dst, src, n, CU_STREAM_PER_THREAD, 0);                                 \
    }
#define COPY_ASYNC_FNS(name, dst, src, ...)                                                      \
    EXPORT CUresult name(__VA_ARGS__, CUstream s)                                                \
    {                                                                                            \
        CHECK_INIT(#name);                                                                       \
        return copy_bytes(dst, src, n, s, 1);                                                    \
    }                                                                                            \
    EXPORT CUresult name##_ptsz(__VA_ARGS__, CUstream s)                                         \
    {                                                                                            \
        CHECK_INIT(#name "_ptsz");                                                               \
        return copy_bytes(dst, src, n, s == NULL ? CU_STREAM_PER_THREAD : s, 1);                 \
    }

COPY_FNS(cuMemcpyHtoD_v2, backing(d, n), (const unsigned char *)h, CUdeviceptr d, const void *h,
         size_t n)
COPY_FNS(cuMemcpyDtoH_v2, (unsigned char *)h, backing(d, n), void *h, CUdeviceptr d, size_t n)
COPY_FNS(cuMemcpyDtoD_v2, backing(d, n), backing(sp, n), CUdeviceptr d, CUdeviceptr sp, size_t n)
COPY_FNS(cuMemcpy, resolve_ptr(d, n), resolve_ptr(sp, n), CUdeviceptr d, CUdeviceptr sp, size_t n)
COPY_ASYNC_FNS(cuMemcpyHtoDAsync_v2, backing(d, n), (const unsigned char *)h, CUdeviceptr d,
               const void *h, size_t n)
COPY_ASYNC_FNS(cuMemcpyDtoHAsync_v2, (unsigned char *)h, backing(d, n), void *h, CUdeviceptr d,
               size_t n)
COPY_ASYNC_FNS(cuMemcpyDtoDAsync_v2, backing(d, n), backing(sp, n), CUdeviceptr d,
               CUdeviceptr sp, size_t n)
COPY_ASYNC_FNS(cuMemcpyAsync, resolve_ptr(d, n), resolve_ptr(sp, n), CUdeviceptr d,
               CUdeviceptr sp, size_t n)

/* cuMemsetD8/16/32: n elements of 1, 2 or 4 bytes. */
static CUresult set_bytes(CUdeviceptr d, unsigned v, size_t n, unsigned width, CUstream s,
                          int on_stream)
{
    if (n > SIZE_MAX / width)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *b = backing(d, (uint64_t)n * width);
    if (b == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = copy_bytes(b, b, 0, s, on_stream);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0; i < n; i++)
        memcpy(b + i * width, &v, width); /* little-endian: the low bytes of v */
    return CUDA_SUCCESS;
}

#define SET_FNS(name, type, width)                                                               \
    EXPORT CUresult name(CUdeviceptr d, type v, size_t n)                                        \
    {                                                                                            \
        CHECK_INIT(#name);                                                                       \
        return set_bytes(d, v, n, width, NULL, 0);                                               \
    }                                                                                            \
    EXPORT CUresult name##_ptds(CUdeviceptr d, type v, size_t n)                                 \
    {                                                                                            \
        CHECK_INIT(#name "_ptds");                                                               \
        return set_bytes(d, v, n, width, CU_STREAM_PER_THREAD, 0);                               \
    }
#define SET_ASYNC_FNS(name, type, width)                                                         \
    EXPORT CUresult name(CUdeviceptr d, type v, size_t n, CUstream s)                            \
    {                                                                                            \
        CHECK_INIT(#name);                                                                       \
        return set_bytes(d, v, n, width, s, 1);                                                  \
    }                                                                                            \
    EXPORT CUresult name##_ptsz(CUdeviceptr d, type v, size_t n, CUstream s)                     \
    {                                                                                            \
        CHECK_INIT(#name "_ptsz");                                                               \
        return set_bytes(d, v, n, width, s == NULL ? CU_STREAM_PER_THREAD : s, 1);               \
    }
SET_FNS(cuMemsetD8_v2, unsigned char, 1)
SET_FNS(cuMemsetD16_v2, unsigned short, 2)
SET_FNS(cuMemsetD32_v2, unsigned int, 4)
SET_ASYNC_FNS(cuMemsetD8Async, unsigned char, 1)
SET_ASYNC_FNS(cuMemsetD16Async, unsigned short, 2)
SET_ASYNC_FNS(cuMemsetD32Async, unsigned int, 4)

/* ---- page-locked host memory: host memory (host_memory_bytes), never device memory;
 * with unified addressing its device pointer is its host pointer ---- */

static CUresult host_alloc(void **pp, size_t n, unsigned flags)
{
    if (pp == NULL || n == 0 || flags > 7) /* PORTABLE 1, DEVICEMAP 2, WRITECOMBINED 4 */
        return CUDA_ERROR_INVALID_VALUE;
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (take_host_memory(n) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct alloc a = {(uint64_t)(uintptr_t)m, n, cur_ctx->dev, 0, CU_DEVICE_INVALID, 0, 0,
                      cur_ctx, 0, 0, 0, NULL, NULL, PINNED_ALLOCATED, flags};
    if (m == MAP_FAILED || put_alloc_rec(a) != 0) {
        if (m != MAP_FAILED)
            munmap(m, n);
        give_host_memory(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags)
{
    CHECK_INIT("cuMemHostAlloc");
    return host_alloc(pp, n, flags);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t n)
{
    CHECK_INIT("cuMemAllocHost_v2");
    return host_alloc(pp, n, 0);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    CHECK_INIT("cuMemFreeHost");
    struct alloc a;
    if (take_alloc((uint64_t)(uintptr_t)p, PINNED_ALLOCATED, &a) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, a.size);
    give_host_memory(a.size);
    return CUDA_SUCCESS;
}

/* Registering pins memory the program already has: it takes no more memory. */
static CUresult host_register(void *p, size_t n, unsigned flags)
{
    if (p == NULL || n == 0 || flags > 15) /* PORTABLE 1, DEVICEMAP 2, IOMEMORY 4, READ_ONLY 8 */
        return CUDA_ERROR_INVALID_VALUE;
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t key = (uint64_t)(uintptr_t)p;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].pinned && key < allocs[i].key + allocs[i].size && allocs[i].key < key + n)
            rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    pthread_mutex_unlock(&mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct alloc a = {key, n, cur_ctx->dev, 0, CU_DEVICE_INVALID, 0, 0,
                      cur_ctx, 0, 0, 0, NULL, NULL, PINNED_REGISTERED, flags};
    return put_alloc_rec(a) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags)
{
    CHECK_INIT("cuMemHostRegister_v2");
    return host_register(p, n, flags);
}

EXPORT CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
    CHECK_INIT("cuMemHostRegister");
    return host_register(p, n, flags);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    CHECK_INIT("cuMemHostUnregister");
    struct alloc a;
    if (take_alloc((uint64_t)(uintptr_t)p, PINNED_REGISTERED, &a) != 0)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return CUDA_SUCCESS;
}

/* The allocation of this process holding ptr (device, managed or pinned), copied out. */
static int find_alloc(uint64_t ptr, struct alloc *out)
{
    int found = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_allocs && !found; i++)
        if (!allocs[i].vmm && ptr >= allocs[i].key && ptr - allocs[i].key < allocs[i].size) {
            *out = allocs[i];
            found = 1;
        }
    pthread_mutex_unlock(&mu);
    return found;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags)
{
    CHECK_INIT("cuMemHostGetDevicePointer_v2");
    struct alloc a;
    if (d == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!find_alloc((uint64_t)(uintptr_t)p, &a) || !a.pinned)
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
    CHECK_INIT("cuMemHostGetFlags");
    struct alloc a;
    if (flags == NULL || !find_alloc((uint64_t)(uintptr_t)p, &a) || a.pinned != PINNED_ALLOCATED)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = a.host_flags;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    CHECK_INIT("cuMemGetAddressRange_v2");
    struct alloc a;
    if (!find_alloc(p, &a) || a.pinned)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = a.key;
    if (size)
        *size = (size_t)a.size;
    return CUDA_SUCCESS;
}

/* One CUpointer_attribute of a known allocation, or of unknown memory (known = 0). */
static CUresult pointer_attr(void *data, int attr, uint64_t p, const struct alloc *a, int known)
{
    int device = known && !a->pinned;
    unsigned long long u = 0;
    switch (attr) {
    case 1: /* CONTEXT */
        *(CUcontext *)data = known ? (CUcontext)a->ctx : NULL;
        return CUDA_SUCCESS;
    case 2: /* MEMORY_TYPE: CU_MEMORYTYPE_HOST 1, _DEVICE 2 */
        *(unsigned *)data = known ? (device ? 2u : 1u) : 0u;
        return CUDA_SUCCESS;
    case 3: /* DEVICE_POINTER */
    case 4: /* HOST_POINTER: device memory has none, pinned memory is one */
        *(void **)data = known && (attr == 3 || !device || a->managed) ? (void *)(uintptr_t)p : NULL;
        return CUDA_SUCCESS;
    case 6: /* SYNC_MEMOPS */
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case 7: /* BUFFER_ID: the allocation's address is unique in this process */
        u = known ? a->key : 0;
        *(unsigned long long *)data = u;
        return CUDA_SUCCESS;
    case 8: /* IS_MANAGED */
        *(int *)data = known && a->managed;
        return CUDA_SUCCESS;
    case 9: /* DEVICE_ORDINAL */
        *(int *)data = known ? a->dev : -2;
        return CUDA_SUCCESS;
    case 11: /* RANGE_START_ADDR */
        *(void **)data = known ? (void *)(uintptr_t)a->key : NULL;
        return CUDA_SUCCESS;
    case 12: /* RANGE_SIZE */
        *(size_t *)data = known ? (size_t)a->size : 0;
        return CUDA_SUCCESS;
    case 13: /* MAPPED */
        *(int *)data = known;
        return CUDA_SUCCESS;
    case 17: /* MEMPOOL_HANDLE */
        *(CUmemoryPool *)data = known ? a->pool : NULL;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    CHECK_INIT("cuPointerGetAttribute");
    struct alloc a;
    if (data == NULL || !find_alloc(p, &a))
        return CUDA_ERROR_INVALID_VALUE;
    return pointer_attr(data, attr, p, &a, 1);
}

/* Unlike cuPointerGetAttribute, memory CUDA does not know is not an error: every
 * attribute gets its empty value. */
EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr p)
{
    CHECK_INIT("cuPointerGetAttributes");
    if (attrs == NULL || data == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct alloc a;
    int known = find_alloc(p, &a);
    for (unsigned i = 0; i < n; i++) {
        if (data[i] == NULL)
            return CUDA_ERROR_INVALID_VALUE;
        CUresult rc = pointer_attr(data[i], attrs[i], p, &a, known);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    CHECK_INIT("cuMemCreate");
    if (handle == NULL || prop == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = take_memory(dev, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t h = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED) | (1ull << 62);
    if (put_alloc_rec((struct alloc){h, size, dev, 0, CU_DEVICE_INVALID, 0, 0, NULL, 1, 0, 0}) != 0) {
        give_memory(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = h;
    return CUDA_SUCCESS;
}

/* A cuMemCreate allocation; call with mu held. */
static struct alloc *vmm_handle(uint64_t h)
{
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].key == h && allocs[i].vmm)
            return &allocs[i];
    return NULL;
}

/* The physical memory goes when the handle is released and nothing maps it. */
static void vmm_free_if_unused(struct alloc *a)
{
    if (!a->released || a->maps != 0)
        return;
    int dev = a->dev;
    uint64_t size = a->size;
    *a = allocs[--n_allocs];
    give_memory(dev, size);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CHECK_INIT("cuMemRelease");
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    struct alloc *a = vmm_handle(handle);
    if (a == NULL || a->released)
        rc = CUDA_ERROR_INVALID_VALUE;
    else {
        a->released = 1;
        vmm_free_if_unused(a);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static int vrange_push(struct vrange **v, size_t *n, struct vrange r)
{
    struct vrange *x = realloc(*v, (*n + 1) * sizeof *x);
    if (x == NULL)
        return -1;
    x[(*n)++] = r;
    *v = x;
    return 0;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    (void)alignment, (void)addr;
    CHECK_INIT("cuMemAddressReserve");
    if (ptr == NULL || size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a = new_address(size);
    pthread_mutex_lock(&mu);
    int rc = vrange_push(&vres, &n_vres, (struct vrange){a, size, 0});
    pthread_mutex_unlock(&mu);
    if (rc != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CHECK_INIT("cuMemAddressFree");
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_vres; i++) {
        if (vres[i].ptr != ptr || vres[i].size != size)
            continue;
        rc = CUDA_SUCCESS;
        for (size_t j = 0; j < n_vmaps; j++)
            if (vmaps[j].ptr >= ptr && vmaps[j].ptr - ptr < size)
                rc = CUDA_ERROR_INVALID_VALUE; /* still mapped */
        if (rc == CUDA_SUCCESS)
            vres[i] = vres[--n_vres];
        break;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Maps a whole handle (offset 0, as the driver requires) into a reserved range. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CHECK_INIT("cuMemMap");
    if (offset != 0 || flags != 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = vmm_handle(handle);
    int inside = 0;
    for (size_t i = 0; i < n_vres; i++)
        if (ptr >= vres[i].ptr && size <= vres[i].size && ptr - vres[i].ptr <= vres[i].size - size)
            inside = 1;
    for (size_t j = 0; j < n_vmaps; j++)
        if (ptr < vmaps[j].ptr + vmaps[j].size && vmaps[j].ptr < ptr + size)
            inside = 0; /* overlaps a mapping */
    if (a != NULL && !a->released && size <= a->size && inside) {
        if (vrange_push(&vmaps, &n_vmaps, (struct vrange){ptr, size, handle}) == 0) {
            a->maps++;
            rc = CUDA_SUCCESS;
        } else {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Unmaps every mapping inside the range; a released handle whose last mapping
 * goes frees its memory. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CHECK_INIT("cuMemUnmap");
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (size_t j = n_vmaps; j-- > 0;) {
        struct vrange m = vmaps[j];
        if (m.ptr < ptr || m.ptr - ptr >= size || m.size > size - (m.ptr - ptr))
            continue;
        vmaps[j] = vmaps[--n_vmaps];
        rc = CUDA_SUCCESS;
        struct alloc *a = vmm_handle(m.handle);
        if (a != NULL && a->maps > 0) {
            a->maps--;
            vmm_free_if_unused(a);
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static uint64_t elem_bytes(CUarray_format f)
{
    return f == 0x01 || f == 0x08 ? 1 : f == 0x02 || f == 0x09 || f == 0x10 ? 2 : 4;
}

static CUresult array_alloc(uint64_t size, uint64_t *key)
{
    int dev;
    CUresult rc = need_ctx(&dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    size = (size + 511) / 512 * 512;
    if ((rc = take_memory(dev, size)) != CUDA_SUCCESS)
        return rc;
    struct CUarray_st *a = calloc(1, sizeof *a);
    a->size = size;
    a->dev = dev;
    put_alloc((uint64_t)(uintptr_t)a, size, dev);
    *key = (uint64_t)(uintptr_t)a;
    return CUDA_SUCCESS;
}

static uint64_t d1(size_t v) { return v ? v : 1; }

EXPORT CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CHECK_INIT("cuArrayCreate_v2");
    if (h == NULL || d == NULL || d->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t k;
    CUresult rc = array_alloc(d1(d->Width) * d1(d->Height) * d1(d->NumChannels) *
                              elem_bytes(d->Format), &k);
    if (rc == CUDA_SUCCESS)
        *h = (CUarray)(uintptr_t)k;
    return rc;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CHECK_INIT("cuArray3DCreate_v2");
    if (h == NULL || d == NULL || d->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t k;
    CUresult rc = array_alloc(d1(d->Width) * d1(d->Height) * d1(d->Depth) * d1(d->NumChannels) *
                              elem_bytes(d->Format), &k);
    if (rc == CUDA_SUCCESS)
        *h = (CUarray)(uintptr_t)k;
    return rc;
}

EXPORT CUresult cuArrayDestroy(CUarray a)
{
    CHECK_INIT("cuArrayDestroy");
    CUresult rc = free_key((uint64_t)(uintptr_t)a);
    if (rc == CUDA_SUCCESS)
        free(a);
    return rc;
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels)
{
    CHECK_INIT("cuMipmappedArrayCreate");
    if (h == NULL || d == NULL || d->Width == 0 || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0, k;
    for (unsigned l = 0; l < levels && l < 64; l++)
        total += d1(d->Width >> l) * (d->Height ? d1(d->Height >> l) : 1) *
                 (d->Depth ? d1(d->Depth >> l) : 1) * d1(d->NumChannels) * elem_bytes(d->Format);
    CUresult rc = array_alloc(total, &k);
    if (rc == CUDA_SUCCESS)
        *h = (CUmipmappedArray)(uintptr_t)k;
    return rc;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    CHECK_INIT("cuMipmappedArrayDestroy");
    CUresult rc = free_key((uint64_t)(uintptr_t)a);
    if (rc == CUDA_SUCCESS)
        free(a);
    return rc;
}

/* ---- modules and kernels ---- */

EXPORT CUresult cuModuleLoad(CUmodule *m, const char *path)
{
    CHECK_INIT("cuModuleLoad");
    (void)path;
    *m = calloc(1, sizeof(struct CUmod_st));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    return cuModuleLoad(m, image);
}

EXPORT CUresult cuModuleUnload(CUmodule m)
{
    CHECK_INIT("cuModuleUnload");
    free(m);
    return CUDA_SUCCESS;
}

/* "name_<N>us" runs N microseconds; other names run default_kernel_us. */
/* "local<bytes>" in a kernel's name: the local memory each of its threads needs. */
static uint64_t kernel_local_bytes(const char *name)
{
    const char *p = strstr(name, "local");
    uint64_t v = 0;
    for (p = p ? p + 5 : ""; *p >= '0' && *p <= '9' && v < UINT64_MAX / 100; p++)
        v = v * 10 + (uint64_t)(*p - '0');
    return v;
}

static uint64_t kernel_ns(const char *name)
{
    uint64_t us = cfg()->default_kernel_us;
    size_t n = strlen(name);
    const char *u = strrchr(name, '_');
    if (u != NULL && n >= 3 && strcmp(name + n - 2, "us") == 0 && u + 1 < name + n - 2) {
        uint64_t v = 0;
        const char *p = u + 1;
        for (; p < name + n - 2 && *p >= '0' && *p <= '9' && v < UINT64_MAX / 10000; p++)
            v = v * 10 + (uint64_t)(*p - '0');
        if (p == name + n - 2)
            us = v;
    }
    return us * 1000;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    CHECK_INIT("cuModuleGetFunction");
    if (f == NULL || m == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *fn = calloc(1, sizeof *fn);
    if (fn == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fn->dur_ns = kernel_ns(name);
    fn->local_bytes = kernel_local_bytes(name);
    *f = fn;
    return CUDA_SUCCESS;
}

/* Function attributes of the double's kernels: their local memory
 * (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES), 1024 threads per block, 32 registers. */
EXPORT CUresult cuFuncGetAttribute(int *value, int attrib, CUfunction f)
{
    CHECK_INIT("cuFuncGetAttribute");
    if (value == NULL || f == NULL || attrib < 0)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case 0: *value = 1024; break;
    case 3: *value = f->local_bytes > INT32_MAX ? INT32_MAX : (int)f->local_bytes; break;
    case 4: *value = 32; break;
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

/* ---- context-independent loading (12.0): libraries and their kernels ----
 * A CUkernel is a function of the library that any context may launch: the driver
 * lets a program cast it to CUfunction, so here it is one. A library owns its kernels
 * (unloading it frees them) and hands the same kernel for the same name. */
#define LIB_KERNELS 256
struct CUlib_st { struct CUmod_st mod; size_t n; char *names[LIB_KERNELS];
                  struct CUfunc_st *kernels[LIB_KERNELS]; };
typedef struct CUlib_st *CUlibrary;
typedef struct CUfunc_st *CUkernel;

static CUresult library_new(CUlibrary *lib)
{
    if (lib == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *lib = calloc(1, sizeof **lib);
    return *lib ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jit_opts,
                                  void **jit_vals, unsigned n_jit, void *lib_opts,
                                  void **lib_vals, unsigned n_lib)
{
    (void)jit_opts, (void)jit_vals, (void)n_jit, (void)lib_opts, (void)lib_vals, (void)n_lib;
    CHECK_INIT("cuLibraryLoadData");
    if (code == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return library_new(lib);
}

EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jit_opts,
                                      void **jit_vals, unsigned n_jit, void *lib_opts,
                                      void **lib_vals, unsigned n_lib)
{
    (void)jit_opts, (void)jit_vals, (void)n_jit, (void)lib_opts, (void)lib_vals, (void)n_lib;
    CHECK_INIT("cuLibraryLoadFromFile");
    if (path == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return CUDA_ERROR_FILE_NOT_FOUND;
    fclose(f);
    return library_new(lib);
}

EXPORT CUresult cuLibraryUnload(CUlibrary lib)
{
    CHECK_INIT("cuLibraryUnload");
    if (lib == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < lib->n; i++) {
        free(lib->names[i]);
        free(lib->kernels[i]);
    }
    free(lib);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name)
{
    CHECK_INIT("cuLibraryGetKernel");
    if (k == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (lib == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_SUCCESS;
    size_t i = 0;
    while (i < lib->n && strcmp(lib->names[i], name) != 0)
        i++;
    if (i == lib->n) {
        struct CUfunc_st *fn = calloc(1, sizeof *fn);
        char *copy = strdup(name);
        if (lib->n == LIB_KERNELS || fn == NULL || copy == NULL) {
            free(fn);
            free(copy);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            fn->dur_ns = kernel_ns(name);
            fn->local_bytes = kernel_local_bytes(name);
            lib->names[i] = copy;
            lib->kernels[i] = fn;
            lib->n++;
        }
    }
    if (rc == CUDA_SUCCESS)
        *k = lib->kernels[i];
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUresult cuLibraryGetKernelCount(unsigned *count, CUlibrary lib)
{
    CHECK_INIT("cuLibraryGetKernelCount");
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (lib == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    *count = (unsigned)lib->n;
    return CUDA_SUCCESS;
}

/* The kernel's function in the current context. */
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
    CHECK_INIT("cuKernelGetFunction");
    if (f == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (k == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *f = k;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary lib)
{
    CHECK_INIT("cuLibraryGetModule");
    if (m == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (lib == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *m = &lib->mod;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **p,
                               void **e)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)p, (void)e;
    CHECK_INIT("cuLaunchKernel");
    return launch(f, s, 0);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                    CUstream s, void **p, void **e)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)p, (void)e;
    CHECK_INIT("cuLaunchKernel_ptsz");
    return launch(f, s, 0);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)p, (void)e;
    CHECK_INIT("cuLaunchKernelEx");
    return c ? launch(f, c->hStream, 0) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)p, (void)e;
    CHECK_INIT("cuLaunchKernelEx_ptsz");
    return c ? launch(f, c->hStream, 0) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                          CUstream s, void **p)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)p;
    CHECK_INIT("cuLaunchCooperativeKernel");
    return launch(f, s, 0);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                               unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                               unsigned shm, CUstream s, void **p)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)p;
    CHECK_INIT("cuLaunchCooperativeKernel_ptsz");
    return launch(f, s, 0);
}

/* ---- graphs: a graph runs for the sum of its kernel nodes ---- */

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    (void)flags;
    CHECK_INIT("cuGraphCreate");
    *g = calloc(1, sizeof(struct CUgraph_st));
    return CUDA_SUCCESS;
}

static CUgraphNode add_node(CUgraph g, int type, uint64_t bytes, int dev)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    struct CUgraphNode_st **v = realloc(g->nodes, (g->n_nodes + 1) * sizeof *v);
    if (n == NULL || v == NULL) {
        free(n);
        if (v != NULL)
            g->nodes = v;
        return NULL;
    }
    *n = (struct CUgraphNode_st){type, bytes, dev, 0, 0, NULL};
    g->nodes = v;
    g->nodes[g->n_nodes++] = n;
    return n;
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *count)
{
    CHECK_INIT("cuGraphGetNodes");
    if (g == NULL || count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes != NULL) {
        size_t k = *count < g->n_nodes ? *count : g->n_nodes;
        for (size_t i = 0; i < k; i++)
            nodes[i] = g->nodes[i];
        *count = k;
    } else {
        *count = g->n_nodes;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, int *type)
{
    CHECK_INIT("cuGraphNodeGetType");
    if (node == NULL || type == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *type = node->type;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    CHECK_INIT("cuGraphMemAllocNodeGetParams");
    if (node == NULL || params == NULL || node->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    memset(params, 0, sizeof *params);
    params->poolProps.allocType = 1;
    params->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params->poolProps.location.id = node->dev;
    params->bytesize = node->bytes;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                        size_t n, const CUDA_KERNEL_NODE_PARAMS *params)
{
    (void)deps, (void)n;
    CHECK_INIT("cuGraphAddKernelNode_v2");
    if (g == NULL || params == NULL || params->func == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraphNode n_ = add_node(g, CU_GRAPH_NODE_TYPE_KERNEL, 0, 0);
    if (n_ == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n_->func = params->func;
    g->dur_ns += params->func->dur_ns;
    if (params->func->local_bytes > g->local_bytes)
        g->local_bytes = params->func->local_bytes;
    if (node)
        *node = n_;
    return CUDA_SUCCESS;
}

/* A child graph node (cuGraphAddNode, CU_GRAPH_NODE_TYPE_GRAPH). Cloned, the child may not
 * hold memory nodes; moved (12.9), it may, and the parent owns it: its allocations are the
 * parent's (one device per graph, as for the double's other graphs). */
static CUresult add_child_graph(CUgraphNode *node, CUgraph g, const CUgraphNodeParams *params)
{
    CUgraph c = params->graph.graph;
    int move = params->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
    int clone = params->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE;
    if (c == NULL || c == g || (!move && !clone))
        return CUDA_ERROR_INVALID_VALUE;
    if (c->mem_bytes && (!move || (g->mem_bytes && g->mem_dev != c->mem_dev)))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *owned = c;
    if (!move) {
        /* the double's kernel nodes carry only their time and function: a clone is those */
        if ((owned = calloc(1, sizeof *owned)) == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        owned->dur_ns = c->dur_ns;
        owned->local_bytes = c->local_bytes;
        for (size_t i = 0; i < c->n_nodes; i++) {
            CUgraphNode k = c->nodes[i]->type == CU_GRAPH_NODE_TYPE_KERNEL
                                ? add_node(owned, CU_GRAPH_NODE_TYPE_KERNEL, 0, 0)
                                : NULL;
            if (k != NULL)
                k->func = c->nodes[i]->func;
        }
    }
    CUgraphNode n_ = add_node(g, CU_GRAPH_NODE_TYPE_GRAPH, 0, c->mem_dev);
    if (n_ == NULL) {
        if (!move)
            free(owned);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n_->child = owned;
    g->dur_ns += owned->dur_ns;
    if (owned->local_bytes > g->local_bytes)
        g->local_bytes = owned->local_bytes;
    if (owned->mem_bytes) {
        g->mem_bytes += owned->mem_bytes;
        g->mem_dev = owned->mem_dev;
    }
    if (node)
        *node = n_;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                               CUgraphNodeParams *params)
{
    (void)deps, (void)n;
    CHECK_INIT("cuGraphAddNode");
    if (g == NULL || params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (params->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_NOT_SUPPORTED; /* the double adds child graphs this way only */
    return add_child_graph(node, g, params);
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                  const void *edges, size_t n, CUgraphNodeParams *params)
{
    (void)edges;
    return cuGraphAddNode(node, g, deps, n, params);
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *child)
{
    CHECK_INIT("cuGraphChildGraphNodeGetGraph");
    if (node == NULL || child == NULL || node->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *child = node->child;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                     size_t n, const CUDA_KERNEL_NODE_PARAMS *params)
{
    return cuGraphAddKernelNode_v2(node, g, deps, n, params);
}

EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
    CHECK_INIT("cuGraphKernelNodeGetParams_v2");
    if (node == NULL || params == NULL || node->type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(params, 0, sizeof *params);
    params->func = node->func;
    return CUDA_SUCCESS;
}

/* A memory allocation node: its memory is virtual until an exec of the graph is uploaded
 * or launched; then the device's graph pool backs it with physical memory. */
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    (void)deps, (void)n;
    CHECK_INIT("cuGraphAddMemAllocNode");
    if (g == NULL || params == NULL || params->bytesize == 0 ||
        params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_dev(params->poolProps.location.id) ||
        (g->mem_bytes && g->mem_dev != params->poolProps.location.id))
        return CUDA_ERROR_INVALID_VALUE; /* the double keeps one device per graph */
    CUgraphNode n_ = add_node(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, params->bytesize,
                              params->poolProps.location.id);
    if (n_ == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->mem_bytes += params->bytesize;
    g->mem_dev = params->poolProps.location.id;
    params->dptr = n_->dptr = new_address(params->bytesize);
    if (node)
        *node = n_;
    return CUDA_SUCCESS;
}

/* A free node for one of the graph's own allocations: after a launch its memory is the
 * pool's again. An allocation no node frees stays allocated after the exec is gone (the
 * driver's graph pool keeps it through cuDeviceGraphMemTrim: seen on an H200). */
static CUresult graph_free_node(CUgraph g, CUdeviceptr dptr, CUgraphNode *node)
{
    struct CUgraphNode_st *a = NULL;
    for (size_t i = 0; i < g->n_nodes && a == NULL; i++)
        if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && g->nodes[i]->dptr == dptr &&
            !g->nodes[i]->freed)
            a = g->nodes[i];
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE; /* the double frees only the graph's own */
    CUgraphNode n_ = add_node(g, CU_GRAPH_NODE_TYPE_MEM_FREE, 0, a->dev);
    if (n_ == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->freed = 1;
    if (node)
        *node = n_;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                      size_t n, CUdeviceptr dptr)
{
    (void)deps, (void)n;
    CHECK_INIT("cuGraphAddMemFreeNode");
    return g == NULL ? CUDA_ERROR_INVALID_VALUE : graph_free_node(g, dptr, node);
}

/* Physical memory for an exec's allocations: what the graph pool has free is reused,
 * the rest taken from the device; it stays in the pool until cuDeviceGraphMemTrim. */
static CUresult graph_take_locked(int d, uint64_t n)
{
    uint64_t idle = graph_reserved[d] - graph_used[d];
    uint64_t more = n > idle ? n - idle : 0;
    CUresult rc = more ? take_memory(d, more) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        graph_reserved[d] += more;
        graph_used[d] += n;
    }
    return rc;
}

static uint64_t unfreed_bytes(const struct CUgraphExec_st *x)
{
    uint64_t n = 0;
    for (size_t i = 0; i < x->n_unfreed; i++)
        n += x->unfreed[i].bytes;
    return n;
}

static CUresult graph_back(struct CUgraphExec_st *x)
{
    if (x->backed || x->mem_bytes == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&pool_mu);
    CUresult rc = graph_take_locked(x->mem_dev, x->mem_bytes);
    x->backed |= rc == CUDA_SUCCESS;
    pthread_mutex_unlock(&pool_mu);
    return rc;
}

/* A run makes the exec's unfreed allocations: live until the program frees them. A
 * later run needs them freed first (CUDA_ERROR_INVALID_VALUE otherwise, seen on an
 * H200), and takes their memory from the pool again. Call with pool_mu held. */
static CUresult graph_allocate_locked(struct CUgraphExec_st *x)
{
    if (x->n_unfreed == 0)
        return CUDA_SUCCESS;
    if (x->outstanding > 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (n_graph_live + x->n_unfreed > GRAPH_LIVE_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (x->launched) {
        CUresult rc = graph_take_locked(x->mem_dev, unfreed_bytes(x));
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    for (size_t i = 0; i < x->n_unfreed; i++)
        graph_live[n_graph_live++] =
            (struct graph_live){x->unfreed[i].dptr, x->unfreed[i].bytes, x->mem_dev, x};
    x->outstanding = x->n_unfreed;
    return CUDA_SUCCESS;
}

/* Nodes of g and of its child graphs. */
static size_t count_nodes(const struct CUgraph_st *g)
{
    size_t n = g->n_nodes;
    for (size_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->child != NULL)
            n += count_nodes(g->nodes[i]->child);
    return n;
}

static void collect_unfreed(const struct CUgraph_st *g, struct CUgraphExec_st *x)
{
    for (size_t i = 0; i < g->n_nodes; i++) {
        const struct CUgraphNode_st *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && !n->freed)
            x->unfreed[x->n_unfreed++] = (struct unfreed_alloc){n->dptr, n->bytes};
        else if (n->child != NULL)
            collect_unfreed(n->child, x);
    }
}

static CUresult instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    if (e == NULL || g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    x->dur_ns = g->dur_ns;
    x->mem_bytes = g->mem_bytes;
    x->mem_dev = g->mem_dev;
    x->local_bytes = g->local_bytes;
    x->unfreed = calloc(count_nodes(g) + 1, sizeof *x->unfreed);
    if (x->unfreed == NULL) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    collect_unfreed(g, x);
    CUresult rc = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) ? graph_back(x) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) {
        free(x->unfreed);
        free(x);
        return rc;
    }
    *e = x;
    return CUDA_SUCCESS;
}

/* The upload flag is for cuGraphInstantiateWithParams only (it names the upload stream);
 * here the driver refuses it (seen on an H200). */
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    CHECK_INIT("cuGraphInstantiateWithFlags");
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
        return CUDA_ERROR_INVALID_VALUE;
    return instantiate(e, g, flags);
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    CHECK_INIT("cuGraphInstantiateWithParams");
    if (params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = instantiate(e, g, params->flags);
    params->result_out = rc == CUDA_SUCCESS ? 0 : 1;
    return rc;
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return cuGraphInstantiateWithParams(e, g, params);
}

/* The pre-12.0 forms, still exported: no flags, an error node and log buffer. */
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                      size_t logsize)
{
    if (err)
        *err = NULL;
    if (log && logsize)
        log[0] = '\0';
    return cuGraphInstantiateWithFlags(e, g, 0);
}

EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                   size_t logsize)
{
    return cuGraphInstantiate_v2(e, g, err, log, logsize);
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
    (void)s;
    CHECK_INIT("cuGraphUpload");
    return e ? graph_back(e) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s)
{
    (void)s;
    CHECK_INIT("cuGraphUpload_ptsz");
    return e ? graph_back(e) : CUDA_ERROR_INVALID_VALUE;
}

static CUresult graph_launch(CUgraphExec e, CUstream s)
{
    if (e == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (e->launched && e->outstanding > 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = graph_back(e);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&pool_mu);
        rc = graph_allocate_locked(e);
        pthread_mutex_unlock(&pool_mu);
    }
    /* Its kernels raise the context's stack as launched ones do (launch). */
    int dev;
    if (rc == CUDA_SUCCESS && e->local_bytes > 0 && (rc = need_ctx(&dev)) == CUDA_SUCCESS &&
        e->local_bytes > ctx_limit(cur_ctx, 0))
        rc = set_limit(cur_ctx, 0, e->local_bytes);
    if (rc == CUDA_SUCCESS)
        rc = launch(NULL, s, e->dur_ns);
    e->launched |= rc == CUDA_SUCCESS;
    return rc;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    CHECK_INIT("cuGraphLaunch");
    return graph_launch(e, s);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
    CHECK_INIT("cuGraphLaunch_ptsz");
    return graph_launch(e, s);
}

/* The exec's memory goes back to the graph pool, which keeps it reserved; allocations
 * a run made and no node freed stay allocated. */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    if (e == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    /* what its free nodes free, and the rest too if no run ever allocated it */
    if (e->backed)
        graph_used[e->mem_dev] -= e->mem_bytes - (e->launched ? unfreed_bytes(e) : 0);
    for (size_t i = 0; i < n_graph_live; i++)
        if (graph_live[i].exec == e)
            graph_live[i].exec = NULL;
    pthread_mutex_unlock(&pool_mu);
    free(e->unfreed);
    free(e);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    if (g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i]->child != NULL)
            cuGraphDestroy(g->nodes[i]->child);
        free(g->nodes[i]);
    }
    free(g->nodes);
    free(g);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    CHECK_INIT("cuDeviceGraphMemTrim");
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&pool_mu);
    if (graph_reserved[dev] > graph_used[dev]) {
        give_memory(dev, graph_reserved[dev] - graph_used[dev]);
        graph_reserved[dev] = graph_used[dev];
    }
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    CHECK_INIT("cuDeviceGetGraphMemAttribute");
    if (!valid_dev(dev) || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pool_mu);
    if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
        *(cuuint64_t *)value = graph_reserved[dev];
    else if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
        *(cuuint64_t *)value = graph_used[dev];
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pool_mu);
    return rc;
}

/* ---- streams and events ---- */

/* Stream priorities of an sm_80 GPU: 0 (least) to -5 (greatest); requests outside the
 * range are clamped, as the driver does. */
#define PRIORITY_LEAST 0
#define PRIORITY_GREATEST (-5)
static unsigned long long next_stream_id = 1;

static CUresult stream_create(CUstream *s, unsigned int flags, int priority)
{
    int dev;
    CUresult rc = need_ctx(&dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (s == NULL || flags > 1) /* CU_STREAM_DEFAULT 0, CU_STREAM_NON_BLOCKING 1 */
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = calloc(1, sizeof *st);
    if (st == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    st->dev = dev;
    st->ctx = cur_ctx;
    st->flags = flags;
    st->priority = priority > PRIORITY_LEAST       ? PRIORITY_LEAST
                   : priority < PRIORITY_GREATEST ? PRIORITY_GREATEST
                                                  : priority;
    st->id = __atomic_fetch_add(&next_stream_id, 1, __ATOMIC_RELAXED);
    pthread_mutex_init(&st->mu, NULL);
    *s = st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    CHECK_INIT("cuStreamCreate");
    return stream_create(s, flags, PRIORITY_LEAST);
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority)
{
    CHECK_INIT("cuStreamCreateWithPriority");
    return stream_create(s, flags, priority);
}

EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CHECK_INIT("cuCtxGetStreamPriorityRange");
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (least)
        *least = PRIORITY_LEAST;
    if (greatest)
        *greatest = PRIORITY_GREATEST;
    return CUDA_SUCCESS;
}

static int builtin_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

#define STREAM_GETTER(name, type, field, builtin_value)                                          \
    EXPORT CUresult name(CUstream s, type *out)                                                  \
    {                                                                                            \
        CHECK_INIT(#name);                                                                       \
        if (out == NULL)                                                                         \
            return CUDA_ERROR_INVALID_VALUE;                                                     \
        if (stream_of(s) == NULL)                                                                \
            return CUDA_ERROR_INVALID_CONTEXT;                                                   \
        *out = builtin_stream(s) ? (builtin_value) : s->field;                                   \
        return CUDA_SUCCESS;                                                                     \
    }                                                                                            \
    EXPORT CUresult name##_ptsz(CUstream s, type *out) { return name(s, out); }
/* the built-in streams: default priority and flags; ids 0 (legacy) and 1 (per-thread) */
STREAM_GETTER(cuStreamGetPriority, int, priority, PRIORITY_LEAST)
STREAM_GETTER(cuStreamGetFlags, unsigned int, flags, 0)
STREAM_GETTER(cuStreamGetId, unsigned long long, id, s == CU_STREAM_PER_THREAD ? 1 : 0)

/* Work submitted to the stream after this starts no earlier than the event's point on
 * its device's timeline (an event recorded on another GPU included). An event never
 * recorded is complete: nothing to wait for, as with the driver. */
static CUresult stream_wait_event(CUstream s, CUevent e, unsigned flags)
{
    struct CUstream_st *st = stream_of(s);
    if (st == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (e == NULL || (e->ctx != NULL && e->ctx->destroyed))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags > 1) /* CU_EVENT_WAIT_DEFAULT 0, CU_EVENT_WAIT_EXTERNAL 1 */
        return CUDA_ERROR_INVALID_VALUE;
    if (!e->recorded)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&st->mu);
    if (__atomic_load_n(&st->tail, __ATOMIC_ACQUIRE) < e->ts)
        __atomic_store_n(&st->tail, e->ts, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&st->mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    CHECK_INIT("cuStreamWaitEvent");
    return stream_wait_event(s, e, flags);
}

EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags)
{
    CHECK_INIT("cuStreamWaitEvent_ptsz");
    return stream_wait_event(s, e, flags);
}

/* CUDA_ERROR_NOT_READY while work submitted to the stream is still on the timeline. */
static CUresult stream_query(CUstream s)
{
    struct CUstream_st *st = stream_of(s);
    if (st == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    return fake_now_ns() >= __atomic_load_n(&st->tail, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS
                                                                          : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuStreamQuery(CUstream s)
{
    CHECK_INIT("cuStreamQuery");
    return stream_query(s);
}

EXPORT CUresult cuStreamQuery_ptsz(CUstream s)
{
    CHECK_INIT("cuStreamQuery_ptsz");
    return stream_query(s);
}

static unsigned long long next_capture_id = 1;

static CUresult begin_capture(CUstream s)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || s->capture != NULL)
        return CUDA_ERROR_INVALID_VALUE; /* the double captures created streams only */
    s->capture = calloc(1, sizeof *s->capture);
    if (s->capture == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->capture_id = __atomic_fetch_add(&next_capture_id, 1, __ATOMIC_RELAXED);
    s->capture_last = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
    (void)mode;
    CHECK_INIT("cuStreamBeginCapture_v2");
    return begin_capture(s);
}

EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s, int mode)
{
    (void)mode;
    CHECK_INIT("cuStreamBeginCapture_ptsz");
    return begin_capture(s);
}

/* CUDA 10.0's form, before capture modes: global mode. */
EXPORT CUresult cuStreamBeginCapture(CUstream s)
{
    CHECK_INIT("cuStreamBeginCapture");
    return begin_capture(s);
}

/* What every cuStreamGetCaptureInfo variant reports: status and id; the graph being
 * built and the nodes the next captured operation will depend on (_v2); their edge
 * data, all default (_v3). */
static CUresult capture_info(CUstream s, int *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const void **edges, size_t *n_deps)
{
    if (stream_of(s) == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (status == NULL || (edges != NULL && deps == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    int capturing = !builtin_stream(s) && s->capture != NULL;
    *status = capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (!capturing)
        return CUDA_SUCCESS; /* the other outputs are left as they were, like the driver */
    if (id)
        *id = s->capture_id;
    if (graph)
        *graph = s->capture;
    size_t n = s->capture_last != NULL;
    if (deps)
        *deps = n ? (const CUgraphNode *)&s->capture_last : NULL;
    if (edges) {
        memset(s->edge_data, 0, sizeof s->edge_data);
        *edges = n ? s->edge_data : NULL;
    }
    if (n_deps)
        *n_deps = n;
    return CUDA_SUCCESS;
}

#define CAPTURE_INFO_FNS(name, params, args)                                                     \
    EXPORT CUresult name params                                                                  \
    {                                                                                            \
        CHECK_INIT(#name);                                                                       \
        return capture_info args;                                                                \
    }
CAPTURE_INFO_FNS(cuStreamGetCaptureInfo, (CUstream s, int *st, cuuint64_t *id),
                 (s, st, id, NULL, NULL, NULL, NULL))
CAPTURE_INFO_FNS(cuStreamGetCaptureInfo_ptsz, (CUstream s, int *st, cuuint64_t *id),
                 (s, st, id, NULL, NULL, NULL, NULL))
CAPTURE_INFO_FNS(cuStreamGetCaptureInfo_v2,
                 (CUstream s, int *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
                  size_t *n),
                 (s, st, id, g, deps, NULL, n))
CAPTURE_INFO_FNS(cuStreamGetCaptureInfo_v2_ptsz,
                 (CUstream s, int *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
                  size_t *n),
                 (s, st, id, g, deps, NULL, n))
CAPTURE_INFO_FNS(cuStreamGetCaptureInfo_v3,
                 (CUstream s, int *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
                  const void **edges, size_t *n),
                 (s, st, id, g, deps, edges, n))
CAPTURE_INFO_FNS(cuStreamGetCaptureInfo_v3_ptsz,
                 (CUstream s, int *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
                  const void **edges, size_t *n),
                 (s, st, id, g, deps, edges, n))

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    CHECK_INIT("cuStreamEndCapture");
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || s->capture == NULL ||
        graph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = s->capture;
    s->capture = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status)
{
    CHECK_INIT("cuStreamIsCapturing");
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int capturing = s != NULL && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD &&
                    s->capture != NULL;
    *status = capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    CHECK_INIT("cuStreamDestroy_v2");
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    free(s);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s)
{
    struct CUstream_st *st = stream_of(s);
    if (st == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    sleep_until(__atomic_load_n(&st->tail, __ATOMIC_ACQUIRE));
    pools_synchronised();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    CHECK_INIT("cuStreamSynchronize");
    return stream_sync(s);
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
    CHECK_INIT("cuStreamSynchronize_ptsz");
    return stream_sync(s);
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    CHECK_INIT("cuEventCreate");
    *e = calloc(1, sizeof(struct CUevent_st));
    if (*e)
        (*e)->ctx = cur_ctx;
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    CHECK_INIT("cuEventDestroy_v2");
    free(e);
    return CUDA_SUCCESS;
}

static int event_dead(CUevent e);

static CUresult event_record(CUevent e, CUstream s)
{
    if (event_dead(e))
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st = stream_of(s);
    if (st == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    /* like the driver: the event and the stream must belong to one context */
    struct CUctx_st *sctx = st->ctx ? st->ctx : cur_ctx;
    if (e->ctx != NULL && sctx != NULL && e->ctx != sctx)
        return CUDA_ERROR_INVALID_HANDLE;
    e->ts = submit(st, 0);
    e->recorded = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    CHECK_INIT("cuEventRecord");
    return event_record(e, s);
}

EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s)
{
    CHECK_INIT("cuEventRecord_ptsz");
    return event_record(e, s);
}

/* An event dies with the context it was created in. */
static int event_dead(CUevent e)
{
    return e == NULL || (e->ctx != NULL && e->ctx->destroyed);
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    CHECK_INIT("cuEventQuery");
    if (event_dead(e))
        return CUDA_ERROR_INVALID_HANDLE;
    return !e->recorded || fake_now_ns() >= e->ts ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    CHECK_INIT("cuEventSynchronize");
    if (event_dead(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded)
        sleep_until(e->ts);
    pools_synchronised();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    CHECK_INIT("cuEventElapsedTime");
    if (ms == NULL || event_dead(start) || event_dead(end) || !start->recorded || !end->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = fake_now_ns();
    if (now < start->ts || now < end->ts)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(end->ts - start->ts)) / 1e6);
    return CUDA_SUCCESS;
}

/* The driver's name and description of each error this double returns. */
static const struct { CUresult code; const char *name, *text; } error_names[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
};

static CUresult error_lookup(CUresult e, const char **s, int name)
{
    if (s == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++)
        if (error_names[i].code == e) {
            *s = name ? error_names[i].name : error_names[i].text;
            return CUDA_SUCCESS;
        }
    *s = NULL; /* the driver's answer for a code it does not know */
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) { return error_lookup(e, s, 0); }

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) { return error_lookup(e, s, 1); }

/* ---- launch entry points beyond cuLaunchKernel: deprecated, multi-device, and
 * the context stack they need (cuStreamGetCtx, cuCtxPush/PopCurrent) ---- */

#define CTX_STACK 16
static __thread struct CUctx_st *ctx_stack[CTX_STACK];
static __thread unsigned ctx_depth;

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CHECK_INIT("cuCtxPushCurrent_v2");
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = cur_ctx;
    cur_ctx = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CHECK_INIT("cuCtxPopCurrent_v2");
    if (cur_ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = cur_ctx;
    cur_ctx = ctx_depth > 0 ? ctx_stack[--ctx_depth] : NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    CHECK_INIT("cuStreamGetCtx");
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        if (cur_ctx == NULL)
            return CUDA_ERROR_INVALID_CONTEXT;
        *pctx = cur_ctx;
        return CUDA_SUCCESS;
    }
    *pctx = s->ctx;
    return s->ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Deprecated since CUDA 3.2 but still exported: the block shape comes from
 * cuFuncSetBlockShape (not simulated: a kernel takes the time in its name). */
EXPORT CUresult cuLaunch(CUfunction f)
{
    CHECK_INIT("cuLaunch");
    return f ? launch(f, NULL, 0) : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
    CHECK_INIT("cuLaunchGrid");
    if (w <= 0 || h <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    return f ? launch(f, NULL, 0) : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s)
{
    CHECK_INIT("cuLaunchGridAsync");
    if (w <= 0 || h <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    return f ? launch(f, s, 0) : CUDA_ERROR_INVALID_HANDLE;
}

/* One kernel per device, each on a created stream of that device (not the NULL
 * stream), no device twice; each runs in its stream's context. */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n,
                                                     unsigned int flags)
{
    (void)flags;
    CHECK_INIT("cuLaunchCooperativeKernelMultiDevice");
    if (list == NULL || n == 0 || n > FAKE_MAX_DEVICES)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned seen = 0;
    for (unsigned i = 0; i < n; i++) {
        CUstream s = list[i].hStream;
        if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || s->ctx == NULL ||
            list[i].function == NULL)
            return CUDA_ERROR_INVALID_HANDLE;
        if (seen & (1u << s->dev))
            return CUDA_ERROR_INVALID_DEVICE;
        seen |= 1u << s->dev;
    }
    struct CUctx_st *saved = cur_ctx;
    CUresult rc = CUDA_SUCCESS;
    for (unsigned i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        cur_ctx = list[i].hStream->ctx;
        rc = launch(list[i].function, list[i].hStream, 0); /* its stack, as a launch raises it */
    }
    cur_ctx = saved;
    return rc;
}

/* ---- cuGetProcAddress: versioned and per-thread-stream resolution ---- */

struct proc { const char *base; int version; int ptds; void *fn; };
#define P(base, ver, fn) {base, ver, 0, (void *)fn}
#define PT(base, ver, fn) {base, ver, 1, (void *)fn}
EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);
static const struct proc procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxCreate", 11040, cuCtxCreate_v3),
    P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags),
    P("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxGetFlags", 7000, cuCtxGetFlags),
    P("cuCtxGetApiVersion", 3020, cuCtxGetApiVersion),
    P("cuCtxGetId", 12000, cuCtxGetId),
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    P("cuDeviceGetByPCIBusId", 4010, cuDeviceGetByPCIBusId),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    P("cuMemAdvise", 8000, cuMemAdvise),
    P("cuMemAdvise", 12020, cuMemAdvise_v2),
    P("cuMemRangeGetAttribute", 8000, cuMemRangeGetAttribute),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemHostRegister", 4000, cuMemHostRegister),
    P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    P("cuMemHostUnregister", 4000, cuMemHostUnregister),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    P("cuMemHostGetFlags", 2030, cuMemHostGetFlags),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    PT("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    PT("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    PT("cuMemcpyDtoD", 7000, cuMemcpyDtoD_v2_ptds),
    P("cuMemcpy", 4000, cuMemcpy),
    PT("cuMemcpy", 7000, cuMemcpy_ptds),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
    PT("cuMemcpyHtoDAsync", 7000, cuMemcpyHtoDAsync_v2_ptsz),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
    PT("cuMemcpyDtoHAsync", 7000, cuMemcpyDtoHAsync_v2_ptsz),
    P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2),
    PT("cuMemcpyDtoDAsync", 7000, cuMemcpyDtoDAsync_v2_ptsz),
    P("cuMemcpyAsync", 4000, cuMemcpyAsync),
    PT("cuMemcpyAsync", 7000, cuMemcpyAsync_ptsz),
    P("cuMemsetD8", 3020, cuMemsetD8_v2),
    PT("cuMemsetD8", 7000, cuMemsetD8_v2_ptds),
    P("cuMemsetD16", 3020, cuMemsetD16_v2),
    PT("cuMemsetD16", 7000, cuMemsetD16_v2_ptds),
    P("cuMemsetD32", 3020, cuMemsetD32_v2),
    PT("cuMemsetD32", 7000, cuMemsetD32_v2_ptds),
    P("cuMemsetD8Async", 3020, cuMemsetD8Async),
    PT("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz),
    P("cuMemsetD16Async", 3020, cuMemsetD16Async),
    PT("cuMemsetD16Async", 7000, cuMemsetD16Async_ptsz),
    P("cuMemsetD32Async", 3020, cuMemsetD32Async),
    PT("cuMemsetD32Async", 7000, cuMemsetD32Async_ptsz),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuCtxSetLimit", 3010, cuCtxSetLimit),
    P("cuCtxGetLimit", 3010, cuCtxGetLimit),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuArrayCreate", 3020, cuArrayCreate_v2),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    P("cuModuleLoad", 2000, cuModuleLoad),
    P("cuModuleLoadData", 2000, cuModuleLoadData),
    P("cuModuleUnload", 2000, cuModuleUnload),
    P("cuModuleGetFunction", 2000, cuModuleGetFunction),
    P("cuFuncGetAttribute", 2020, cuFuncGetAttribute),
    P("cuLibraryLoadData", 12000, cuLibraryLoadData),
    P("cuLibraryLoadFromFile", 12000, cuLibraryLoadFromFile),
    P("cuLibraryUnload", 12000, cuLibraryUnload),
    P("cuLibraryGetKernel", 12000, cuLibraryGetKernel),
    P("cuLibraryGetKernelCount", 12040, cuLibraryGetKernelCount),
    P("cuLibraryGetModule", 12000, cuLibraryGetModule),
    P("cuKernelGetFunction", 12000, cuKernelGetFunction),
    P("cuLaunchKernel", 4000, cuLaunchKernel),
    PT("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    P("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    P("cuGraphKernelNodeGetParams", 12000, cuGraphKernelNodeGetParams_v2),
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphLaunch", 10000, cuGraphLaunch),
    PT("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    P("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    P("cuGraphAddNode", 12020, cuGraphAddNode),
    P("cuGraphAddNode", 12030, cuGraphAddNode_v2),
    P("cuGraphChildGraphNodeGetGraph", 10000, cuGraphChildGraphNodeGetGraph),
    P("cuGraphGetNodes", 10000, cuGraphGetNodes),
    P("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    P("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    P("cuGraphInstantiate", 10000, cuGraphInstantiate),
    P("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    PT("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams_ptsz),
    P("cuGraphUpload", 11010, cuGraphUpload),
    PT("cuGraphUpload", 11010, cuGraphUpload_ptsz),
    P("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    P("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    P("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange),
    P("cuStreamGetPriority", 5050, cuStreamGetPriority),
    PT("cuStreamGetPriority", 7000, cuStreamGetPriority_ptsz),
    P("cuStreamGetFlags", 5050, cuStreamGetFlags),
    PT("cuStreamGetFlags", 7000, cuStreamGetFlags_ptsz),
    P("cuStreamGetId", 12000, cuStreamGetId),
    PT("cuStreamGetId", 12000, cuStreamGetId_ptsz),
    P("cuStreamQuery", 2000, cuStreamQuery),
    P("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
    PT("cuStreamWaitEvent", 7000, cuStreamWaitEvent_ptsz),
    PT("cuStreamQuery", 7000, cuStreamQuery_ptsz),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_ptsz),
    P("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo),
    PT("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo_ptsz),
    P("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2),
    PT("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2_ptsz),
    P("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3),
    PT("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3_ptsz),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    PT("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    P("cuEventCreate", 2000, cuEventCreate),
    P("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuEventRecord", 2000, cuEventRecord),
    PT("cuEventRecord", 7000, cuEventRecord_ptsz),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime),
    /* launch entry points beyond cuLaunchKernel, and the context stack */
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuStreamGetCtx", 9020, cuStreamGetCtx),
    P("cuLaunch", 2000, cuLaunch),
    P("cuLaunchGrid", 2000, cuLaunchGrid),
    P("cuLaunchGridAsync", 2000, cuLaunchGridAsync),
    P("cuLaunchCooperativeKernelMultiDevice", 9000, cuLaunchCooperativeKernelMultiDevice),
};

static CUresult resolve(const char *symbol, void **pfn, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    const struct proc *best = NULL;
    int known = 0;
    int want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (int pass = want_ptds; pass >= 0 && best == NULL; pass--) {
        for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
            /* a variant newer than the driver is one this driver does not have */
            if (strcmp(procs[i].base, symbol) != 0 || procs[i].ptds != pass ||
                procs[i].version > cfg()->cuda_version)
                continue;
            known = 1;
            if (procs[i].version <= version && (best == NULL || procs[i].version > best->version))
                best = &procs[i];
        }
    }
    if (best == NULL) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return resolve(symbol, pfn, version, flags, NULL);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    return resolve(symbol, pfn, version, flags, status);
}
