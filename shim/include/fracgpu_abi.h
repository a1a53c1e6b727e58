/*
 * fracgpu shim ABI: the limits file the agent writes and the shared accounting
 * region the shim keeps. fracgpu/shim_abi.py mirrors every value here and
 * tests/core/test_shim_abi.py parses this header to keep the two in step.
 * Changing a layout means bumping the matching version.
 */
#ifndef FRACGPU_ABI_H
#define FRACGPU_ABI_H

/* ---- paths inside a container (compile-time constants in production) ---- */
#define FRACGPU_LIMITS_PATH "/etc/fracgpu/limits"
#define FRACGPU_REGION_PATH "/var/run/fracgpu/region"
#define FRACGPU_LIBRARY_PATH "/usr/local/fracgpu/lib/libfracgpu.so"

/* ---- limits file: UTF-8, one key=value per line, '#' comments ---- */
#define FRACGPU_LIMITS_VERSION 1
#define FRACGPU_LIMITS_MAX_BYTES 65536
#define FRACGPU_LIMITS_MAX_LINE 1024
#define FRACGPU_KEY_VERSION "version"
#define FRACGPU_KEY_MODE "mode"
#define FRACGPU_KEY_NAMESPACE "namespace"
#define FRACGPU_KEY_POD "pod"
#define FRACGPU_KEY_CONTAINER "container"
#define FRACGPU_KEY_POD_UID "pod_uid"
#define FRACGPU_KEY_DEVICE_COUNT "device_count"
#define FRACGPU_KEY_COMPUTE_LIMIT_ENABLED "compute_limit_enabled"
#define FRACGPU_KEY_BURST_WHEN_ALONE "burst_when_alone"
#define FRACGPU_KEY_PRIORITY "priority"
#define FRACGPU_KEY_CONTEXT_OVERHEAD_BYTES "context_overhead_bytes"
#define FRACGPU_KEY_MEMORY_HOST_FALLBACK "memory_host_fallback"
#define FRACGPU_DEVICE_KEY_PREFIX "device."
#define FRACGPU_DEVICE_KEY_UUID "uuid"
#define FRACGPU_DEVICE_KEY_MEMORY_LIMIT_BYTES "memory_limit_bytes"
#define FRACGPU_DEVICE_KEY_CORE_LIMIT "core_limit"
#define FRACGPU_DEVICE_KEY_CORE_LIMIT_MAX "core_limit_max"
#define FRACGPU_MODE_SLICED "sliced"
#define FRACGPU_MODE_WHOLE "whole"
#define FRACGPU_PRIORITY_HIGH 0
#define FRACGPU_PRIORITY_LOW 1
#define FRACGPU_DEFAULT_PRIORITY 1
#define FRACGPU_DEFAULT_COMPUTE_LIMIT_ENABLED 1
#define FRACGPU_DEFAULT_BURST_WHEN_ALONE 0
#define FRACGPU_DEFAULT_CONTEXT_OVERHEAD_BYTES 0
#define FRACGPU_DEFAULT_MEMORY_HOST_FALLBACK 0
#define FRACGPU_MAX_STRING 253
#define FRACGPU_UUID_MAX 64

/* ---- environment: may only lower a limit or raise log verbosity ---- */
#define FRACGPU_ENV_MEMORY_LIMIT "FRACGPU_MEMORY_LIMIT"
#define FRACGPU_ENV_CORE_LIMIT "FRACGPU_CORE_LIMIT"
#define FRACGPU_ENV_LOG_LEVEL "FRACGPU_LOG_LEVEL"

/* ---- shared accounting region (little-endian, naturally aligned) ---- */
#define FRACGPU_REGION_MAGIC 0x3155504743415246ULL /* "FRACGPU1" */
#define FRACGPU_REGION_VERSION 2
#define FRACGPU_REGION_SIZE 131072
#define FRACGPU_MAX_DEVICES 16
#define FRACGPU_MAX_PROCS 256

