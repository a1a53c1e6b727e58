/*
 * The dynamic loader's other doors to the driver, closed in sliced containers:
 *
 * - dlopen(..., RTLD_DEEPBIND): a library opened that way binds its own references
 *   (cuMemAlloc_v2, and dlsym itself) to its dependencies before the global scope,
 *   so to libcuda and glibc rather than to the preloaded shim. The flag is dropped.
 * - dlmopen(LM_ID_NEWLM or any namespace but the base one): a private link-map
 *   namespace gets its own libcuda and no shim (preloads live in the base namespace
 *   only). Refused, with a message dlerror() shows.
 * - dlvsym(handle, "cuMemAlloc_v2", "<anything>"): libcuda's symbols are unversioned,
 *   which dlvsym accepts for any version. Answered like dlsym: the hook.
 * - dlsym/dlvsym of "dlopen", "dlmopen", "dlsym", "dlvsym" on any handle (glibc's own
 *   functions found through libc's handle) return these hooks.
 *
 * dlopen and dlmopen enter glibc by a tail call, so the caller's return address is the
 * one glibc sees (the caller's RUNPATH and $ORIGIN search the library, as without the
 * shim). A process whose limits file says mode=whole keeps every flag and namespace.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlopen_fn next_dlopen;
static dlmopen_fn next_dlmopen;
static dlvsym_fn next_dlvsym;
static int audit_at_load; /* LD_AUDIT was set when the process started */

#define NEXT(var, type, name)                                                                    \
    ({                                                                                           \
        type f_ = __atomic_load_n(&var, __ATOMIC_ACQUIRE);                                       \
        if (UNLIKELY(f_ == NULL)) {                                                              \
            f_ = (type)fracgpu_real_dlsym(RTLD_NEXT, name);                                      \
            __atomic_store_n(&var, f_, __ATOMIC_RELEASE);                                        \
        }                                                                                        \
        f_;                                                                                      \
    })

void fracgpu_dl_note_start(void)
{
    const char *a = getenv("LD_AUDIT");
    audit_at_load = a != NULL && a[0] != '\0';
}

/* 1 unless this container's limits say mode=whole (a container whose limits cannot be
 * read is treated as sliced: fail closed). */
static int sliced(void)
{
    if (fracgpu_ensure_core() != 0)
        return 1;
    return !G.limits.whole;
}

/* glibc >= 2.35 chains one r_debug per link-map namespace after the base one
 * (r_version 2); a namespace in use has a non-empty map list. */
struct ns_debug {
    struct r_debug base;
    struct ns_debug *r_next;
};
extern struct r_debug _r_debug;

int fracgpu_private_namespace(char *why, size_t n)
{
    if (audit_at_load) {
        snprintf(why, n, "LD_AUDIT is set: an audit library can rebind every symbol and "
                         "load the CUDA driver in a namespace of its own");
        return 1;
    }
    /* _r_debug is declared as the base struct; the storage is the extended one. */
    struct ns_debug *d = (struct ns_debug *)(void *)&_r_debug;
    __asm__("" : "+r"(d));
    if (__atomic_load_n(&d->base.r_version, __ATOMIC_ACQUIRE) < 2)
        return 0;
    for (struct ns_debug *x = __atomic_load_n(&d->r_next, __ATOMIC_ACQUIRE); x != NULL;
         x = __atomic_load_n(&x->r_next, __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&x->base.r_map, __ATOMIC_ACQUIRE) != NULL) {
            snprintf(why, n, "a private link-map namespace (dlmopen or an audit library) is "
                             "loaded: it can reach the CUDA driver without the shim");
            return 1;
        }
    }
    return 0;
}

EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *dlopen(const char *file,
                                                                        int mode)
{
    dlopen_fn f = NEXT(next_dlopen, dlopen_fn, "dlopen");
    if (UNLIKELY(mode & RTLD_DEEPBIND) && sliced()) {
        LOGW("dlopen(%s): RTLD_DEEPBIND dropped, so the library's CUDA calls reach the shim",
             file ? file : "NULL");
        mode &= ~RTLD_DEEPBIND;
    }
    return f(file, mode); /* tail call: glibc sees the caller */
}

/* Leaves dlerror() naming the refusal: a path under /proc that nobody can create. */
static void *refuse_namespace(void)
{
    dlopen_fn f = NEXT(next_dlopen, dlopen_fn, "dlopen");
    LOGE("dlmopen into a private link-map namespace refused: the CUDA driver loaded there "
         "would not go through the shim (the container's GPU memory slice)");
    void *h = f("/proc/fracgpu: dlmopen into a namespace other than LM_ID_BASE is refused in a "
                "sliced GPU container", RTLD_NOW | RTLD_NOLOAD);
    if (h != NULL)
        dlclose(h);
    return NULL;
}

EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *dlmopen(Lmid_t lmid,
                                                                         const char *file,
                                                                         int mode)
{
    dlmopen_fn f = NEXT(next_dlmopen, dlmopen_fn, "dlmopen");
    if (UNLIKELY(lmid != LM_ID_BASE || (mode & RTLD_DEEPBIND))) {
        if (sliced()) {
            if (lmid != LM_ID_BASE)
                return refuse_namespace();
            mode &= ~RTLD_DEEPBIND;
        }
    }
    return f(lmid, file, mode);
}

EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *dlvsym(void *handle,
                                                                        const char *name,
                                                                        const char *version)
{
    dlvsym_fn f = NEXT(next_dlvsym, dlvsym_fn, "dlvsym");
    const char *n = name;
    __asm__("" : "+r"(n)); /* declared nonnull, but a hostile caller may pass NULL */
    void *h = n != NULL ? fracgpu_hook_by_name(n) : NULL;
    if (UNLIKELY(h != NULL)) {
        if (handle == RTLD_NEXT)
            return h;
        return f(handle, name, version) != NULL ? h : NULL;
    }
    return f(handle, name, version); /* tail call: RTLD_NEXT stays relative to the caller */
}

void *fracgpu_dl_hook_by_name(const char *name)
{
    if (fracgpu_streq(name, "dlopen"))
        return (void *)dlopen;
    if (fracgpu_streq(name, "dlmopen"))
        return (void *)dlmopen;
    if (fracgpu_streq(name, "dlvsym"))
        return (void *)dlvsym;
    if (fracgpu_streq(name, "dlsym"))
        return (void *)dlsym;
    return NULL;
}
