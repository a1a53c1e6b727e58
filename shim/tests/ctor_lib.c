/* A library whose constructor is the process's first CUDA caller: it runs
 * before main and possibly before the shim has seen any other call. */
#include "fracgpu_cuda.h"

extern CUresult cuInit(unsigned int);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

int fracgpu_ctor_result = -1;

__attribute__((constructor)) static void first_cuda_call(void)
{
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGet(&d, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuDevicePrimaryCtxRetain(&c, d);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(c);
    if (rc == CUDA_SUCCESS)
        rc = cuMemAlloc_v2(&p, 600u << 20); /* 600 MiB */
    fracgpu_ctor_result = rc;
}
