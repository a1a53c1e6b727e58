/* Shared by the libcuda.so.1 and libnvidia-ml.so.1 test doubles. */
#ifndef FRACGPU_FAKE_H
#define FRACGPU_FAKE_H
#include <stdint.h>
#include "fracgpu_cuda.h"

#define FAKE_ENV_CONFIG "FRACGPU_FAKE_GPU_CONFIG"
#define FAKE_MAX_DEVICES 16
#define FAKE_MAX_ERRORS 32
#define FAKE_MAX_PROCS 128

struct fake_error { char fn[64]; int code; };

struct fake_dev {
    char uuid[64];
    unsigned char uuid_bytes[16];
    char name[96];
    uint64_t memory;
    char pci_bus_id[32];
    unsigned minor;
    unsigned mig_mode;
    unsigned accounting_mode; /* 1: nvmlDeviceGetAccountingPids lists the compute processes */
    int utilization; /* -1: derived from simulated kernel time */
    unsigned n_errors;
    struct fake_error errors[FAKE_MAX_ERRORS]; /* NVML errors injected for this device */
};

struct fake_config {
    unsigned device_count;
    char driver_version[32];
    int cuda_version;
    char state_file[512];
    char events_file[512];
    uint64_t context_bytes;
    unsigned multiprocessor_count; /* cuDeviceGetAttribute; stack limits scale with it */
    uint64_t host_memory; /* host memory behind managed allocations */
    unsigned default_kernel_us;
    unsigned n_cuda_errors;
    struct fake_error cuda_errors[FAKE_MAX_ERRORS];
    unsigned n_nvml_errors;
    struct fake_error nvml_errors[FAKE_MAX_ERRORS]; /* not tied to a device */
    struct fake_dev dev[FAKE_MAX_DEVICES];
};

/* Simulated hardware shared by every process using the same state file. */
struct fake_proc { int32_t pid; uint32_t pad; uint64_t used[FAKE_MAX_DEVICES]; uint64_t host_used; };
struct fake_state {
    uint64_t magic;
    uint64_t mem_used[FAKE_MAX_DEVICES];
    uint64_t dev_tail_ns[FAKE_MAX_DEVICES]; /* end of the device's timeline */
    uint64_t busy_ns[FAKE_MAX_DEVICES];     /* simulated kernel time, all processes */
    struct fake_proc procs[FAKE_MAX_PROCS];
    uint64_t host_used; /* managed allocations of all processes */
};

/* reload: re-read the file if it changed since the last call (NVML does,
 * so tests can inject errors into a running agent). */
const struct fake_config *fake_config(int reload);
struct fake_state *fake_state(void);
int fake_error_for(const struct fake_error *errs, unsigned n, const char *fn);
uint64_t fake_now_ns(void);
int fake_pid_alive(int pid);
#endif
