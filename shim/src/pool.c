/*
 * Memory the driver keeps in pools, counted as the driver reserves it.
 *
 * Two kinds of pool hold physical memory beyond what a program has allocated:
 *  - stream-ordered pools (cuMemAllocAsync, cuMemAllocFromPoolAsync): a freed block
 *    stays in its pool until a synchronisation finds the pool above its release
 *    threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, which the program may raise to
 *    any value), cuMemPoolTrimTo, or cuMemPoolDestroy;
 *  - each device's graph memory pool (cuGraphAddMemAllocNode): an exec's allocations
 *    get physical memory when it is uploaded or launched, and that memory stays in
 *    the pool after frees and exec destruction until cuDeviceGraphMemTrim. An
 *    allocation that no free node of its graph frees outlives its exec: it stays
 *    allocated until the program frees the pointer.
 *
 * So a free must not give the slice back while the pool still holds the memory. Per
 * pool the shim keeps live (bytes of allocations the program holds) and counted
 * (bytes counted against the slice, >= live). A free lowers live only. For the graph
 * pool live is at least the driver's USED_MEM_CURRENT (held): the execs the shim saw
 * backed are not all a graph holds, since allocations outlive their execs, and memory
 * still allocated is not free for the next exec. counted is
 * settled against the driver's own figure for the pool (RESERVED_MEM_CURRENT): down to
 * max(live, reserved) when the pool released memory, up to reserved when the driver
 * took more than the shim saw (rounding, an exec the shim did not see instantiated) -
 * then past the slice if need be, so that the next allocation is refused. An
 * allocation first uses what is counted but not live, and reserves only the rest.
 * Settling happens after every pool operation and, when the slice looks full, for all
 * pools before an allocation is refused. Without the driver's figure counted never
 * goes down except by trim or destroy: never too little.
 */
#include <pthread.h>
#include "shim.h"

#define MAX_POOLS 256

struct cpool {
    uint64_t key;   /* CUmemoryPool, or the device ordinal for the graph pool */
    int kind;       /* POOL_MEM, POOL_GRAPH; 0: free entry */
    unsigned di;    /* limits index the pool's memory counts on */
    CUdevice dev;   /* CUDA ordinal (graph pool queries) */
    int destroyed;  /* cuMemPoolDestroy: frees give back at once */
    uint64_t live, counted;
    uint64_t held;  /* graph pool: the driver's USED_MEM_CURRENT at the last settle */
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cpool pools[MAX_POOLS];

static struct cpool *find(int kind, uint64_t key)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].kind == kind && pools[i].key == key)
            return &pools[i];
    return NULL;
}

static struct cpool *find_or_add(int kind, uint64_t key, unsigned di, CUdevice dev)
{
    struct cpool *p = find(kind, key);
    if (p != NULL)
        return p;
    for (int i = 0; i < MAX_POOLS; i++) {
        /* a destroyed pool with nothing left is only a memory of one: reuse it */
        if (pools[i].kind == 0 || (pools[i].destroyed && pools[i].counted == 0)) {
            pools[i] = (struct cpool){key, kind, di, dev, 0, 0, 0, 0};
            return &pools[i];
        }
    }
    return NULL;
}

static int driver_reserved(const struct cpool *p, uint64_t *out)
{
    cuuint64_t v = 0;
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    if (p->destroyed)
        return -1;
    if (p->kind == POOL_MEM && real_cuMemPoolGetAttribute != NULL)
        rc = real_cuMemPoolGetAttribute((CUmemoryPool)(uintptr_t)p->key,
                                        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
    else if (p->kind == POOL_GRAPH && real_cuDeviceGetGraphMemAttribute != NULL)
        rc = real_cuDeviceGetGraphMemAttribute(p->dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                                               &v);
    if (rc != CUDA_SUCCESS)
        return -1;
    *out = v;
    return 0;
}

/* Bytes the pool's allocations hold: what the program holds and, for the graph pool,
 * what the driver says graphs still have allocated, whichever is more. */
static uint64_t in_use(const struct cpool *p)
{
    return p->live > p->held ? p->live : p->held;
}

static void read_graph_used(struct cpool *p)
{
    cuuint64_t v = 0;
    if (p->kind == POOL_GRAPH && !p->destroyed && real_cuDeviceGetGraphMemAttribute != NULL &&
        real_cuDeviceGetGraphMemAttribute(p->dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v) ==
            CUDA_SUCCESS)
        p->held = v;
}

static int reserve(unsigned di, uint64_t bytes, uint64_t limit)
{
    return bytes == 0 ? 0 : fracgpu_region_reserve(G.region, G.slot, di, bytes, limit);
}

static void give_back(unsigned di, uint64_t bytes)
{
    if (bytes)
        fracgpu_region_release(G.region, G.slot, di, bytes, 0);
}

/* Bytes given back. */
static uint64_t settle(struct cpool *p)
{
    uint64_t r;
    read_graph_used(p);
    if (driver_reserved(p, &r) != 0)
        return 0;
    uint64_t target = r > in_use(p) ? r : in_use(p);
    if (p->counted > target) {
        uint64_t d = p->counted - target;
        p->counted = target;
        give_back(p->di, d);
        return d;
    }
    if (target > p->counted) {
        /* The driver holds more than was counted: count it, past the slice if it must. */
        if (reserve(p->di, target - p->counted, G.limits.dev[p->di].memory_limit) != 0) {
            LOGW("a memory pool on device %u holds %llu bytes more than counted: counted past "
                 "the slice, further allocations are refused", p->di,
                 (unsigned long long)(target - p->counted));
            reserve(p->di, target - p->counted, UINT64_MAX);
        }
        p->counted = target;
    }
    return 0;
}

static uint64_t settle_all_locked(void)
{
    uint64_t freed = 0;
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].kind != 0)
            freed += settle(&pools[i]);
    return freed;
}

