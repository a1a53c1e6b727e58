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
#define POOLS 8 /* contexts per device whose spare events are kept */

/* Spare events of one context (an event belongs to the context it was made in). */
struct pool { CUcontext ctx; CUevent ev[POOL]; unsigned n; };
/* One ring per device for every context of the process: a launch is charged
 * whichever context, stream or thread made it, so a second context cannot
 * run unmeasured (events of any context can be queried and timed). */
struct dev_pace {
    pthread_mutex_t mu;
    struct fracgpu_pending ring[RING];
    unsigned head, n;
    struct pool pool[POOLS];
    unsigned next_pool;
};

static struct dev_pace pace[FRACGPU_MAX_DEVICES] = {
    [0 ... FRACGPU_MAX_DEVICES - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER}};
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

static struct pool *pool_of(struct dev_pace *p, CUcontext ctx, int claim)
{
    for (unsigned i = 0; i < POOLS; i++)
        if (p->pool[i].ctx == ctx)
            return &p->pool[i];
    if (!claim)
        return NULL;
    /* A context not seen before takes the next pool; the spare events of the
     * context it displaces are dropped, not destroyed: that context may be
     * gone, and with it its events. */
    struct pool *q = &p->pool[p->next_pool++ % POOLS];
    q->ctx = ctx;
    q->n = 0;
    return q;
}

