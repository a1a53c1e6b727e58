/*
 * libnvidia-ml.so.1 test double: the NVML calls that pynvml, the agent and
 * the shim make. Device facts come from the config file; memory use and
 * running processes from the state shared with the libcuda double. The config
 * is re-read when it changes, so a test can inject errors into a running
 * process (device.<i>.nvml_error.<function>=<code>), and XID events are lines
 * appended to events_file ("<uuid or index> <xid>").
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include "fake.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st { unsigned index; };
struct nvmlEventSet_st {
    unsigned long long mask[FAKE_MAX_DEVICES];
    off_t offset;
    char pending[1024];
    size_t pending_len;
};

static struct nvmlDevice_st handles[FAKE_MAX_DEVICES] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};
static int init_count;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t util_busy[FAKE_MAX_DEVICES], util_at[FAKE_MAX_DEVICES];

static const struct fake_config *cfg(void) { return fake_config(1); }

static nvmlReturn_t global_error(const char *fn)
{
    const struct fake_config *c = cfg();
    return c->n_nvml_errors ? fake_error_for(c->nvml_errors, c->n_nvml_errors, fn) : 0;
}

/* Validates the handle and applies injected errors for this device. */
static nvmlReturn_t dev_of(nvmlDevice_t h, const char *fn, const struct fake_dev **out)
{
    if (!__atomic_load_n(&init_count, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    const struct fake_config *c = cfg();
    if (h == NULL || h < &handles[0] || h >= &handles[FAKE_MAX_DEVICES] ||
        h->index >= c->device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_dev *d = &c->dev[h->index];
    int e = fake_error_for(d->errors, d->n_errors, fn);
    if (!e)
        e = global_error(fn);
    if (e)
        return e;
    *out = d;
    return NVML_SUCCESS;
}

#define DEV(fn)                                                                                  \
    const struct fake_dev *d_;                                                                   \
    nvmlReturn_t rc_ = dev_of(device, fn, &d_);                                                  \
    if (rc_ != NVML_SUCCESS)                                                                     \
        return rc_;

static nvmlReturn_t do_init(const char *fn)
{
    nvmlReturn_t e = global_error(fn);
    if (e)
        return e;
    __atomic_fetch_add(&init_count, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    int n = __atomic_load_n(&init_count, __ATOMIC_ACQUIRE);
    while (n > 0 && !__atomic_compare_exchange_n(&init_count, &n, n - 1, 0, __ATOMIC_ACQ_REL,
                                                 __ATOMIC_ACQUIRE)) {
    }
    return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t need_init(const char *fn)
{
    if (!__atomic_load_n(&init_count, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    return global_error(fn);
}

static nvmlReturn_t copy_str(char *buf, unsigned len, const char *s)
{
    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
    nvmlReturn_t e = need_init("nvmlSystemGetDriverVersion");
    return e ? e : copy_str(v, len, cfg()->driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    nvmlReturn_t e = need_init("nvmlSystemGetCudaDriverVersion");
    if (e)
        return e;
    if (v == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = cfg()->cuda_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return nvmlSystemGetCudaDriverVersion(v);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    nvmlReturn_t e = need_init("nvmlDeviceGetCount");
    if (e)
        return e;
    if (n == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = cfg()->device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *device)
{
    nvmlReturn_t e = need_init("nvmlDeviceGetHandleByIndex");
    if (e)
        return e;
    if (device == NULL || i >= cfg()->device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_dev *d = &cfg()->dev[i];
    e = fake_error_for(d->errors, d->n_errors, "nvmlDeviceGetHandleByIndex");
    if (e)
        return e;
    *device = &handles[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(i, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t e = need_init("nvmlDeviceGetHandleByUUID");
    if (e)
        return e;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_config *c = cfg();
    for (unsigned i = 0; i < c->device_count; i++) {
        if (strcasecmp(c->dev[i].uuid, uuid) == 0) {
            *device = &handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEV("nvmlDeviceGetIndex");
    (void)d_;
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int len)
{
    DEV("nvmlDeviceGetUUID");
    return copy_str(uuid, len, d_->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int len)
{
    DEV("nvmlDeviceGetName");
    return copy_str(name, len, d_->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    DEV("nvmlDeviceGetMinorNumber");
    *minor = d_->minor;
    return NVML_SUCCESS;
}

static void memory_of(nvmlDevice_t device, const struct fake_dev *d, unsigned long long *total,
                      unsigned long long *used, unsigned long long *free_b)
{
    uint64_t u = __atomic_load_n(&fake_state()->mem_used[device->index], __ATOMIC_ACQUIRE);
    *total = d->memory;
    *used = u;
    *free_b = u < d->memory ? d->memory - u : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
    DEV("nvmlDeviceGetMemoryInfo");
    if (m == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory_of(device, d_, &m->total, &m->used, &m->free);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
    DEV("nvmlDeviceGetMemoryInfo_v2");
    if (m == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory_of(device, d_, &m->total, &m->used, &m->free);
    m->reserved = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *p)
{
    DEV("nvmlDeviceGetPciInfo");
    if (p == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(p, 0, sizeof *p);
    unsigned dom = 0, bus = 0, dv = 0, fn = 0;
    sscanf(d_->pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &dv, &fn);
    snprintf(p->busId, sizeof p->busId, "%s", d_->pci_bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04x:%02x:%02x.%x", dom & 0xffff, bus, dv, fn);
    p->domain = dom;
    p->bus = bus;
    p->device = dv;
    p->pciDeviceId = 0x20b010de;
    p->pciSubSystemId = 0x134f10de;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    return nvmlDeviceGetPciInfo_v3(d, p);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    return nvmlDeviceGetPciInfo_v3(d, p);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *cur, unsigned int *pend)
{
    DEV("nvmlDeviceGetMigMode");
    if (cur == NULL || pend == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cur = *pend = d_->mig_mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u)
{
    DEV("nvmlDeviceGetUtilizationRates");
    if (u == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    u->memory = 0;
    if (d_->utilization >= 0) {
        u->gpu = (unsigned)d_->utilization;
        return NVML_SUCCESS;
    }
    /* Busy share of the simulated device since this process last asked. */
    unsigned i = device->index;
    uint64_t busy = __atomic_load_n(&fake_state()->busy_ns[i], __ATOMIC_ACQUIRE), now = fake_now_ns();
    pthread_mutex_lock(&mu);
    uint64_t db = busy - util_busy[i], dt = util_at[i] ? now - util_at[i] : 0;
    util_busy[i] = busy;
    util_at[i] = now;
    pthread_mutex_unlock(&mu);
    u->gpu = dt ? (unsigned)(db * 100 / dt > 100 ? 100 : db * 100 / dt) : 0;
    return NVML_SUCCESS;
}

/* The compute processes holding memory on a device, as the driver lists them: every
 * process on the GPU, whichever container it runs in, by its PID on the host. */
static unsigned compute_processes(nvmlDevice_t device, nvmlProcessInfo_t *out, unsigned cap)
{
    struct fake_state *s = fake_state();
    unsigned n = 0;
    for (int i = 0; i < FAKE_MAX_PROCS; i++) {
        int pid = __atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE);
        uint64_t used = __atomic_load_n(&s->procs[i].used[device->index], __ATOMIC_ACQUIRE);
        if (pid <= 0 || used == 0 || !fake_pid_alive(pid))
            continue;
        if (n < cap)
            out[n] = (nvmlProcessInfo_t){(unsigned)pid, used, NVML_VALUE_NOT_AVAILABLE_U32,
                                         NVML_VALUE_NOT_AVAILABLE_U32};
        n++;
    }
    return n;
}

/* One process-list call: the count in *count, entries of `size` bytes (the unversioned
 * entry points write only pid and memory) when there is room. The double has no graphics
 * or MPS clients: those lists are empty. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, size_t size,
                              int compute, const char *fn)
{
    DEV(fn);
    (void)d_;
    if (count == NULL || (infos == NULL && *count > 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t found[FAKE_MAX_PROCS];
    unsigned n = compute ? compute_processes(device, found, FAKE_MAX_PROCS) : 0, cap = *count;
    *count = n;
    if (n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++)
        memcpy((char *)infos + i * size, &found[i], size);
    return NVML_SUCCESS;
}

#define PROCESS_LISTS(kind, compute)                                                               \
    EXPORT nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses_v3(nvmlDevice_t d, unsigned *c,      \
                                                                 nvmlProcessInfo_t *p)             \
    {                                                                                              \
        return processes(d, c, p, sizeof *p, compute, "nvmlDeviceGet" #kind "RunningProcesses");   \
    }                                                                                              \
    EXPORT nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses_v2(nvmlDevice_t d, unsigned *c,      \
                                                                 nvmlProcessInfo_t *p)             \
    {                                                                                              \
        return processes(d, c, p, sizeof *p, compute, "nvmlDeviceGet" #kind "RunningProcesses");   \
    }                                                                                              \
    EXPORT nvmlReturn_t nvmlDeviceGet##kind##RunningProcesses(nvmlDevice_t d, unsigned *c,         \
                                                              nvmlProcessInfo_v1_t *p)             \
    {                                                                                              \
        return processes(d, c, p, sizeof *p, compute, "nvmlDeviceGet" #kind "RunningProcesses");   \
    }
PROCESS_LISTS(Compute, 1)
PROCESS_LISTS(Graphics, 0)
PROCESS_LISTS(MPSCompute, 0)

EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                          nvmlProcessDetailList_t *list)
{
    DEV("nvmlDeviceGetRunningProcessDetailList");
    (void)d_;
    if (list == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (list->version != NVML_PROCESS_DETAIL_LIST_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (list->mode > NVML_PROCESS_MODE_MPS)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t found[FAKE_MAX_PROCS];
    unsigned n = list->mode == NVML_PROCESS_MODE_COMPUTE
                     ? compute_processes(device, found, FAKE_MAX_PROCS)
                     : 0;
    unsigned cap = list->procArray != NULL ? list->numProcArrayEntries : 0;
    list->numProcArrayEntries = n;
    if (n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++)
        list->procArray[i] = (nvmlProcessDetail_v1_t){found[i].pid, found[i].usedGpuMemory,
                                                       found[i].gpuInstanceId,
                                                       found[i].computeInstanceId, 0};
    return NVML_SUCCESS;
}

/* A sample per compute process (the double keeps no per-process busy time: 0 %). */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long lastSeenTimeStamp)
{
    DEV("nvmlDeviceGetProcessUtilization");
    (void)d_;
    (void)lastSeenTimeStamp;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t found[FAKE_MAX_PROCS];
    unsigned n = compute_processes(device, found, FAKE_MAX_PROCS), cap = *count;
    *count = n;
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (samples == NULL || n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    unsigned long long now = fake_now_ns() / 1000;
    for (unsigned i = 0; i < n; i++)
        samples[i] = (nvmlProcessUtilizationSample_t){found[i].pid, now, 0, 0, 0, 0};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                          nvmlProcessesUtilizationInfo_t *info)
{
    DEV("nvmlDeviceGetProcessesUtilizationInfo");
    (void)d_;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != NVML_PROCESSES_UTILIZATION_INFO_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlProcessInfo_t found[FAKE_MAX_PROCS];
    unsigned n = compute_processes(device, found, FAKE_MAX_PROCS);
    unsigned cap = info->procUtilArray != NULL ? info->processSamplesCount : 0;
    info->processSamplesCount = n;
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    unsigned long long now = fake_now_ns() / 1000;
    for (unsigned i = 0; i < n; i++)
        info->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){now, found[i].pid, 0, 0, 0, 0,
                                                                   0, 0};
    return NVML_SUCCESS;
}

/* Accounting is off unless the config turns it on (device.N.accounting_mode=1), as on a
 * real GPU; when on, every compute process is listed, and its stats are not kept. */
EXPORT nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count,
                                                unsigned int *pids)
{
    DEV("nvmlDeviceGetAccountingPids");
    if (!d_->accounting_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t found[FAKE_MAX_PROCS];
    unsigned n = compute_processes(device, found, FAKE_MAX_PROCS), cap = *count;
    *count = n;
    if (pids == NULL || n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++)
        pids[i] = found[i].pid;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid,
                                                 nvmlAccountingStats_t *stats)
{
    DEV("nvmlDeviceGetAccountingStats");
    (void)pid;
    (void)stats;
    return d_->accounting_mode ? NVML_ERROR_NOT_FOUND : NVML_ERROR_NOT_SUPPORTED;
}

/* ---- events ---- */

#define SUPPORTED_EVENTS \
    (NVML_EVENT_TYPE_SINGLE_BIT_ECC | NVML_EVENT_TYPE_DOUBLE_BIT_ECC | NVML_EVENT_TYPE_XID_CRITICAL)

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *t)
{
    DEV("nvmlDeviceGetSupportedEventTypes");
    (void)d_;
    *t = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

static off_t file_size(const char *path)
{
    int fd = path[0] ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0)
        return 0;
    off_t n = lseek(fd, 0, SEEK_END);
    close(fd);
    return n < 0 ? 0 : n;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t e = need_init("nvmlEventSetCreate");
    if (e)
        return e;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    s->offset = file_size(cfg()->events_file); /* only events from now on */
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             nvmlEventSet_t set)
{
    DEV("nvmlDeviceRegisterEvents");
    (void)d_;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[device->index] |= types;
    return NVML_SUCCESS;
}

/* One complete new line from the events file, or 0. */
static int next_line(nvmlEventSet_t set, char *line, size_t cap)
{
    const char *path = cfg()->events_file;
    int fd = path[0] ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0)
        return 0;
    char buf[512];
    ssize_t n = pread(fd, buf, sizeof buf - 1, set->offset);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *nl = memchr(buf, '\n', (size_t)n);
    if (nl == NULL)
        return 0; /* a line still being written */
    size_t len = (size_t)(nl - buf);
    set->offset += (off_t)len + 1;
    if (len >= cap)
        len = cap - 1;
    memcpy(line, buf, len);
    line[len] = '\0';
    return 1;
}

static int match_event(nvmlEventSet_t set, const char *line, nvmlEventData_t *data)
{
    char who[96];
    unsigned long long xid;
    if (sscanf(line, "%95s %llu", who, &xid) != 2)
        return 0;
    const struct fake_config *c = cfg();
    for (unsigned i = 0; i < c->device_count; i++) {
        char idx[16];
        snprintf(idx, sizeof idx, "%u", i);
        if (strcasecmp(c->dev[i].uuid, who) != 0 && strcmp(idx, who) != 0)
            continue;
        if (!(set->mask[i] & NVML_EVENT_TYPE_XID_CRITICAL))
            return 0;
        memset(data, 0, sizeof *data);
        data->device = &handles[i];
        data->eventType = NVML_EVENT_TYPE_XID_CRITICAL;
        data->eventData = xid;
        data->gpuInstanceId = data->computeInstanceId = 0xffffffffu;
        return 1;
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms)
{
    nvmlReturn_t e = need_init("nvmlEventSetWait");
    if (e)
        return e;
    if (set == NULL || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t deadline = fake_now_ns() + (uint64_t)timeoutms * 1000000ull;
    char line[256];
    for (;;) {
        while (next_line(set, line, sizeof line))
            if (match_event(set, line, data))
                return NVML_SUCCESS;
        if (fake_now_ns() >= deadline)
            return NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    free(set);
    return NVML_SUCCESS;
}
