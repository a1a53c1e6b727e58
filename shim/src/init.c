/*
 * One-time initialisation, safe when the first call comes from another
 * library's constructor, from several threads at once, or after fork.
 * Nothing happens at load time except resolving the real dlsym: the library
 * is preloaded into every process of the container (ls, sh, ...), and only
 * processes that actually call CUDA or NVML read limits or map the region.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "shim.h"

struct fracgpu_globals G = {.slot = -1};

#define CUHOOK(name, params, args) name##_fn real_##name;
#define NVMLHOOK(name, params, args) name##_fn real_##name;
#include "hooks.def"
#define REAL(name, ret, params) name##_fn real_##name;
#include "real.def"
nvmlDeviceGetUUID_fn real_nvmlDeviceGetUUID;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn next_dlsym;
static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;
static int cuda_ok, nvml_ok;
static __thread int in_init;

/*
 * glibc's dlsym, found without asking the loader by name: the shim exports dlsym
 * and dlvsym itself (dl_hooks.c), and the loader would hand any lookup of those
 * names from the global scope back to the shim. The object that defines dlerror
 * (libc, or libdl before glibc 2.34) defines dlsym too: its dynamic symbol table
 * is searched through its GNU hash table, preferring the default version.
 */
static uintptr_t dyn_ptr(const struct link_map *lm, uintptr_t v)
{
    return v < (uintptr_t)lm->l_addr ? v + (uintptr_t)lm->l_addr : v; /* relocated in place */
}

/* Interposers (sanitizers) call dlsym while they start, before their own strcmp
 * works: nothing on this path may call an interceptable libc function. */
static void *glibc_symbol(const char *name)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1((void *)dlerror, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL)
        return NULL;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL;
    const ElfW(Half) *versym = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB)
            symtab = (const ElfW(Sym) *)dyn_ptr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)dyn_ptr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH)
            gnu = (const uint32_t *)dyn_ptr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_VERSYM)
            versym = (const ElfW(Half) *)dyn_ptr(lm, d->d_un.d_ptr);
    }
    if (symtab == NULL || strtab == NULL || gnu == NULL)
        return NULL;
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = h * 33 + *c;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_words = gnu[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&gnu[4] + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    if (nbuckets == 0)
        return NULL;
    void *found = NULL;
    for (uint32_t i = buckets[h % nbuckets]; i >= symoffset; i++) {
        uint32_t h2 = chain[i - symoffset];
        const ElfW(Sym) *sym = &symtab[i];
        if ((h | 1) == (h2 | 1) && sym->st_shndx != SHN_UNDEF && sym->st_value != 0 &&
            fracgpu_streq(strtab + sym->st_name, name)) {
            found = (void *)(lm->l_addr + sym->st_value);
            if (versym == NULL || !(versym[i] & 0x8000))
                return found; /* the default version */
        }
        if (h2 & 1)
            break;
    }
    return found;
}