static CUevent take_event(struct dev_pace *p, CUcontext ctx)
{
    struct pool *q = pool_of(p, ctx, 1);
    if (q->n > 0)
        return q->ev[--q->n];
    CUevent e = NULL;
    if (real_cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    return e;
}

static void give_event(struct dev_pace *p, CUcontext ctx, CUevent e)
{
    if (e == NULL)
        return;
    struct pool *q = pool_of(p, ctx, 0);
    if (q != NULL && q->n < POOL)
        q->ev[q->n++] = e;
    else if (q != NULL)
        real_cuEventDestroy_v2(e);
}

/* Charge every completed launch, oldest first. Caller holds p->mu. */
static void drain(int di, struct dev_pace *p)
{
    while (p->n > 0) {
        struct fracgpu_pending *e = &p->ring[p->head];
        if (e->end == NULL) { /* charged already, before its context went away */
            p->head = (p->head + 1) % RING;
            p->n--;
            continue;
        }
        CUresult q = real_cuEventQuery(e->end);
        if (q == CUDA_ERROR_NOT_READY)
            break;
        float ms = 0;
        if (q == CUDA_SUCCESS && real_cuEventElapsedTime(&ms, e->start, e->end) == CUDA_SUCCESS &&
            ms > 0)
            charge(di, e->launch_ns, (uint64_t)((double)ms * 1e6));
        give_event(p, e->ctx, e->start);
        give_event(p, e->ctx, e->end);
        p->head = (p->head + 1) % RING;
        p->n--;
    }
}

/* Room for one more launch in the ring: wait for the oldest if it is full. */
static void make_room(int di, struct dev_pace *p)
{
    drain(di, p);
    while (p->n == RING) {
        real_cuEventSynchronize(p->ring[p->head].end);
        struct fracgpu_pending *e = &p->ring[p->head];
        if (real_cuEventQuery(e->end) == CUDA_ERROR_NOT_READY) {
            /* cannot complete (its context is gone): charge nothing, drop it */
            p->head = (p->head + 1) % RING;
            p->n--;
        }
        drain(di, p);
    }
}

/* The context a launch runs in: its stream's (a created stream may belong to a
 * context other than the current one), else the current context. */
static CUcontext launch_ctx(CUstream stream)
{
    CUcontext cur = NULL, ctx = NULL;
    real_cuCtxGetCurrent(&cur);
    int created = stream != NULL && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD;
    if (created && real_cuStreamGetCtx != NULL && real_cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS &&
        ctx != NULL)
        return ctx;
    return cur;
}

/* Make ctx current for the measuring calls if it is not; 1 if pushed. */
static int enter_ctx(CUcontext ctx)
{
    CUcontext cur = NULL;
    if (ctx == NULL || real_cuCtxPushCurrent_v2 == NULL || real_cuCtxPopCurrent_v2 == NULL)
        return 0;
    real_cuCtxGetCurrent(&cur);
    return cur != ctx && real_cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
}

static void leave_ctx(int pushed)
{
    CUcontext popped;
    if (pushed)
        real_cuCtxPopCurrent_v2(&popped);
}

void fracgpu_pace_before(int di, int bounded, CUstream stream, int per_thread,
                         struct fracgpu_pace_token *t)
{
    t->di = -1;
    if (di < 0 || real_cuEventRecord == NULL || real_cuEventQuery == NULL)
        return;
    int paced = G.limits.compute_limit_enabled && G.limits.dev[di].core_limit < 100;
    /* bounded: a low-priority container next to recently active high-priority
     * work keeps at most RING launches in flight even unpaced, so little of its
     * work queues ahead of the high-priority container's. */
    if (!paced && !bounded)
        return;
    struct dev_pace *p = &pace[di];
    CUcontext ctx = launch_ctx(stream);
    pthread_mutex_lock(&p->mu);
    make_room(di, p);
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
    /* The events are made and recorded in the stream's context, current or not. */
    int pushed = enter_ctx(ctx);
    pthread_mutex_lock(&p->mu);
    t->p.ctx = ctx;
    t->p.start = take_event(p, ctx);
    t->p.end = take_event(p, ctx);
    pthread_mutex_unlock(&p->mu);
    t->p.launch_ns = launch_ns;
    if (stream == NULL && per_thread)
        stream = CU_STREAM_PER_THREAD;
    int recorded = t->p.start != NULL && t->p.end != NULL &&
                   real_cuEventRecord(t->p.start, stream) == CUDA_SUCCESS;
    leave_ctx(pushed);
    if (!recorded) {
        pthread_mutex_lock(&p->mu);
        give_event(p, ctx, t->p.start);
        give_event(p, ctx, t->p.end);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    t->di = di;
}

void fracgpu_pace_after(CUstream stream, int per_thread, struct fracgpu_pace_token *t, CUresult rc)
{
    int di = t->di;
    if (di < 0)
        return;
    struct dev_pace *p = &pace[di];
    if (stream == NULL && per_thread)
        stream = CU_STREAM_PER_THREAD;
    int pushed = enter_ctx(t->p.ctx);
    int ok = rc == CUDA_SUCCESS && real_cuEventRecord(t->p.end, stream) == CUDA_SUCCESS;
    leave_ctx(pushed);
    pthread_mutex_lock(&p->mu);
    if (ok) {
        /* Other threads may have filled the ring since: every launch that ran
         * is charged, so wait for room rather than drop it. */
        make_room(di, p);
        p->ring[(p->head + p->n) % RING] = t->p;
        p->n++;
    } else {
        give_event(p, t->p.ctx, t->p.start);
        give_event(p, t->p.ctx, t->p.end);
    }
    pthread_mutex_unlock(&p->mu);
    __atomic_fetch_add(&G.region->dev[di].kernel_launches, 1, __ATOMIC_RELAXED);
}

void fracgpu_pace_ctx_gone(CUcontext ctx)
{
    if (real_cuEventSynchronize == NULL || G.region == NULL)
        return;
    for (unsigned di = 0; di < G.limits.device_count; di++) {
        struct dev_pace *p = &pace[di];
        pthread_mutex_lock(&p->mu);
        /* Its launches complete and are charged now, while their events still exist
         * (the context's events die with it). */
        for (unsigned k = 0; k < p->n; k++) {
            struct fracgpu_pending *e = &p->ring[(p->head + k) % RING];
            if (e->end == NULL || (ctx != NULL && e->ctx != ctx))
                continue;
            float ms = 0;
            if (real_cuEventSynchronize(e->end) == CUDA_SUCCESS &&
                real_cuEventElapsedTime(&ms, e->start, e->end) == CUDA_SUCCESS && ms > 0)
                charge((int)di, e->launch_ns, (uint64_t)((double)ms * 1e6));
            real_cuEventDestroy_v2(e->start);
            real_cuEventDestroy_v2(e->end);
            e->start = e->end = NULL;
        }
        for (unsigned i = 0; i < POOLS; i++) {
            struct pool *q = &p->pool[i];
            if (q->ctx == NULL || (ctx != NULL && q->ctx != ctx))
                continue;
            while (q->n > 0)
                real_cuEventDestroy_v2(q->ev[--q->n]);
            q->ctx = NULL;
        }
        drain((int)di, p);
        pthread_mutex_unlock(&p->mu);
    }
}

void fracgpu_pace_reset_after_fork(void)
{
    /* Events belong to the parent's contexts; the child starts empty. */
    for (unsigned i = 0; i < FRACGPU_MAX_DEVICES; i++) {
        pthread_mutex_init(&pace[i].mu, NULL);
        memset(pace[i].pool, 0, sizeof pace[i].pool);
        pace[i].n = pace[i].head = pace[i].next_pool = 0;
        alone[i] = 0;
    }
}
