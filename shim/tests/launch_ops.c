/*
 * Compute pacing test: launches kernels of a fixed simulated duration for a
 * while and reports the share of wall time the GPU spent on them.
 * usage: launch_ops <kernel_us> <seconds> <kind>
 * kinds: launch ex coop graph (one context, one stream); culaunch grid gridasync
 * (deprecated entry points); multi (cuLaunchCooperativeKernelMultiDevice on one
 * device); ctx2 (one launch in the primary context, then only in a second
 * context); ctxmix (alternating between two contexts, each with its stream);
 * xctx (the primary context current, every launch on a stream of a second one);
 * ctxchurn (again and again: create a context, launch 4 kernels in it, destroy it)
 * prints: "launch <kernels> <elapsed_ns> <busy_fraction>"
 */
#include <stdlib.h>
#include <string.h>
#include "harness.h"

/* One round of ctxchurn: a fresh context, 4 launches in it, destroyed at once.
 * Counts 3 of its 4 launches in *n (the loop counts one more). */
static CUresult churn(CUfunction unused, const char *name, long *n)
{
    (void)unused;
    CUcontext primary, c;
    CUdevice dev;
    CUmodule m;
    CUfunction f;
    CUstream s;
    A.cuCtxGetCurrent(&primary);
    A.cuDeviceGet(&dev, 0);
    CUresult rc = A.cuCtxCreate(&c, 0, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    A.cuModuleLoadData(&m, "fake");
    A.cuModuleGetFunction(&f, m, name);
    A.cuStreamCreate(&s, 0);
    for (int i = 0; i < 4 && rc == CUDA_SUCCESS; i++)
        rc = A.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    *n += 3;
    A.cuCtxDestroy(c);
    A.cuCtxSetCurrent(primary);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: launch_ops <kernel_us> <seconds> <kind>\n");
        return 2;
    }
    harness_resolve();
    unsigned us = (unsigned)atoi(argv[1]);
    double seconds = atof(argv[2]);
    const char *kind = argv[3];
    CUresult rc = harness_context(0);
    if (rc != CUDA_SUCCESS) {
        printf("ctx %d\n", rc);
        return 1;
    }
    CUmodule m;
    CUfunction f;
    char name[64];
    snprintf(name, sizeof name, "busy_%uus", us);
    A.cuModuleLoadData(&m, "fake");
    A.cuModuleGetFunction(&f, m, name);
    CUstream s;
    A.cuStreamCreate(&s, 0);
    CUgraphExec exec = NULL;
    if (strcmp(kind, "graph") == 0) {
        CUgraph g;
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = f;
        A.cuGraphCreate(&g, 0);
        A.cuGraphAddKernelNode(NULL, g, NULL, 0, &p);
        A.cuGraphInstantiateWithFlags(&exec, g, 0);
    }
    /* a second context with its own module, function and stream */
    CUcontext primary = NULL, second = NULL;
    CUfunction f2 = f;
    CUstream s2 = s;
    int two = strcmp(kind, "ctx2") == 0 || strcmp(kind, "ctxmix") == 0 ||
              strcmp(kind, "xctx") == 0;
    if (two) {
        A.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL); /* stays in flight */
        CUdevice dev;
        A.cuDeviceGet(&dev, 0);
        A.cuCtxGetCurrent(&primary);
        rc = A.cuCtxCreate(&second, 0, dev);
        if (rc != CUDA_SUCCESS) {
            printf("ctx_create %d\n", rc);
            return 1;
        }
        CUmodule m2;
        A.cuModuleLoadData(&m2, "fake");
        A.cuModuleGetFunction(&f2, m2, name);
        A.cuStreamCreate(&s2, 0);
        if (strcmp(kind, "xctx") == 0)
            A.cuCtxSetCurrent(primary);
    }
    CUDA_LAUNCH_PARAMS multi;
    memset(&multi, 0, sizeof multi);
    multi.function = f;
    multi.gridDimX = multi.gridDimY = multi.gridDimZ = 1;
    multi.blockDimX = multi.blockDimY = multi.blockDimZ = 1;
    multi.hStream = s;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    uint64_t start = harness_now_ns(), until = start + (uint64_t)(seconds * 1e9);
    long n = 0;
    while (harness_now_ns() < until) {
        if (strcmp(kind, "launch") == 0)
            rc = A.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
        else if (strcmp(kind, "ex") == 0)
            rc = A.cuLaunchKernelEx(&cfg, f, NULL, NULL);
        else if (strcmp(kind, "coop") == 0)
            rc = A.cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL);
        else if (strcmp(kind, "culaunch") == 0)
            rc = A.cuLaunch(f);
        else if (strcmp(kind, "grid") == 0)
            rc = A.cuLaunchGrid(f, 1, 1);
        else if (strcmp(kind, "gridasync") == 0)
            rc = A.cuLaunchGridAsync(f, 1, 1, s);
        else if (strcmp(kind, "multi") == 0)
            rc = A.cuLaunchCooperativeKernelMultiDevice(&multi, 1, 0);
        else if (strcmp(kind, "ctxchurn") == 0)
            rc = churn(f, name, &n);
        else if (strcmp(kind, "ctx2") == 0 || strcmp(kind, "xctx") == 0)
            rc = A.cuLaunchKernel(f2, 1, 1, 1, 1, 1, 1, 0, s2, NULL, NULL);
        else if (strcmp(kind, "ctxmix") == 0) {
            A.cuCtxSetCurrent(n % 2 ? second : primary);
            rc = n % 2 ? A.cuLaunchKernel(f2, 1, 1, 1, 1, 1, 1, 0, s2, NULL, NULL)
                       : A.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
        } else
            rc = A.cuGraphLaunch(exec, s);
        if (rc != CUDA_SUCCESS) {
            printf("launch_error %d\n", rc);
            return 1;
        }
        n++;
    }
    A.cuStreamSynchronize(s);
    if (two) {
        A.cuCtxSetCurrent(second);
        A.cuStreamSynchronize(s2);
        n++; /* the first launch in the primary context */
    }
    uint64_t elapsed = harness_now_ns() - start;
    printf("launch %ld %llu %.4f\n", n, (unsigned long long)elapsed,
           (double)n * us * 1000.0 / (double)elapsed);
    return 0;
}