static void resolve_next_dlsym(void)
{
    if (__atomic_load_n(&next_dlsym, __ATOMIC_ACQUIRE) != NULL)
        return;
    void *p = glibc_symbol("dlsym");
    __atomic_store_n(&next_dlsym, (dlsym_fn)p, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void fracgpu_load(void)
{
    resolve_next_dlsym();
    fracgpu_dl_note_start();
}

void *fracgpu_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = __atomic_load_n(&next_dlsym, __ATOMIC_ACQUIRE);
    if (UNLIKELY(f == NULL)) {
        resolve_next_dlsym();
        f = next_dlsym;
    }
    return f ? f(handle, name) : NULL;
}

static void after_fork_child(void)
{
    /* The child shares the region but owns none of the parent's device
     * memory: it takes a fresh slot on its first accounted call. */
    G.slot = -1;
    pthread_mutex_init(&slot_mu, NULL);
    fracgpu_table_reset_after_fork();
    fracgpu_vmm_reset_after_fork();
    fracgpu_pool_reset_after_fork();
    fracgpu_pace_reset_after_fork();
    fracgpu_board_reset_after_fork();
    fracgpu_cuda_reset_after_fork();
}

static void fail(const char *msg)
{
    snprintf(G.failure, sizeof G.failure, "%s", msg);
    LOGE("%s; CUDA and NVML calls fail in this container until this is fixed "
         "(fail closed: the container must not silently get a whole GPU)", msg);
    __atomic_store_n(&G.state, ST_FAILED, __ATOMIC_RELEASE);
}

static void core_init(void)
{
    const char *limits_path, *region_path, *node_dir;
    char err[480];
    in_init = 1;
    fracgpu_log_init(getenv(FRACGPU_ENV_LOG_LEVEL));
    fracgpu_paths(&limits_path, &region_path, &node_dir);
    if (fracgpu_limits_load(limits_path, &G.limits, err, sizeof err) != 0) {
        fail(err);
        in_init = 0;
        return;
    }
    if (G.limits.whole) {
        LOGI("limits file says mode=whole: no slicing in this container");
        __atomic_store_n(&G.state, ST_READY, __ATOMIC_RELEASE);
        in_init = 0;
        return;
    }
    if (fracgpu_private_namespace(err, sizeof err)) {
        fail(err);
        in_init = 0;
        return;
    }
    /* The region records the container's limits from the file; a lower limit
     * from this process's environment applies to this process only. */
    G.region = fracgpu_region_open(region_path, &G.limits, err, sizeof err);
    if (G.region == NULL) {
        fail(err);
        in_init = 0;
        return;
    }
    fracgpu_limits_apply_env(&G.limits, getenv(FRACGPU_ENV_MEMORY_LIMIT),
                             getenv(FRACGPU_ENV_CORE_LIMIT));
    for (unsigned i = 0; i < G.limits.device_count; i++) {
        if (G.limits.compute_limit_enabled && G.limits.dev[i].core_limit < 100)
            G.launch_hooks = 1;
        G.board[i] = fracgpu_board_open(node_dir, G.limits.dev[i].uuid);
        if (G.board[i] != NULL)
            G.launch_hooks = 1;
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    LOGI("limits loaded: %u device(s), launch hooks %s, priority %s, host fallback %s",
         G.limits.device_count, G.launch_hooks ? "on" : "off",
         G.limits.priority == 0 ? "high" : "low", G.limits.memory_host_fallback ? "on" : "off");
    __atomic_store_n(&G.state, ST_READY, __ATOMIC_RELEASE);
    in_init = 0;
}

int fracgpu_ensure_core(void)
{
    if (in_init)
        return -1; /* re-entered from our own initialisation */
    pthread_once(&core_once, core_init);
    return __atomic_load_n(&G.state, __ATOMIC_ACQUIRE) == ST_READY ? 0 : -1;
}

int fracgpu_ensure_slot(void)
{
    if (LIKELY(__atomic_load_n(&G.slot, __ATOMIC_ACQUIRE) >= 0))
        return 0;
    char err[200];
    int rc = 0, slot;
    pthread_mutex_lock(&slot_mu);
    if (G.slot < 0) {
        rc = fracgpu_region_register(G.region, &slot, err, sizeof err);
        if (rc == 0)
            __atomic_store_n(&G.slot, slot, __ATOMIC_RELEASE);
        else
            LOGE("%s", err);
    }
    pthread_mutex_unlock(&slot_mu);
    return rc;
}

__attribute__((destructor)) static void fracgpu_unload(void)
{
    /* Normal exit: the driver frees our memory, so give the usage back. */
    if (G.region != NULL && G.slot >= 0)
        fracgpu_region_unregister(G.region, G.slot);
}

static void *open_quiet(const char *soname)
{
    return dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}

static void cuda_init(void)
{
    in_init = 1;
    void *h = open_quiet("libcuda.so.1");
    if (h == NULL) {
        LOGE("cannot load the CUDA driver libcuda.so.1: %s", dlerror());
        in_init = 0;
        return;
    }
#define CUHOOK(name, params, args) real_##name = (name##_fn)fracgpu_real_dlsym(h, #name);
#include "hooks.def"
#define REAL(name, ret, params) real_##name = (name##_fn)fracgpu_real_dlsym(h, #name);
#include "real.def"
    __atomic_store_n(&cuda_ok, 1, __ATOMIC_RELEASE);
    in_init = 0;
}

int fracgpu_ensure_cuda(void)
{
    if (in_init)
        return -1;
    pthread_once(&cuda_once, cuda_init);
    return __atomic_load_n(&cuda_ok, __ATOMIC_ACQUIRE) ? 0 : -1;
}

static void nvml_init(void)
{
    in_init = 1;
    void *h = open_quiet("libnvidia-ml.so.1");
    if (h == NULL) {
        LOGE("cannot load NVML libnvidia-ml.so.1: %s", dlerror());
        in_init = 0;
        return;
    }
#define NVMLHOOK(name, params, args) real_##name = (name##_fn)fracgpu_real_dlsym(h, #name);
#include "hooks.def"
    real_nvmlDeviceGetUUID = (nvmlDeviceGetUUID_fn)fracgpu_real_dlsym(h, "nvmlDeviceGetUUID");
    __atomic_store_n(&nvml_ok, 1, __ATOMIC_RELEASE);
    in_init = 0;
}

int fracgpu_ensure_nvml(void)
{
    if (in_init)
        return -1;
    pthread_once(&nvml_once, nvml_init);
    return __atomic_load_n(&nvml_ok, __ATOMIC_ACQUIRE) ? 0 : -1;
}

/* ---- the lookup table built from hooks.def ---- */
#define CUHOOK(name, params, args) EXPORT CUresult name params;
#define NVMLHOOK(name, params, args) EXPORT nvmlReturn_t name params;
#include "hooks.def"

struct hook_entry { const char *name; void *hook; void **real; };
static const struct hook_entry hook_table[] = {
#define CUHOOK(name, params, args) {#name, (void *)name, (void **)&real_##name},
#define NVMLHOOK(name, params, args) {#name, (void *)name, (void **)&real_##name},
#include "hooks.def"
};
#define N_HOOKS (sizeof hook_table / sizeof hook_table[0])

void *fracgpu_hook_by_name(const char *name)
{
    if (name[0] == 'd' && name[1] == 'l')
        return fracgpu_dl_hook_by_name(name);
    if (!((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v')))
        return NULL;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (strcmp(hook_table[i].name, name) == 0)
            return hook_table[i].hook;
    return NULL;
}

void *fracgpu_hook_for_real(const void *real_fn)
{
    for (size_t i = 0; i < N_HOOKS; i++)
        if (*hook_table[i].real == real_fn)
            return hook_table[i].hook;
    return NULL;
}

/*
 * RTLD_NEXT must mean "after the caller", not "after the shim". glibc takes
 * the caller from dlsym's return address, so for RTLD_NEXT the real dlsym is
 * entered by a tail call (a jump: our frame is gone and the return address is
 * the caller's). tests/shim/test_lookup.py::test_rtld_next_is_relative_to_the_caller
 * fails if the compiler ever stops emitting the jump. Nothing else happens on
 * that path: preloaded allocators and sanitizers call dlsym(RTLD_NEXT, ...)
 * while they initialise, before malloc or our constructor work.
 */
EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *dlsym(void *handle,
                                                                       const char *name)
{
    if (handle == RTLD_NEXT) {
        void *h = fracgpu_hook_by_name(name);
        if (UNLIKELY(h != NULL))
            return h;
        dlsym_fn f = __atomic_load_n(&next_dlsym, __ATOMIC_ACQUIRE);
        if (UNLIKELY(f == NULL)) {
            resolve_next_dlsym();
            f = next_dlsym;
        }
        return f(handle, name); /* tail call: keeps the caller's return address */
    }
    void *p = fracgpu_real_dlsym(handle, name);
    if (p != NULL) {
        void *h = fracgpu_hook_by_name(name);
        if (h != NULL)
            return h;
    }
    return p;
}
