/*
 * Per-call cost of the driver entry points the shim wraps, measured the same
 * way with and without the shim preloaded (bench/shim/__main__.py runs both).
 * Prints "<operation> <ns per call>" lines, best of several rounds.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "fracgpu_cuda.h"

#define MIX 16 /* kernels in the mixed-launch loop */

extern CUresult cuInit(unsigned int);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
extern CUresult cuMemFree_v2(CUdeviceptr);
extern CUresult cuModuleLoadData(CUmodule *, const void *);
extern CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
extern CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
extern CUresult cuStreamCreate(CUstream *, unsigned int);
extern CUresult cuStreamSynchronize(CUstream);
extern CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
extern CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
extern CUresult cuGraphCreate(CUgraph *, unsigned int);
extern CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
extern CUresult cuGraphLaunch(CUgraphExec, CUstream);
extern CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);

#define BATCH 1000
#define ROUNDS 7

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int batches = argc > 1 ? atoi(argv[1]) : 50;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    static CUdeviceptr ptrs[BATCH];
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuModuleLoadData(&mod, "bench"), "cuModuleLoadData");
    check(cuModuleGetFunction(&fn, mod, "empty_0us"), "cuModuleGetFunction");
    /* kernels launched in turn, as a real program's are (each one's first launch in a
     * context is checked by the shim; the rest must stay cheap) */
    CUfunction mix[MIX];
    for (int k = 0; k < MIX; k++) {
        char name[32];
        snprintf(name, sizeof name, "mix%d_0us", k);
        check(cuModuleGetFunction(&mix[k], mod, name), "cuModuleGetFunction");
    }
    check(cuStreamCreate(&stream, 0), "cuStreamCreate");
    CUgraph graph;
    CUgraphExec exec;
    check(cuGraphCreate(&graph, 0), "cuGraphCreate");
    check(cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
    double best_alloc = 1e18, best_free = 1e18, best_launch = 1e18, best_gpa = 1e18;
    double best_async = 1e18, best_graph = 1e18, best_mix = 1e18;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t alloc_ns = 0, free_ns = 0, t;
        for (int b = 0; b < batches; b++) {
            t = now_ns();
            for (int i = 0; i < BATCH; i++)
                check(cuMemAlloc_v2(&ptrs[i], 4096), "cuMemAlloc_v2");
            alloc_ns += now_ns() - t;
            t = now_ns();
            for (int i = 0; i < BATCH; i++)
                check(cuMemFree_v2(ptrs[i]), "cuMemFree_v2");
            free_ns += now_ns() - t;
        }
        double n = (double)batches * BATCH;
        if (alloc_ns / n < best_alloc) best_alloc = alloc_ns / n;
        if (free_ns / n < best_free) best_free = free_ns / n;

        t = now_ns();
        for (int i = 0; i < batches * BATCH; i++)
            check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL), "cuLaunchKernel");
        double launch = (now_ns() - t) / n;
        cuStreamSynchronize(stream);
        if (launch < best_launch) best_launch = launch;

        t = now_ns();
        for (int i = 0; i < batches * BATCH; i++)
            check(cuLaunchKernel(mix[i % MIX], 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL),
                  "cuLaunchKernel");
        double mixed = (now_ns() - t) / n;
        cuStreamSynchronize(stream);
        if (mixed < best_mix) best_mix = mixed;

        /* a stream-ordered allocation and its free: the pool's bookkeeping (pool.c) */
        t = now_ns();
        for (int b = 0; b < batches; b++)
            for (int i = 0; i < BATCH; i++) {
                check(cuMemAllocAsync(&ptrs[i], 4096, stream), "cuMemAllocAsync");
                check(cuMemFreeAsync(ptrs[i], stream), "cuMemFreeAsync");
            }
        double async = (now_ns() - t) / n;
        if (async < best_async) best_async = async;

        /* a graph launch: backing check and the graph pool settled after it */
        t = now_ns();
        for (int i = 0; i < batches * BATCH; i++)
            check(cuGraphLaunch(exec, stream), "cuGraphLaunch");
        double graph_ns = (now_ns() - t) / n;
        cuStreamSynchronize(stream);
        if (graph_ns < best_graph) best_graph = graph_ns;

        t = now_ns();
        for (int i = 0; i < batches * BATCH; i++) {
            void *p;
            CUdriverProcAddressQueryResult st;
            check(cuGetProcAddress_v2("cuMemAlloc", &p, 12040, 0, &st), "cuGetProcAddress_v2");
        }
        double gpa = (now_ns() - t) / n;
        if (gpa < best_gpa) best_gpa = gpa;
    }
    printf("alloc %.1f\nfree %.1f\nlaunch %.1f\ngetprocaddress %.1f\n", best_alloc, best_free,
           best_launch, best_gpa);
    printf("asyncallocfree %.1f\ngraphlaunch %.1f\nlaunchmix %.1f\n", best_async, best_graph,
           best_mix);
    return 0;
}