/* header */
#define FRACGPU_HDR_OFF_MAGIC 0
#define FRACGPU_HDR_OFF_VERSION 8
#define FRACGPU_HDR_OFF_REGION_SIZE 12
#define FRACGPU_HDR_OFF_MAX_DEVICES 16
#define FRACGPU_HDR_OFF_MAX_PROCS 20
#define FRACGPU_HDR_OFF_DEVICE_COUNT 24
#define FRACGPU_HDR_OFF_PRIORITY 28
#define FRACGPU_HDR_OFF_CREATED_NS 32
#define FRACGPU_HDR_OFF_RECLAIMED_PROCS 40
#define FRACGPU_HDR_OFF_LOCK 64
#define FRACGPU_HDR_LOCK_SIZE 64
#define FRACGPU_HDR_SIZE 256

/* per-device record, FRACGPU_MAX_DEVICES of them after the header */
#define FRACGPU_DEVICES_OFF 256
#define FRACGPU_DEV_SIZE 192
#define FRACGPU_DEV_OFF_UUID 0
#define FRACGPU_DEV_UUID_SIZE 48
#define FRACGPU_DEV_OFF_MEMORY_LIMIT 48
#define FRACGPU_DEV_OFF_MEMORY_USED 56
#define FRACGPU_DEV_OFF_MEMORY_PEAK 64
#define FRACGPU_DEV_OFF_OOM_REJECTIONS 72
#define FRACGPU_DEV_OFF_KERNEL_LAUNCHES 80
#define FRACGPU_DEV_OFF_KERNEL_TIME_NS 88
#define FRACGPU_DEV_OFF_THROTTLE_NS 96
#define FRACGPU_DEV_OFF_PACE_TAT_NS 104
#define FRACGPU_DEV_OFF_CORE_LIMIT 112
#define FRACGPU_DEV_OFF_ACTIVE_LAUNCH_NS 120
#define FRACGPU_DEV_OFF_MEMORY_HOST_USED 128
#define FRACGPU_DEV_OFF_HOST_ALLOCATIONS 136

/* process slots, FRACGPU_MAX_PROCS of them after the devices */
#define FRACGPU_SLOTS_OFF 3328
/* header and devices: the part of a region the agent reads for the boards */
#define FRACGPU_REGION_HEAD_SIZE 3328
#define FRACGPU_SLOT_SIZE 320
#define FRACGPU_SLOT_OFF_PID 0
#define FRACGPU_SLOT_OFF_STATE 4
#define FRACGPU_SLOT_OFF_START_TIME 8
#define FRACGPU_SLOT_OFF_USED 16
#define FRACGPU_SLOT_OFF_HOST_USED 144
#define FRACGPU_SLOT_STATE_FREE 0
#define FRACGPU_SLOT_STATE_ACTIVE 1

/* ---- node priority board: one file per GPU in a directory mounted read-only
 * into every container. Only the agent writes it, from what each container's
 * shim announces in its own region (dev[].active_launch_ns) and from the
 * limits the agent itself wrote (priority): no container can write anything
 * another container reads. The shim reads it with pread (never mmap), so a
 * short or garbage file cannot fault it, and bounds every value it reads.
 * A board is whole when sequence == sequence_end (the agent bumps both). ---- */
#define FRACGPU_NODE_DIR "/var/run/fracgpu-node"
#define FRACGPU_BOARD_MAGIC 0x45444f4e43415246ULL /* "FRACNODE" */
#define FRACGPU_BOARD_VERSION 2
#define FRACGPU_BOARD_SIZE 4096
#define FRACGPU_BOARD_OFF_MAGIC 0
#define FRACGPU_BOARD_OFF_VERSION 8
#define FRACGPU_BOARD_OFF_SIZE 12
#define FRACGPU_BOARD_OFF_HIGH_ACTIVE_UNTIL_NS 16
#define FRACGPU_BOARD_OFF_PUBLISHED_NS 24
#define FRACGPU_BOARD_OFF_SEQUENCE 32
#define FRACGPU_BOARD_OFF_ENTRY_COUNT 40
#define FRACGPU_BOARD_HIGH_HOLD_NS 50000000
/* containers on the GPU: entries of {container id (its region's created_ns; 0:
 * not known for sure), last launch ns}, CLOCK_MONOTONIC */
