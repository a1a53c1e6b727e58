/*
 * A library that calls the driver itself, as a framework's CUDA backend does: its
 * references to cuMemAlloc_v2 (and to dlsym) are bound by the dynamic loader in
 * whatever scope the program opened it with (RTLD_DEEPBIND, a dlmopen namespace).
 */
#include <dlfcn.h>
#include "fracgpu_cuda.h"

extern CUresult cuInit(unsigned int);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

int escape_ctx(void)
{
    CUdevice d;
    CUcontext c;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGet(&d, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuDevicePrimaryCtxRetain(&c, d);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(c);
    return rc;
}

int escape_alloc(unsigned long long n)
{
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, (size_t)n);
}

/* The same through this library's own dlsym reference. */
int escape_dlsym_alloc(unsigned long long n)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*f)(CUdeviceptr *, size_t) =
        h ? (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2") : NULL;
    CUdeviceptr p;
    return f ? f(&p, (size_t)n) : -1;
}
