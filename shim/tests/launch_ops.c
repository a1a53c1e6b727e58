/*
 * Compute pacing test: launches kernels of a fixed simulated duration for a
 * while and reports the share of wall time the GPU spent on them.
 * usage: launch_ops <kernel_us> <seconds> <launch|ex|coop|graph>
 * prints: "launch <kernels> <elapsed_ns> <busy_fraction>"
 */
#include <stdlib.h>
#include <string.h>
#include "harness.h"

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: launch_ops <kernel_us> <seconds> <launch|ex|coop|graph>\n");
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
        else
            rc = A.cuGraphLaunch(exec, s);
        if (rc != CUDA_SUCCESS) {
            printf("launch_error %d\n", rc);
            return 1;
        }
        n++;
    }
    A.cuStreamSynchronize(s);
    uint64_t elapsed = harness_now_ns() - start;
    printf("launch %ld %llu %.4f\n", n, (unsigned long long)elapsed,
           (double)n * us * 1000.0 / (double)elapsed);
    return 0;
}
