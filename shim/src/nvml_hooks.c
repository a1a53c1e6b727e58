/*
 * NVML hooks: what nvidia-smi and monitoring inside the container see. The
 * memory of a sliced GPU is the slice, and "used" is the whole container's
 * usage from the shared region (all its processes).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include "shim.h"

enum { NV_UNKNOWN = 0, NV_ACCOUNT = 1, NV_PASS = 2, NV_FAIL_LIMITS = 3, NV_FAIL_NOLIB = 4 };
static int nv_mode;

static int nv_enter(nvmlReturn_t *err)
{
    int m = __atomic_load_n(&nv_mode, __ATOMIC_ACQUIRE);
    if (UNLIKELY(m == NV_UNKNOWN)) {
        if (fracgpu_ensure_core() != 0) {
            m = __atomic_load_n(&G.state, __ATOMIC_ACQUIRE) == ST_FAILED ? NV_FAIL_LIMITS
                                                                         : NV_FAIL_NOLIB;
        } else {
            m = fracgpu_ensure_nvml() == 0 ? (G.limits.whole ? NV_PASS : NV_ACCOUNT)
                                           : NV_FAIL_NOLIB;
            __atomic_store_n(&nv_mode, m, __ATOMIC_RELEASE);
        }
    }
    if (m == NV_FAIL_LIMITS) {
        *err = NVML_ERROR_NO_PERMISSION;
        return -1;
    }
    if (m == NV_FAIL_NOLIB) {
        *err = NVML_ERROR_LIBRARY_NOT_FOUND;
        return -1;
    }
    return m;
}

#define NV_ENTER(name)                                                                           \
    nvmlReturn_t nv_err_;                                                                        \
    int mode_ = nv_enter(&nv_err_);                                                              \
    if (mode_ < 0)                                                                               \
        return nv_err_;                                                                          \
    if (real_##name == NULL)                                                                     \
        return NVML_ERROR_FUNCTION_NOT_FOUND;

EXPORT nvmlReturn_t nvmlInit(void)
{
    NV_ENTER(nvmlInit);
    return real_nvmlInit();
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    NV_ENTER(nvmlInit_v2);
    return real_nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    NV_ENTER(nvmlInitWithFlags);
    return real_nvmlInitWithFlags(flags);
}

/* Slice limit and container usage of an NVML device; 0 if it is not ours. */
static int slice_of(nvmlDevice_t device, uint64_t *limit, uint64_t *used)
{
    char uuid[96];
    if (real_nvmlDeviceGetUUID == NULL ||
        real_nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return 0;
    fracgpu_region_reclaim_dead(G.region);
    for (unsigned i = 0; i < G.limits.device_count; i++) {
        if (strcasecmp(G.limits.dev[i].uuid, uuid) == 0) {
            *limit = G.limits.dev[i].memory_limit;
            *used = __atomic_load_n(&G.region->dev[i].memory_used, __ATOMIC_ACQUIRE);
            return 1;
        }
    }
    *limit = 0; /* a GPU that is not in the limits file has no slice */
    *used = 0;
    return 1;
}

static void apply_slice(unsigned long long *total, unsigned long long *free_b,
                        unsigned long long *used_b, uint64_t limit, uint64_t used)
{
    /* With host fallback the slice may be larger than the GPU: it is still the size. */
    if (limit < *total || G.limits.memory_host_fallback)
        *total = limit;
    *used_b = used;
    *free_b = used < *total ? *total - used : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    NV_ENTER(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo(device, memory);
    uint64_t limit, used;
    if (rc == NVML_SUCCESS && mode_ == NV_ACCOUNT && slice_of(device, &limit, &used))
        apply_slice(&memory->total, &memory->free, &memory->used, limit, used);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    NV_ENTER(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo_v2(device, memory);
    uint64_t limit, used;
    if (rc == NVML_SUCCESS && mode_ == NV_ACCOUNT && slice_of(device, &limit, &used)) {
        memory->reserved = 0;
        apply_slice(&memory->total, &memory->free, &memory->used, limit, used);
    }
    return rc;
}
