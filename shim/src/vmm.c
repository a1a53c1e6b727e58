/*
 * Virtual memory management bookkeeping (cuMemCreate / cuMemMap / cuMemUnmap /
 * cuMemRelease). The driver frees a handle's physical memory only when the handle
 * is released AND every mapping of it is unmapped, so the slice must keep counting
 * a released handle while it is mapped: releasing right after mapping is the
 * documented way to use the API, not a free. Process-local, one mutex, held across
 * the driver's release and unmap so a handle value the driver hands out again
 * cannot be confused with the old one. Linear arrays: programs hold at most a few
 * thousand handles (one per 2 MiB granule at worst).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

struct vmm_handle { uint64_t h, size; unsigned di, maps; int released; };
struct vmm_map { uint64_t ptr, size, h; };

static pthread_mutex_t vmm_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vmm_handle *handles;
static struct vmm_map *maps;
static size_t n_handles, cap_handles, n_maps, cap_maps;

static int grow(void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 64;
    void *x = realloc(*v, c * elem);
    if (x == NULL)
        return -1;
    *v = x;
    *cap = c;
    return 0;
}

static struct vmm_handle *find(uint64_t h)
{
    for (size_t i = 0; i < n_handles; i++)
        if (handles[i].h == h)
            return &handles[i];
    return NULL;
}

int fracgpu_vmm_created(uint64_t h, uint64_t size, unsigned di)
{
    int rc = -1;
    pthread_mutex_lock(&vmm_mu);
    if (grow((void **)&handles, &cap_handles, n_handles, sizeof *handles) == 0) {
        handles[n_handles++] = (struct vmm_handle){h, size, di, 0, 0};
        rc = 0;
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

/* Drops a handle that is released and no longer mapped; gives its bytes back. */
static void settle(struct vmm_handle *x, void (*release)(unsigned, uint64_t))
{
    if (!x->released || x->maps != 0)
        return;
    unsigned di = x->di;
    uint64_t size = x->size;
    *x = handles[--n_handles];
    release(di, size);
}

CUresult fracgpu_vmm_release(uint64_t h, CUresult (*real)(CUmemGenericAllocationHandle),
                             void (*release)(unsigned, uint64_t))
{
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = real(h);
    struct vmm_handle *x = rc == CUDA_SUCCESS ? find(h) : NULL;
    if (x != NULL && !x->released) {
        x->released = 1;
        settle(x, release);
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

void fracgpu_vmm_mapped(uint64_t ptr, uint64_t size, uint64_t h)
{
    pthread_mutex_lock(&vmm_mu);
    struct vmm_handle *x = find(h);
    /* A handle imported from elsewhere was counted by whoever created it. */
    if (x != NULL && grow((void **)&maps, &cap_maps, n_maps, sizeof *maps) == 0) {
        maps[n_maps++] = (struct vmm_map){ptr, size, h};
        x->maps++;
    }
    pthread_mutex_unlock(&vmm_mu);
}

CUresult fracgpu_vmm_unmap(uint64_t ptr, uint64_t size, CUresult (*real)(CUdeviceptr, size_t),
                           void (*release)(unsigned, uint64_t))
{
    pthread_mutex_lock(&vmm_mu);
    CUresult rc = real(ptr, size);
    for (size_t j = n_maps; rc == CUDA_SUCCESS && j-- > 0;) {
        struct vmm_map m = maps[j];
        if (m.ptr < ptr || m.ptr - ptr >= size || m.size > size - (m.ptr - ptr))
            continue;
        maps[j] = maps[--n_maps];
        struct vmm_handle *x = find(m.h);
        if (x != NULL && x->maps > 0) {
            x->maps--;
            settle(x, release);
        }
    }
    pthread_mutex_unlock(&vmm_mu);
    return rc;
}

void fracgpu_vmm_reset_after_fork(void)
{
    /* The child owns none of the parent's physical memory. */
    pthread_mutex_init(&vmm_mu, NULL);
    n_handles = 0;
    n_maps = 0;
}
