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

/* Which of the container's GPUs an NVML device is: 1 with its limits index in *index (-1:
 * a GPU not in the limits file); 0 when the device cannot be named, and the driver's own
 * answer for the handle stands. */
static int limits_index(nvmlDevice_t device, int *index)
{
    char uuid[96];
    if (real_nvmlDeviceGetUUID == NULL ||
        real_nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return 0;
    *index = -1;
    for (unsigned i = 0; i < G.limits.device_count; i++)
        if (strcasecmp(G.limits.dev[i].uuid, uuid) == 0)
            *index = (int)i;
    return 1;
}

/* Slice limit and container usage of an NVML device; 0 if it cannot be named. */
static int slice_of(nvmlDevice_t device, uint64_t *limit, uint64_t *used)
{
    int i;
    if (!limits_index(device, &i))
        return 0;
    fracgpu_region_reclaim_dead(G.region);
    /* a GPU that is not in the limits file has no slice */
    *limit = i < 0 ? 0 : G.limits.dev[i].memory_limit;
    *used = i < 0 ? 0 : __atomic_load_n(&G.region->dev[i].memory_used, __ATOMIC_ACQUIRE);
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

/*
 * Process lists. The driver lists every process on a GPU by its PID on the host, whatever
 * container it runs in (it knows no PID namespaces): on a shared GPU that shows a tenant
 * its neighbours' PIDs and the memory each holds, as often as it cares to look. On a
 * sliced GPU the compute list is the container's own processes instead, from the shared
 * region: their PIDs as the container sees them (what its /proc shows) and the device
 * memory the shim counted for each. Graphics and MPS lists are empty (the slice has no
 * such clients the shim knows of). Per-process utilisation has no samples, and accounting
 * is not supported: both name host PIDs. A whole GPU is the container's alone: the
 * driver's answers pass.
 */
static unsigned listed(int index, int compute, struct fracgpu_process_usage *found)
{
    if (!compute || index < 0)
        return 0;
    return fracgpu_region_processes(G.region, (unsigned)index, found, FRACGPU_MAX_PROCS);
}

static nvmlReturn_t own_processes(int index, int compute, unsigned int *count, void *infos,
                                  size_t size)
{
    if (count == NULL || (infos == NULL && *count > 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fracgpu_process_usage found[FRACGPU_MAX_PROCS];
    unsigned n = listed(index, compute, found), cap = *count;
    *count = n;
    if (n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++) {
        nvmlProcessInfo_t info = {(unsigned)found[i].pid, found[i].device_bytes,
                                  NVML_VALUE_NOT_AVAILABLE_U32, NVML_VALUE_NOT_AVAILABLE_U32};
        memcpy((char *)infos + i * size, &info, size); /* v1 entries: pid and memory only */
    }
    return NVML_SUCCESS;
}

/* A sliced GPU's device index (see limits_index) for the calls answered from the region;
 * 0 where the driver answers. */
static int answered_here(int mode, nvmlDevice_t device, int *index)
{
    return mode == NV_ACCOUNT && limits_index(device, index);
}

/* The driver answers unless the call is answered here; then `index` is the GPU's. */
#define NV_ENTER_ANSWERED(name, args)                                                            \
    NV_ENTER(name);                                                                              \
    int index;                                                                                   \
    if (!answered_here(mode_, device, &index))                                                   \
        return real_##name args;

#define PROCESS_LIST(name, entry, compute)                                                       \
    EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, entry *infos)         \
    {                                                                                            \
        NV_ENTER_ANSWERED(name, (device, infoCount, infos));                                     \
        return own_processes(index, compute, infoCount, infos, sizeof(entry));                   \
    }
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 1)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t, 1)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, 1)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 0)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t, 0)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, 0)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, 0)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t, 0)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, 0)

EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                          nvmlProcessDetailList_t *list)
{
    NV_ENTER_ANSWERED(nvmlDeviceGetRunningProcessDetailList, (device, list));
    if (list == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (list->version != NVML_PROCESS_DETAIL_LIST_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (list->mode > NVML_PROCESS_MODE_MPS)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fracgpu_process_usage found[FRACGPU_MAX_PROCS];
    unsigned n = listed(index, list->mode == NVML_PROCESS_MODE_COMPUTE, found);
    unsigned cap = list->procArray != NULL ? list->numProcArrayEntries : 0;
    list->numProcArrayEntries = n;
    if (n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++)
        list->procArray[i] = (nvmlProcessDetail_v1_t){(unsigned)found[i].pid,
                                                       found[i].device_bytes,
                                                       NVML_VALUE_NOT_AVAILABLE_U32,
                                                       NVML_VALUE_NOT_AVAILABLE_U32, 0};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp)
{
    NV_ENTER_ANSWERED(nvmlDeviceGetProcessUtilization,
                      (device, utilization, processSamplesCount, lastSeenTimeStamp));
    if (processSamplesCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *processSamplesCount = 0;
    return NVML_ERROR_NOT_FOUND; /* what the driver says when it has no samples */
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                          nvmlProcessesUtilizationInfo_t *info)
{
    NV_ENTER_ANSWERED(nvmlDeviceGetProcessesUtilizationInfo, (device, info));
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count,
                                                unsigned int *pids)
{
    NV_ENTER_ANSWERED(nvmlDeviceGetAccountingPids, (device, count, pids));
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid,
                                                 nvmlAccountingStats_t *stats)
{
    NV_ENTER_ANSWERED(nvmlDeviceGetAccountingStats, (device, pid, stats));
    return NVML_ERROR_NOT_SUPPORTED;
}
