/*
 * Compute slice: keep the container's duty cycle on each GPU at its core
 * limit. Every launch is bracketed by two events on its stream; when the
 * pair completes, the kernel's measured GPU time d is charged to a shared
 * "theoretical arrival time" (TAT, the generic cell rate algorithm):
 *     TAT = max(TAT, launch time) + d * 100 / core_limit
 * and a launch waits while TAT is in the future. The TAT lives in the shared
 * region, so all processes of a container draw from one slice. Measuring the
 * container's own kernel time avoids the sampling error of NVML utilisation.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include "shim.h"

#define RING 16
#define POOL (2 * RING + 4)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

struct pending { CUevent start, end; uint64_t launch_ns; };
struct dev_pace {
    pthread_mutex_t mu;
    CUcontext ctx;
    struct pending ring[RING];
    unsigned head, n;
    CUevent pool[POOL];
    unsigned npool;
};
struct token { struct pending p; };

static struct dev_pace pace[FRACGPU_MAX_DEVICES] = {
    [0 ... FRACGPU_MAX_DEVICES - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER}};
static __thread struct token tls_token; /* one launch in flight per thread */
static int alone[FRACGPU_MAX_DEVICES];   /* last seen alone on the GPU's board */

uint64_t fracgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void charge(int di, uint64_t launch_ns, uint64_t busy_ns)
{
    struct fracgpu_region_device *d = &G.region->dev[di];
    unsigned core = G.limits.dev[di].core_limit;
    /* the elastic bound applies while no neighbour is active on the GPU */
    if (__atomic_load_n(&alone[di], __ATOMIC_RELAXED) && G.limits.dev[di].core_limit_max > core)
        core = G.limits.dev[di].core_limit_max;
    if (!G.limits.compute_limit_enabled || G.limits.dev[di].core_limit >= 100) {
        __atomic_fetch_add(&d->kernel_time_ns, busy_ns, __ATOMIC_RELAXED);
        return; /* measured for the priority bound only, not paced */
    }
    uint64_t cost = busy_ns * 100 / core;
    uint64_t tat = __atomic_load_n(&d->pace_tat_ns, __ATOMIC_ACQUIRE), next;
    do {
        uint64_t base = tat > launch_ns ? tat : launch_ns;
        next = base + cost;
    } while (!__atomic_compare_exchange_n(&d->pace_tat_ns, &tat, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    __atomic_fetch_add(&d->kernel_time_ns, busy_ns, __ATOMIC_RELAXED);
}

static CUevent take_event(struct dev_pace *p)
{
    if (p->npool > 0)
        return p->pool[--p->npool];
    CUevent e = NULL;
    if (real_cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    return e;
}

static void give_event(struct dev_pace *p, CUevent e)
{
    if (e == NULL)
        return;
    if (p->npool < POOL)
        p->pool[p->npool++] = e;
    else
        real_cuEventDestroy_v2(e);
}

/* Charge every completed launch, oldest first. Caller holds p->mu. */
static void drain(int di, struct dev_pace *p)
{
    while (p->n > 0) {
        struct pending *e = &p->ring[p->head];
        CUresult q = real_cuEventQuery(e->end);
        if (q == CUDA_ERROR_NOT_READY)
            break;
        float ms = 0;
        if (q == CUDA_SUCCESS && real_cuEventElapsedTime(&ms, e->start, e->end) == CUDA_SUCCESS &&
            ms > 0)
            charge(di, e->launch_ns, (uint64_t)((double)ms * 1e6));
        give_event(p, e->start);
        give_event(p, e->end);
        p->head = (p->head + 1) % RING;
        p->n--;
    }
}

void fracgpu_pace_before(int di, int bounded, CUstream stream, int per_thread, void **token)
{
    *token = NULL;
    if (di < 0 || real_cuEventRecord == NULL || real_cuEventQuery == NULL)
        return;
    int paced = G.limits.compute_limit_enabled && G.limits.dev[di].core_limit < 100;
    /* bounded: a low-priority container next to recently active high-priority
     * work keeps at most RING launches in flight even unpaced, so little of its
     * work queues ahead of the high-priority container's. */
    if (!paced && !bounded)
        return;
    struct dev_pace *p = &pace[di];
    CUcontext ctx = NULL;
    real_cuCtxGetCurrent(&ctx);
    pthread_mutex_lock(&p->mu);
    if (p->ctx != ctx && p->n == 0) {
        p->ctx = ctx; /* events belong to a context; the old pool is dropped */
        p->npool = 0;
    }
    int usable = p->ctx == ctx;
    if (usable) {
        drain(di, p);
        if (p->n == RING) {
            real_cuEventSynchronize(p->ring[p->head].end);
            drain(di, p);
        }
    }
    pthread_mutex_unlock(&p->mu);

    struct fracgpu_region_device *d = &G.region->dev[di];
    uint64_t now = fracgpu_now_ns(), launch_ns = now;
    uint64_t tat = paced ? __atomic_load_n(&d->pace_tat_ns, __ATOMIC_ACQUIRE) : 0;
    int is_alone = paced && fracgpu_board_alone(di, now);
    __atomic_store_n(&alone[di], is_alone, __ATOMIC_RELAXED);
    if (is_alone && G.limits.burst_when_alone) {
        /* Alone on the GPU and allowed to burst: no wait, and no debt either,
         * so a neighbour arriving later finds us at our slice at once. */
        while (tat > now && !__atomic_compare_exchange_n(&d->pace_tat_ns, &tat, now, 1,
                                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
        tat = 0;
    }
    if (tat > now) {
        uint64_t wait = tat - now;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        __atomic_fetch_add(&d->throttle_ns, wait, __ATOMIC_RELAXED);
        /* Charge from the time we were due, not from when the scheduler woke
         * us: oversleeping on a busy host must not shrink the slice. */
        launch_ns = tat;
    }
    if (!usable)
        return;
    pthread_mutex_lock(&p->mu);
    struct token *t = &tls_token;
    t->p.start = take_event(p);
    t->p.end = take_event(p);
    pthread_mutex_unlock(&p->mu);
    t->p.launch_ns = launch_ns;
    if (stream == NULL && per_thread)
        stream = CU_STREAM_PER_THREAD;
    if (t->p.start == NULL || t->p.end == NULL ||
        real_cuEventRecord(t->p.start, stream) != CUDA_SUCCESS) {
        pthread_mutex_lock(&p->mu);
        give_event(p, t->p.start);
        give_event(p, t->p.end);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    *token = t;
}

void fracgpu_pace_after(int di, CUstream stream, int per_thread, void *token, CUresult rc)
{
    if (token == NULL)
        return;
    struct token *t = token;
    struct dev_pace *p = &pace[di];
    if (stream == NULL && per_thread)
        stream = CU_STREAM_PER_THREAD;
    int ok = rc == CUDA_SUCCESS && real_cuEventRecord(t->p.end, stream) == CUDA_SUCCESS;
    pthread_mutex_lock(&p->mu);
    if (ok && p->n < RING) {
        p->ring[(p->head + p->n) % RING] = t->p;
        p->n++;
    } else {
        give_event(p, t->p.start);
        give_event(p, t->p.end);
    }
    pthread_mutex_unlock(&p->mu);
    __atomic_fetch_add(&G.region->dev[di].kernel_launches, 1, __ATOMIC_RELAXED);
}

void fracgpu_pace_reset_after_fork(void)
{
    /* Events belong to the parent's contexts; the child starts empty. */
    for (unsigned i = 0; i < FRACGPU_MAX_DEVICES; i++) {
        pthread_mutex_init(&pace[i].mu, NULL);
        pace[i].ctx = NULL;
        pace[i].n = pace[i].head = pace[i].npool = 0;
        alone[i] = 0;
    }
}