void fracgpu_pool_known(int kind, uint64_t key, int di, CUdevice dev)
{
    if (di < 0 || fracgpu_ensure_slot() != 0)
        return;
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find_or_add(kind, key, (unsigned)di, dev);
    if (p != NULL && p->live == 0 && p->counted == 0) {
        p->di = (unsigned)di;
        p->dev = dev;
        p->destroyed = 0;
    }
    pthread_mutex_unlock(&pool_mu);
}

int fracgpu_pool_device(int kind, uint64_t key)
{
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find(kind, key);
    int di = p != NULL ? (int)p->di : -1;
    pthread_mutex_unlock(&pool_mu);
    return di;
}

CUresult fracgpu_pool_take(int kind, uint64_t key, int di, CUdevice dev, uint64_t n,
                           uint64_t *took)
{
    *took = 0;
    if (di < 0 || fracgpu_ensure_slot() != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find_or_add(kind, key, (unsigned)di, dev);
    if (p == NULL) {
        LOGE("more than %d memory pools: allocation refused", MAX_POOLS);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        settle(p);
        uint64_t used = in_use(p);
        uint64_t idle = p->counted > used ? p->counted - used : 0, need = n > idle ? n - idle : 0;
        uint64_t limit = G.limits.dev[p->di].memory_limit;
        if (reserve(p->di, need, limit) != 0 &&
            (settle_all_locked() == 0 || reserve(p->di, need, limit) != 0)) {
            LOGI("pool allocation of %llu bytes refused: the slice of device %u is %llu bytes",
                 (unsigned long long)n, p->di, (unsigned long long)limit);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            p->counted += need;
            p->live += n;
            *took = need;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    return rc;
}

void fracgpu_pool_untake(int kind, uint64_t key, uint64_t n, uint64_t took)
{
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find(kind, key);
    if (p != NULL) {
        p->live -= n < p->live ? n : p->live;
        took = took < p->counted ? took : p->counted;
        p->counted -= took;
        give_back(p->di, took);
    }
    pthread_mutex_unlock(&pool_mu);
}

void fracgpu_pool_put(int kind, uint64_t key, uint64_t n)
{
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find(kind, key);
    if (p != NULL) {
        n = n < p->live ? n : p->live;
        p->live -= n;
        if (p->destroyed) {
            uint64_t d = p->counted - p->live;
            p->counted = p->live;
            give_back(p->di, d);
        } else {
            settle(p);
        }
    }
    pthread_mutex_unlock(&pool_mu);
}

void fracgpu_pool_settle(int kind, uint64_t key)
{
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find(kind, key);
    if (p != NULL)
        settle(p);
    pthread_mutex_unlock(&pool_mu);
}

void fracgpu_pool_destroyed(uint64_t key)
{
    pthread_mutex_lock(&pool_mu);
    struct cpool *p = find(POOL_MEM, key);
    if (p != NULL) {
        /* Outstanding allocations keep their memory until freed; the rest is gone. */
        p->destroyed = 1;
        uint64_t d = p->counted - p->live;
        p->counted = p->live;
        give_back(p->di, d);
    }
    pthread_mutex_unlock(&pool_mu);
}

uint64_t fracgpu_pool_settle_all(void)
{
    pthread_mutex_lock(&pool_mu);
    uint64_t freed = settle_all_locked();
    pthread_mutex_unlock(&pool_mu);
    return freed;
}

void fracgpu_pool_reset_after_fork(void)
{
    /* The child holds none of the parent's pool memory. */
    pthread_mutex_init(&pool_mu, NULL);
    for (int i = 0; i < MAX_POOLS; i++)
        pools[i].kind = 0;
}