#define FRACGPU_BOARD_OFF_ENTRIES 64
#define FRACGPU_BOARD_ENTRY_SIZE 16
#define FRACGPU_BOARD_MAX_ENTRIES 64
#define FRACGPU_BOARD_OFF_SEQUENCE_END 1088
#define FRACGPU_BOARD_READ_SIZE 1096 /* the bytes a reader needs */
#define FRACGPU_BOARD_ALONE_NS 1000000000
/* a board the agent has not published for this long is not trusted to say "alone" */
#define FRACGPU_BOARD_STALE_NS 2000000000
/* the shim re-reads a board at most this often */
#define FRACGPU_BOARD_REFRESH_NS 2000000

#ifndef FRACGPU_ABI_NO_STRUCTS
#include <stdint.h>

struct fracgpu_region_header {
    uint64_t magic;
    uint32_t version;
    uint32_t region_size;
    uint32_t max_devices;
    uint32_t max_procs;
    uint32_t device_count;
    uint32_t priority;
    uint64_t created_ns;
    uint64_t reclaimed_procs;
    uint8_t reserved0[16];
    uint8_t lock[FRACGPU_HDR_LOCK_SIZE]; /* pthread_mutex_t, robust + shared */
    uint8_t reserved1[128];
};

struct fracgpu_region_device {
    char uuid[FRACGPU_DEV_UUID_SIZE];
    uint64_t memory_limit;
    uint64_t memory_used;
    uint64_t memory_peak;
    uint64_t oom_rejections;
    uint64_t kernel_launches;
    uint64_t kernel_time_ns;
    uint64_t throttle_ns;
    uint64_t pace_tat_ns;     /* pacing: theoretical arrival time, CLOCK_MONOTONIC */
    uint32_t core_limit;
    uint32_t reserved0;
    uint64_t active_launch_ns; /* last launch time, CLOCK_MONOTONIC: read by the agent for the board */
    uint64_t memory_host_used; /* part of memory_used served from host memory */
    uint64_t host_allocations; /* allocations served from host memory, ever */
    uint8_t reserved1[FRACGPU_DEV_SIZE - FRACGPU_DEV_OFF_HOST_ALLOCATIONS - 8];
};

struct fracgpu_region_slot {
    int32_t pid;
    uint32_t state;
    uint64_t start_time; /* /proc/<pid>/stat field 22, guards against pid reuse */
    uint64_t used[FRACGPU_MAX_DEVICES];      /* device and host memory per device */
    uint64_t host_used[FRACGPU_MAX_DEVICES]; /* the part of used[] served from host memory */
    uint8_t reserved[FRACGPU_SLOT_SIZE - FRACGPU_SLOT_OFF_HOST_USED - 8 * FRACGPU_MAX_DEVICES];
};

struct fracgpu_region {
    struct fracgpu_region_header hdr;
    struct fracgpu_region_device dev[FRACGPU_MAX_DEVICES];
    struct fracgpu_region_slot slot[FRACGPU_MAX_PROCS];
    uint8_t pad[FRACGPU_REGION_SIZE - FRACGPU_SLOTS_OFF - FRACGPU_MAX_PROCS * FRACGPU_SLOT_SIZE];
};
struct fracgpu_board {
    uint64_t magic;
    uint32_t version;
    uint32_t size;
    uint64_t high_active_until_ns; /* CLOCK_MONOTONIC, node-wide */
    uint64_t published_ns;         /* when the agent last wrote it */
    uint64_t sequence;
    uint32_t entry_count;
    uint8_t reserved0[FRACGPU_BOARD_OFF_ENTRIES - 44];
    struct {
        uint64_t id;             /* the container's region creation time; 0: ambiguous */
        uint64_t last_active_ns; /* CLOCK_MONOTONIC of its last launch */
    } entry[FRACGPU_BOARD_MAX_ENTRIES];
    uint64_t sequence_end;
    uint8_t reserved1[FRACGPU_BOARD_SIZE - FRACGPU_BOARD_OFF_SEQUENCE_END - 8];
};
#endif /* FRACGPU_ABI_NO_STRUCTS */

#endif /* FRACGPU_ABI_H */
