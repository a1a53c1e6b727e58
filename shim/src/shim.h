/* Internal declarations shared by the shim's source files (never exported). */
#ifndef FRACGPU_SHIM_H
#define FRACGPU_SHIM_H
#include <stdint.h>
#include <stddef.h>
#include "fracgpu_abi.h"
#include "fracgpu_cuda.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- logging (stderr only, never stdout) ---- */
enum fracgpu_log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };
HIDDEN void fracgpu_log_init(const char *env_value);
HIDDEN void fracgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
HIDDEN extern int fracgpu_log_level;
#define LOGE(...) fracgpu_log(LOG_ERROR, __VA_ARGS__)
#define LOGW(...) do { if (fracgpu_log_level >= LOG_WARN) fracgpu_log(LOG_WARN, __VA_ARGS__); } while (0)
#define LOGI(...) do { if (fracgpu_log_level >= LOG_INFO) fracgpu_log(LOG_INFO, __VA_ARGS__); } while (0)
#define LOGD(...) do { if (fracgpu_log_level >= LOG_DEBUG) fracgpu_log(LOG_DEBUG, __VA_ARGS__); } while (0)

/* ---- paths: the one place where the test build differs ---- */
HIDDEN void fracgpu_paths(const char **limits_path, const char **region_path, const char **node_dir);

/* ---- limits ---- */
struct fracgpu_device_limits {
    char uuid[FRACGPU_UUID_MAX];
    uint64_t memory_limit;
    unsigned core_limit;     /* percent, 1..100 */
    unsigned core_limit_max; /* elastic upper bound, >= core_limit */
};

struct fracgpu_limits {
    int whole;
    unsigned device_count;
    int compute_limit_enabled;
    int burst_when_alone;
    int priority;
    uint64_t context_overhead;
    int memory_host_fallback; /* serve allocations within the slice from host memory when the GPU is full */
    char ns[FRACGPU_MAX_STRING + 1];
    char pod[FRACGPU_MAX_STRING + 1];
    char container[FRACGPU_MAX_STRING + 1];
    char pod_uid[FRACGPU_MAX_STRING + 1];
    struct fracgpu_device_limits dev[FRACGPU_MAX_DEVICES];
};

HIDDEN int fracgpu_limits_parse(const char *text, size_t len, struct fracgpu_limits *out,
                                char *err, size_t errlen);
HIDDEN int fracgpu_limits_load(const char *path, struct fracgpu_limits *out, char *err,
                               size_t errlen);
HIDDEN void fracgpu_limits_apply_env(struct fracgpu_limits *lim, const char *mem_env,
                                     const char *core_env);
HIDDEN int fracgpu_parse_bytes(const char *s, uint64_t *out);

/* ---- shared region ---- */
HIDDEN struct fracgpu_region *fracgpu_region_open(const char *path, const struct fracgpu_limits *lim,
                                                  char *err, size_t errlen);
HIDDEN int fracgpu_region_register(struct fracgpu_region *r, int *slot_out, char *err,
                                   size_t errlen);
HIDDEN void fracgpu_region_unregister(struct fracgpu_region *r, int slot);
/* 0 on success, -1 if the container's usage would pass limit (this process's
 * limit: the file's, or lower from its environment). */
HIDDEN int fracgpu_region_reserve(struct fracgpu_region *r, int slot, unsigned dev, uint64_t bytes,
                                  uint64_t limit);
/* Gives back a reservation; host: it was served from host memory (to_host). */
HIDDEN void fracgpu_region_release(struct fracgpu_region *r, int slot, unsigned dev, uint64_t bytes,
                                   int host);
/* Marks bytes already reserved on dev as served from host memory. */
HIDDEN void fracgpu_region_to_host(struct fracgpu_region *r, int slot, unsigned dev, uint64_t bytes);
HIDDEN unsigned fracgpu_region_reclaim_dead(struct fracgpu_region *r);
/* The container's live processes holding device memory on dev (host fallback bytes left
 * out): how many there are; the first cap of them in out. */
struct fracgpu_process_usage { int pid; uint64_t device_bytes; };
HIDDEN unsigned fracgpu_region_processes(struct fracgpu_region *r, unsigned dev,
                                         struct fracgpu_process_usage *out, unsigned cap);
HIDDEN uint64_t fracgpu_proc_start_time(int pid);

