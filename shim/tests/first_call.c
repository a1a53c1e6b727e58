/*
 * One-time initialisation under pressure: a library constructor makes the
 * first CUDA call (ctor_lib.c), then N threads released together make their
 * first calls at once. Prints "ctor <rc>", "threads <ok> <oom> <other>" and
 * "info <rc> <free> <total>".
 */
#include <pthread.h>
#include <stdlib.h>
#include "harness.h"

extern int fracgpu_ctor_result;
extern CUresult cuCtxGetCurrent(CUcontext *);
static pthread_barrier_t start;
static CUcontext ctx;

static void *worker(void *arg)
{
    CUdeviceptr p;
    pthread_barrier_wait(&start);
    A.cuCtxSetCurrent(ctx);
    *(CUresult *)arg = A.cuMemAlloc(&p, 100u << 20);
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 8;
    pthread_t th[64];
    CUresult rc[64];
    printf("ctor %d\n", fracgpu_ctor_result);
    harness_resolve();
    cuCtxGetCurrent(&ctx);
    pthread_barrier_init(&start, NULL, (unsigned)n);
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, worker, &rc[i]);
    int ok = 0, oom = 0, other = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ok += rc[i] == CUDA_SUCCESS;
        oom += rc[i] == CUDA_ERROR_OUT_OF_MEMORY;
        other += rc[i] != CUDA_SUCCESS && rc[i] != CUDA_ERROR_OUT_OF_MEMORY;
    }
    printf("threads %d %d %d\n", ok, oom, other);
    size_t f = 0, t = 0;
    CUresult r = A.cuMemGetInfo(&f, &t);
    printf("info %d %zu %zu\n", r, f, t);
    return 0;
}
