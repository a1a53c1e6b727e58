/*
 * Ways a program reaches the driver around the dynamic linker's ordinary binding.
 * "escape <way> <libcuda path>": opens the driver (or a library that calls it) that
 * way, makes a context, then allocates 900 MiB and 200 MiB. Prints "open ok" or
 * "open refused <dlerror>", then "ctx <CUresult>" and "alloc <CUresult>" lines.
 * Ways: deepbind, deepbind_dlsym (the library's own dlsym), dlmopen_new,
 * dlmopen_libc (dlmopen found with dlsym on libc's handle), dlmopen_dlvsym (with
 * dlvsym and glibc's version name), dlmopen_base,
 * path (dlopen by the given path), noload (RTLD_NOLOAD), origin (a library found
 * through this program's RUNPATH only).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fracgpu_cuda.h"

typedef int (*ctx_fn)(void);
typedef int (*alloc_fn)(unsigned long long);
typedef CUresult (*cu_alloc_fn)(CUdeviceptr *, size_t);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

static ctx_fn lib_ctx;
static alloc_fn lib_alloc;
static void *drv;

static int drv_ctx(void)
{
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(drv, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(drv, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(drv, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(drv, "cuCtxSetCurrent");
    CUdevice d;
    CUcontext c;
    CUresult rc = init(0);
    if (rc == CUDA_SUCCESS)
        rc = get(&d, 0);
    if (rc == CUDA_SUCCESS)
        rc = retain(&c, d);
    if (rc == CUDA_SUCCESS)
        rc = set(c);
    return rc;
}

static int drv_alloc(unsigned long long n)
{
    cu_alloc_fn f = (cu_alloc_fn)dlsym(drv, "cuMemAlloc_v2");
    CUdeviceptr p;
    return f(&p, (size_t)n);
}

static int use_lib(void *h, const char *alloc_name)
{
    if (h == NULL) {
        const char *e = dlerror();
        printf("open refused %s\n", e ? e : "(no message)");
        return 1;
    }
    lib_ctx = (ctx_fn)dlsym(h, "escape_ctx");
    lib_alloc = (alloc_fn)dlsym(h, alloc_name);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return 92;
    const char *way = argv[1];
    const char *path = argc > 2 ? argv[2] : "libcuda.so.1";
    int lib = 1;
    if (strcmp(way, "deepbind") == 0 || strcmp(way, "origin") == 0) {
        int deep = way[0] == 'd' ? RTLD_DEEPBIND : 0;
        if (use_lib(dlopen("libescape.so", RTLD_NOW | RTLD_LOCAL | deep), "escape_alloc"))
            return 0;
    } else if (strcmp(way, "deepbind_dlsym") == 0) {
        if (use_lib(dlopen("libescape.so", RTLD_NOW | RTLD_DEEPBIND), "escape_dlsym_alloc"))
            return 0;
    } else if (strncmp(way, "dlmopen_", 8) == 0) {
        dlmopen_fn f = dlmopen;
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (strcmp(way, "dlmopen_libc") == 0)
            f = (dlmopen_fn)dlsym(libc, "dlmopen");
        else if (strcmp(way, "dlmopen_dlvsym") == 0)
            f = (dlmopen_fn)dlvsym(libc, "dlmopen", "GLIBC_2.34");
        if (f == NULL)
            return 94;
        Lmid_t ns = strcmp(way, "dlmopen_base") == 0 ? LM_ID_BASE : LM_ID_NEWLM;
        if (use_lib(f(ns, "libescape.so", RTLD_NOW), "escape_alloc"))
            return 0;
    } else {
        lib = 0;
        int mode = RTLD_NOW | RTLD_LOCAL;
        if (strcmp(way, "noload") == 0)
            mode |= RTLD_NOLOAD;
        else if (strcmp(way, "path") != 0)
            return 93;
        drv = dlopen(path, mode);
        if (drv == NULL) {
            printf("open refused %s\n", dlerror());
            return 0;
        }
    }
    printf("open ok\n");
    printf("ctx %d\n", lib ? lib_ctx() : drv_ctx());
    for (int i = 0; i < 2; i++) {
        unsigned long long n = (i == 0 ? 900ull : 200ull) << 20;
        printf("alloc %d\n", lib ? lib_alloc(n) : drv_alloc(n));
    }
    return 0;
}