/* ---- per-process allocation table ---- */
/* ALLOC_HOST_PTR: a linear allocation the shim served from host memory (host fallback). */
/* ALLOC_LIMIT + l: what cuCtxSetLimit(l) takes beyond the default, keyed by context. */
/* ALLOC_POOL_PTR: from a memory pool (ctx field: the pool). ALLOC_EXEC + di: bytes of an
 * exec's memory nodes on limits index di, not yet backed by the graph pool (ctx field:
 * the CUDA ordinal); ALLOC_EXEC_BACKED + di: backed. */
enum fracgpu_alloc_kind { ALLOC_PTR = 1, ALLOC_HANDLE = 2, ALLOC_ARRAY = 3, ALLOC_MIPMAP = 4, ALLOC_CTX = 5,
                          ALLOC_HOST_PTR = 6, ALLOC_POOL_PTR = 7, ALLOC_LIMIT = 16,
                          ALLOC_EXEC = 48, ALLOC_EXEC_BACKED = 64 };
struct fracgpu_alloc { uint64_t key; uint64_t size; uint32_t kind; uint32_t dev; uint64_t ctx; };
HIDDEN int fracgpu_table_put(uint32_t kind, uint64_t key, uint64_t size, unsigned dev, uint64_t ctx);
HIDDEN void fracgpu_table_take_ctx(uint64_t ctx,
                                   void (*release)(unsigned dev, uint64_t size, uint32_t kind));
HIDDEN int fracgpu_table_take(uint32_t kind, uint64_t key, uint64_t *size, unsigned *dev);
HIDDEN int fracgpu_table_take_aux(uint32_t kind, uint64_t key, uint64_t *size, unsigned *dev,
                                  uint64_t *ctx);
HIDDEN void fracgpu_table_reset_after_fork(void);

/* ---- virtual memory management: a handle counts until released and unmapped ---- */
HIDDEN int fracgpu_vmm_created(uint64_t h, uint64_t size, unsigned di);
HIDDEN CUresult fracgpu_vmm_release(uint64_t h, CUresult (*real)(CUmemGenericAllocationHandle),
                                    void (*release)(unsigned, uint64_t));
HIDDEN void fracgpu_vmm_mapped(uint64_t ptr, uint64_t size, uint64_t h);
HIDDEN CUresult fracgpu_vmm_unmap(uint64_t ptr, uint64_t size,
                                  CUresult (*real)(CUdeviceptr, size_t),
                                  void (*release)(unsigned, uint64_t));
HIDDEN void fracgpu_vmm_reset_after_fork(void);

/* ---- memory pools: counted as the driver reserves them (pool.c) ---- */
enum { POOL_MEM = 1, POOL_GRAPH = 2 };
HIDDEN void fracgpu_pool_known(int kind, uint64_t key, int di, CUdevice dev);
HIDDEN int fracgpu_pool_device(int kind, uint64_t key); /* limits index, or -1 */
HIDDEN CUresult fracgpu_pool_take(int kind, uint64_t key, int di, CUdevice dev, uint64_t n,
                                  uint64_t *took);
HIDDEN void fracgpu_pool_untake(int kind, uint64_t key, uint64_t n, uint64_t took);
HIDDEN void fracgpu_pool_put(int kind, uint64_t key, uint64_t n);
HIDDEN void fracgpu_pool_settle(int kind, uint64_t key);
HIDDEN void fracgpu_pool_destroyed(uint64_t key);
HIDDEN uint64_t fracgpu_pool_settle_all(void);
HIDDEN void fracgpu_pool_reset_after_fork(void);

/* ---- global state ---- */
enum fracgpu_state { ST_UNINIT = 0, ST_READY = 1, ST_FAILED = 2 };
struct fracgpu_globals {
    int state;             /* enum fracgpu_state, atomic */
    struct fracgpu_limits limits;
    struct fracgpu_region *region;
    int slot;              /* -1 until registered (again after fork) */
    int launch_hooks;      /* some device is paced or on a priority board */
    struct fracgpu_board_view *board[FRACGPU_MAX_DEVICES]; /* NULL: no priority board */
    char failure[512];
};
HIDDEN extern struct fracgpu_globals G;
HIDDEN int fracgpu_ensure_core(void); /* limits + region; 0 ready, -1 failed */
HIDDEN int fracgpu_ensure_slot(void);

/* ---- driver resolution ---- */
#define CUHOOK(name, params, args) typedef CUresult (*name##_fn) params; HIDDEN extern name##_fn real_##name;
#define NVMLHOOK(name, params, args) typedef nvmlReturn_t (*name##_fn) params; HIDDEN extern name##_fn real_##name;
#include "hooks.def"
#define REAL(name, ret, params) typedef ret (*name##_fn) params; HIDDEN extern name##_fn real_##name;
#include "real.def"
typedef nvmlReturn_t (*nvmlDeviceGetUUID_fn)(nvmlDevice_t, char *, unsigned);
HIDDEN extern nvmlDeviceGetUUID_fn real_nvmlDeviceGetUUID;

HIDDEN int fracgpu_ensure_cuda(void);  /* libcuda resolved */
HIDDEN int fracgpu_ensure_nvml(void);  /* libnvidia-ml resolved */
HIDDEN void *fracgpu_real_dlsym(void *handle, const char *name);
HIDDEN void *fracgpu_hook_for_real(const void *real_fn); /* reverse lookup, NULL if not hooked */
HIDDEN void *fracgpu_hook_by_name(const char *name);
/* strcmp(a, b) == 0 without libc: sanitizers call dlsym before their strcmp works */
static inline int fracgpu_streq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}
/* dl_hooks.c: the loader's doors (RTLD_DEEPBIND, dlmopen, dlvsym) */
HIDDEN void fracgpu_dl_note_start(void);
HIDDEN void *fracgpu_dl_hook_by_name(const char *name);
/* 1 (why filled) if this process has a link-map namespace the shim is not in. */
HIDDEN int fracgpu_private_namespace(char *why, size_t n);
/* Limits index of a CUDA ordinal, or -1 (no limits: fail closed). */
HIDDEN int fracgpu_cuda_dev_index(CUdevice dev);
HIDDEN int fracgpu_current_dev_index(void);
HIDDEN void fracgpu_cuda_reset_after_fork(void);

/* ---- priority board (read-only, written by the agent) ---- */
struct fracgpu_board_view;
/* What a board says, bounded: fresh = 0 says nothing (stale or never published). */
struct fracgpu_board_state { int fresh; uint64_t published, high_until, others_active; };
/* The agent's clock and ours are the same CLOCK_MONOTONIC; a board may be this far ahead. */
#define FRACGPU_BOARD_FUTURE_SLACK_NS 5000000ull
/* 0 with *out filled from a whole board of this format, -1 for anything else (*out zero).
 * fresh: published within FRACGPU_BOARD_STALE_NS; then high_until <= published + hold
 * and others_active <= published. */
HIDDEN int fracgpu_board_parse(const unsigned char *buf, size_t len, uint64_t my_id, uint64_t now,
                               struct fracgpu_board_state *out);
HIDDEN struct fracgpu_board_view *fracgpu_board_open(const char *dir, const char *uuid);
HIDDEN void fracgpu_board_reset_after_fork(void);
/* Waits while high-priority work is active; returns 1 if this launch must be
 * tracked to bound the low-priority container's in-flight work. */
HIDDEN int fracgpu_priority_before(int di);
/* Announces this paced container on the GPU's board; 1 if no other paced or
 * high-priority container was active there recently. */
HIDDEN int fracgpu_board_alone(int di, uint64_t now);
#define FRACGPU_PRIORITY_RECENT_NS 10000000000ull

/* ---- pacing ---- */
/* One launch being measured: two events around it on its stream. di < 0: not measured. */
struct fracgpu_pending { CUevent start, end; uint64_t launch_ns; CUcontext ctx; };
struct fracgpu_pace_token { struct fracgpu_pending p; int di; };
HIDDEN void fracgpu_pace_before(int di, int bounded, CUstream stream, int per_thread,
                                struct fracgpu_pace_token *token);
HIDDEN void fracgpu_pace_after(CUstream stream, int per_thread, struct fracgpu_pace_token *token,
                               CUresult rc);
/* A context is about to be destroyed (NULL: some context, unknown which): its launches
 * still in flight are waited for and charged, its spare events freed. */
HIDDEN void fracgpu_pace_ctx_gone(CUcontext ctx);
HIDDEN void fracgpu_pace_reset_after_fork(void);
HIDDEN uint64_t fracgpu_now_ns(void);

#endif
