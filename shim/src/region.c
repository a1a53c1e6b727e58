/*
 * The shared accounting region: one file per container, mapped by every
 * process of that container. A robust process-shared mutex serialises memory
 * reservations, so a limit check and its reservation are one atomic step, and
 * a holder killed mid-update (SIGKILL) is detected (EOWNERDEAD): per-process
 * slots are the truth and the per-device totals are recomputed from them.
 * Totals and counters are also read without the lock (agent metrics).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

_Static_assert(sizeof(struct fracgpu_region) == FRACGPU_REGION_SIZE, "region size");
_Static_assert(sizeof(struct fracgpu_region_header) == FRACGPU_HDR_SIZE, "header size");
_Static_assert(sizeof(struct fracgpu_region_device) == FRACGPU_DEV_SIZE, "device size");
_Static_assert(sizeof(struct fracgpu_region_slot) == FRACGPU_SLOT_SIZE, "slot size");
_Static_assert(sizeof(pthread_mutex_t) <= FRACGPU_HDR_LOCK_SIZE, "mutex fits");
_Static_assert(offsetof(struct fracgpu_region, dev) == FRACGPU_DEVICES_OFF, "devices offset");
_Static_assert(offsetof(struct fracgpu_region, slot) == FRACGPU_SLOTS_OFF, "slots offset");
_Static_assert(FRACGPU_REGION_HEAD_SIZE == FRACGPU_SLOTS_OFF, "head = header + devices");
_Static_assert(offsetof(struct fracgpu_region_header, version) == FRACGPU_HDR_OFF_VERSION, "");
_Static_assert(offsetof(struct fracgpu_region_header, region_size) == FRACGPU_HDR_OFF_REGION_SIZE, "");
_Static_assert(offsetof(struct fracgpu_region_header, max_devices) == FRACGPU_HDR_OFF_MAX_DEVICES, "");
_Static_assert(offsetof(struct fracgpu_region_header, max_procs) == FRACGPU_HDR_OFF_MAX_PROCS, "");
_Static_assert(offsetof(struct fracgpu_region_header, device_count) == FRACGPU_HDR_OFF_DEVICE_COUNT, "");
_Static_assert(offsetof(struct fracgpu_region_header, priority) == FRACGPU_HDR_OFF_PRIORITY, "");
_Static_assert(offsetof(struct fracgpu_region_header, created_ns) == FRACGPU_HDR_OFF_CREATED_NS, "");
_Static_assert(offsetof(struct fracgpu_region_header, reclaimed_procs) == FRACGPU_HDR_OFF_RECLAIMED_PROCS, "");
_Static_assert(offsetof(struct fracgpu_region_header, lock) == FRACGPU_HDR_OFF_LOCK, "");
_Static_assert(offsetof(struct fracgpu_region_device, memory_limit) == FRACGPU_DEV_OFF_MEMORY_LIMIT, "");
_Static_assert(offsetof(struct fracgpu_region_device, memory_used) == FRACGPU_DEV_OFF_MEMORY_USED, "");
_Static_assert(offsetof(struct fracgpu_region_device, memory_peak) == FRACGPU_DEV_OFF_MEMORY_PEAK, "");
_Static_assert(offsetof(struct fracgpu_region_device, oom_rejections) == FRACGPU_DEV_OFF_OOM_REJECTIONS, "");
_Static_assert(offsetof(struct fracgpu_region_device, kernel_launches) == FRACGPU_DEV_OFF_KERNEL_LAUNCHES, "");
_Static_assert(offsetof(struct fracgpu_region_device, kernel_time_ns) == FRACGPU_DEV_OFF_KERNEL_TIME_NS, "");
_Static_assert(offsetof(struct fracgpu_region_device, throttle_ns) == FRACGPU_DEV_OFF_THROTTLE_NS, "");
_Static_assert(offsetof(struct fracgpu_region_device, pace_tat_ns) == FRACGPU_DEV_OFF_PACE_TAT_NS, "");
_Static_assert(offsetof(struct fracgpu_region_device, core_limit) == FRACGPU_DEV_OFF_CORE_LIMIT, "");
_Static_assert(offsetof(struct fracgpu_region_device, active_launch_ns) == FRACGPU_DEV_OFF_ACTIVE_LAUNCH_NS, "");
_Static_assert(offsetof(struct fracgpu_region_device, memory_host_used) == FRACGPU_DEV_OFF_MEMORY_HOST_USED, "");
_Static_assert(offsetof(struct fracgpu_region_device, host_allocations) == FRACGPU_DEV_OFF_HOST_ALLOCATIONS, "");
_Static_assert(offsetof(struct fracgpu_region_slot, state) == FRACGPU_SLOT_OFF_STATE, "");
_Static_assert(offsetof(struct fracgpu_region_slot, start_time) == FRACGPU_SLOT_OFF_START_TIME, "");
_Static_assert(offsetof(struct fracgpu_region_slot, used) == FRACGPU_SLOT_OFF_USED, "");
_Static_assert(offsetof(struct fracgpu_region_slot, host_used) == FRACGPU_SLOT_OFF_HOST_USED, "");

#define LD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static pthread_mutex_t *region_mutex(struct fracgpu_region *r)
{
    return (pthread_mutex_t *)(void *)r->hdr.lock;
}

/* Per-device totals are derived from the slots; used after a holder died. */
static void recompute_totals(struct fracgpu_region *r)
{
    for (unsigned d = 0; d < FRACGPU_MAX_DEVICES; d++) {
        uint64_t sum = 0, host = 0;
        for (unsigned s = 0; s < FRACGPU_MAX_PROCS; s++) {
            if (LD(&r->slot[s].state) == FRACGPU_SLOT_STATE_ACTIVE) {
                sum += LD(&r->slot[s].used[d]);
                host += LD(&r->slot[s].host_used[d]);
            }
        }
        ST(&r->dev[d].memory_used, sum);
        ST(&r->dev[d].memory_host_used, host);
    }
}

static void lock_region(struct fracgpu_region *r)
{
    int rc = pthread_mutex_lock(region_mutex(r));
    if (rc == EOWNERDEAD) {
        LOGW("a process died while holding the region lock; recounting usage");
        recompute_totals(r);
        pthread_mutex_consistent(region_mutex(r));
    } else if (rc != 0) {
        LOGE("region lock failed: %s", strerror(rc));
    }
}

static void unlock_region(struct fracgpu_region *r)
{
    pthread_mutex_unlock(region_mutex(r));
}

uint64_t fracgpu_proc_start_time(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parens */
    if (p == NULL || p[1] != ' ')
        return 0;
    char state = p[2];
    if (state == 'Z' || state == 'X')
        return 0; /* a zombie holds no GPU memory any more */
    /* field 3 is the state; the start time is field 22 */
    unsigned field = 3;
    for (p += 2; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    unsigned long long t = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        t = t * 10 + (unsigned long long)(*p - '0');
    return t ? t : 1;
}

static int slot_is_dead(const struct fracgpu_region_slot *s)
{
    int pid = LD(&s->pid);
    if (pid <= 0)
        return 1;
    uint64_t start = fracgpu_proc_start_time(pid);
    if (start == 0) {
        /* No /proc entry: fall back to signal 0 (ESRCH = gone). */
        if (kill(pid, 0) == 0 || errno == EPERM)
            return access("/proc/self/stat", R_OK) == 0; /* /proc works: it is a zombie */
        return 1;
    }
    return start != LD(&s->start_time);
}

static void free_slot_locked(struct fracgpu_region *r, unsigned s)
{
    for (unsigned d = 0; d < FRACGPU_MAX_DEVICES; d++) {
        uint64_t u = LD(&r->slot[s].used[d]), h = LD(&r->slot[s].host_used[d]);
        if (u) {
            uint64_t tot = LD(&r->dev[d].memory_used);
            ST(&r->dev[d].memory_used, tot >= u ? tot - u : 0);
            ST(&r->slot[s].used[d], 0);
        }
        if (h) {
            uint64_t tot = LD(&r->dev[d].memory_host_used);
            ST(&r->dev[d].memory_host_used, tot >= h ? tot - h : 0);
            ST(&r->slot[s].host_used[d], 0);
        }
    }
    ST(&r->slot[s].state, FRACGPU_SLOT_STATE_FREE);
    ST(&r->slot[s].pid, 0);
}

static unsigned reclaim_locked(struct fracgpu_region *r, int self_pid)
{
    unsigned n = 0;
    for (unsigned s = 0; s < FRACGPU_MAX_PROCS; s++) {
        struct fracgpu_region_slot *sl = &r->slot[s];
        if (LD(&sl->state) != FRACGPU_SLOT_STATE_ACTIVE || LD(&sl->pid) == self_pid)
            continue;
        if (slot_is_dead(sl)) {
            LOGI("reclaiming slot %u of dead process %d", s, (int)LD(&sl->pid));
            free_slot_locked(r, s);
            __atomic_fetch_add(&r->hdr.reclaimed_procs, 1, __ATOMIC_RELAXED);
            n++;
        }
    }
    return n;
}

unsigned fracgpu_region_reclaim_dead(struct fracgpu_region *r)
{
    lock_region(r);
    unsigned n = reclaim_locked(r, getpid());
    unlock_region(r);
    return n;
}

unsigned fracgpu_region_processes(struct fracgpu_region *r, unsigned dev,
                                  struct fracgpu_process_usage *out, unsigned cap)
{
    lock_region(r);
    reclaim_locked(r, getpid());
    unsigned n = 0;
    for (unsigned s = 0; s < FRACGPU_MAX_PROCS; s++) {
        const struct fracgpu_region_slot *sl = &r->slot[s];
        int pid = LD(&sl->pid);
        uint64_t used = LD(&sl->used[dev]), host = LD(&sl->host_used[dev]);
        if (LD(&sl->state) != FRACGPU_SLOT_STATE_ACTIVE || pid <= 0 || used <= host)
            continue;
        if (n < cap)
            out[n] = (struct fracgpu_process_usage){pid, used - host};
        n++;
    }
    unlock_region(r);
    return n;
}

static int init_new_region(struct fracgpu_region *r, const struct fracgpu_limits *lim)
{
    pthread_mutexattr_t a;
    struct timespec ts;
    memset(r, 0, sizeof *r);
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(region_mutex(r), &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0)
        return -1;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->hdr.version = FRACGPU_REGION_VERSION;
    r->hdr.region_size = FRACGPU_REGION_SIZE;
    r->hdr.max_devices = FRACGPU_MAX_DEVICES;
    r->hdr.max_procs = FRACGPU_MAX_PROCS;
    r->hdr.device_count = lim->device_count;
    r->hdr.priority = (uint32_t)lim->priority;
    r->hdr.created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    for (unsigned i = 0; i < lim->device_count; i++) {
        snprintf(r->dev[i].uuid, sizeof r->dev[i].uuid, "%s", lim->dev[i].uuid);
        r->dev[i].memory_limit = lim->dev[i].memory_limit;
        r->dev[i].core_limit = lim->dev[i].core_limit;
    }
    /* The magic goes in last: a reader that sees it sees a whole header. */
    __atomic_store_n(&r->hdr.magic, FRACGPU_REGION_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

static struct fracgpu_region *map_fd(int fd, char *err, size_t errlen, const char *path)
{
    void *p = mmap(NULL, FRACGPU_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "cannot map region %s: %s", path, strerror(errno));
        return NULL;
    }
    return p;
}

/* Create the region under a private name, then link it into place, so no
 * process ever maps a half-initialised region. */
static int create_region(const char *path, const struct fracgpu_limits *lim, char *err, size_t errlen)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.init.%d", path, (int)getpid());
    unlink(tmp);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create region %s: %s (is the directory writable?)", tmp,
                 strerror(errno));
        return -1;
    }
    fchmod(fd, 0666); /* processes of one container may run as different users */
    /* Blocks taken now, not at the first write through the mapping: on a full file system
     * (the region volume is a small tmpfs) that is an error here, not SIGBUS later. */
    int rc_alloc;
    do
        rc_alloc = posix_fallocate(fd, 0, FRACGPU_REGION_SIZE);
    while (rc_alloc == EINTR);
    if (rc_alloc != 0) {
        snprintf(err, errlen, "cannot size region %s: %s", tmp, strerror(rc_alloc));
        close(fd);
        unlink(tmp);
        return -1;
    }
    struct fracgpu_region *r = map_fd(fd, err, errlen, tmp);
    close(fd);
    if (r == NULL || init_new_region(r, lim) != 0) {
        if (r)
            munmap(r, FRACGPU_REGION_SIZE);
        unlink(tmp);
        snprintf(err, errlen, "cannot initialise region %s", tmp);
        return -1;
    }
    munmap(r, FRACGPU_REGION_SIZE);
    int rc = link(tmp, path);
    int e = errno;
    unlink(tmp);
    if (rc != 0 && e != EEXIST) {
        snprintf(err, errlen, "cannot publish region %s: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

static int appears(const char *path)
{
    for (int i = 0; i < 50; i++) {
        if (access(path, F_OK) == 0)
            return 1;
        usleep(10000);
    }
    return 0;
}

struct fracgpu_region *fracgpu_region_open(const char *path, const struct fracgpu_limits *lim,
                                           char *err, size_t errlen)
{
    int fd = -1;
    for (int attempt = 0; attempt < 3 && fd < 0; attempt++) {
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno == ENOENT) {
            /* Failing that (a full volume), another process may be publishing the region:
             * wait for it a little (up to 0.5 s) before failing closed. */
            if (create_region(path, lim, err, errlen) != 0 && !appears(path))
                return NULL;
            continue;
        }
        if (fd < 0) {
            snprintf(err, errlen, "cannot open region %s read-write: %s", path, strerror(errno));
            return NULL;
        }
    }
    if (fd < 0) {
        snprintf(err, errlen, "cannot open region %s", path);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != FRACGPU_REGION_SIZE) {
        snprintf(err, errlen,
                 "region %s has the wrong size %lld (expected %d bytes): refusing to use it",
                 path, (long long)st.st_size, FRACGPU_REGION_SIZE);
        close(fd);
        return NULL;
    }
    struct fracgpu_region *r = map_fd(fd, err, errlen, path);
    close(fd);
    if (r == NULL)
        return NULL;
    uint64_t magic = __atomic_load_n(&r->hdr.magic, __ATOMIC_ACQUIRE);
    if (magic != FRACGPU_REGION_MAGIC || r->hdr.version != FRACGPU_REGION_VERSION) {
        snprintf(err, errlen,
                 "region %s has magic %#llx version %u, this shim needs magic %#llx version %u: "
                 "refusing to share accounting with an incompatible shim",
                 path, (unsigned long long)magic, r->hdr.version,
                 (unsigned long long)FRACGPU_REGION_MAGIC, FRACGPU_REGION_VERSION);
        munmap(r, FRACGPU_REGION_SIZE);
        return NULL;
    }
    const struct { const char *field; uint32_t got, want; } sizes[] = {
        {"region_size", r->hdr.region_size, FRACGPU_REGION_SIZE},
        {"max_devices", r->hdr.max_devices, FRACGPU_MAX_DEVICES},
        {"max_procs", r->hdr.max_procs, FRACGPU_MAX_PROCS},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].got != sizes[i].want) {
            snprintf(err, errlen,
                     "region %s has header %s %u, this shim needs %u: refusing to share "
                     "accounting with an incompatible shim",
                     path, sizes[i].field, sizes[i].got, sizes[i].want);
            munmap(r, FRACGPU_REGION_SIZE);
            return NULL;
        }
    }
    if (r->hdr.device_count > FRACGPU_MAX_DEVICES) {
        snprintf(err, errlen, "region %s has header device_count %u, at most %d is allowed: "
                 "refusing to use it", path, r->hdr.device_count, FRACGPU_MAX_DEVICES);
        munmap(r, FRACGPU_REGION_SIZE);
        return NULL;
    }
    /* Limits are per container and fixed; refresh them in case the region
     * outlived an agent restart that rewrote them. */
    lock_region(r);
    for (unsigned i = 0; i < lim->device_count; i++) {
        if (strcmp(r->dev[i].uuid, lim->dev[i].uuid) != 0)
            snprintf(r->dev[i].uuid, sizeof r->dev[i].uuid, "%s", lim->dev[i].uuid);
        ST(&r->dev[i].memory_limit, lim->dev[i].memory_limit);
        ST(&r->dev[i].core_limit, lim->dev[i].core_limit);
    }
    unlock_region(r);
    return r;
}

int fracgpu_region_register(struct fracgpu_region *r, int *slot_out, char *err, size_t errlen)
{
    int pid = getpid();
    uint64_t start = fracgpu_proc_start_time(pid);
    int found = -1;
    lock_region(r);
    reclaim_locked(r, pid);
    for (unsigned s = 0; s < FRACGPU_MAX_PROCS; s++) {
        struct fracgpu_region_slot *sl = &r->slot[s];
        if (LD(&sl->state) == FRACGPU_SLOT_STATE_ACTIVE && LD(&sl->pid) == pid) {
            /* Our own pid before exec: that image's CUDA memory is gone. */
            free_slot_locked(r, s);
        }
        if (found < 0 && LD(&sl->state) == FRACGPU_SLOT_STATE_FREE)
            found = (int)s;
    }
    if (found >= 0) {
        struct fracgpu_region_slot *sl = &r->slot[found];
        memset(sl->used, 0, sizeof sl->used);
        memset(sl->host_used, 0, sizeof sl->host_used);
        ST(&sl->start_time, start);
        ST(&sl->pid, pid);
        ST(&sl->state, FRACGPU_SLOT_STATE_ACTIVE);
    }
    unlock_region(r);
    if (found < 0) {
        snprintf(err, errlen, "all %d process slots of the region are in use", FRACGPU_MAX_PROCS);
        return -1;
    }
    *slot_out = found;
    return 0;
}

void fracgpu_region_unregister(struct fracgpu_region *r, int slot)
{
    if (slot < 0)
        return;
    lock_region(r);
    if (LD(&r->slot[slot].pid) == getpid())
        free_slot_locked(r, (unsigned)slot);
    unlock_region(r);
}

int fracgpu_region_reserve(struct fracgpu_region *r, int slot, unsigned dev, uint64_t bytes,
                           uint64_t limit)
{
    struct fracgpu_region_device *d = &r->dev[dev];
    for (int pass = 0; pass < 2; pass++) {
        lock_region(r);
        uint64_t used = LD(&d->memory_used);
        if (bytes <= limit && used <= limit - bytes) {
            /* Slot first: if we die between the two stores, the recount after
             * EOWNERDEAD derives the total from the slots. */
            ST(&r->slot[slot].used[dev], LD(&r->slot[slot].used[dev]) + bytes);
            ST(&d->memory_used, used + bytes);
            if (used + bytes > LD(&d->memory_peak))
                ST(&d->memory_peak, used + bytes);
            unlock_region(r);
            return 0;
        }
        unsigned reclaimed = pass == 0 ? reclaim_locked(r, getpid()) : 0;
        unlock_region(r);
        if (reclaimed == 0)
            break;
    }
    __atomic_fetch_add(&d->oom_rejections, 1, __ATOMIC_RELAXED);
    return -1;
}

void fracgpu_region_release(struct fracgpu_region *r, int slot, unsigned dev, uint64_t bytes,
                            int host)
{
    struct fracgpu_region_device *d = &r->dev[dev];
    struct fracgpu_region_slot *sl = &r->slot[slot];
    lock_region(r);
    uint64_t mine = LD(&sl->used[dev]);
    uint64_t tot = LD(&d->memory_used);
    if (bytes > mine)
        bytes = mine; /* never release more than this process holds */
    if (host) {
        /* Host part first: used[] >= host_used[] holds at every step. */
        uint64_t hmine = LD(&sl->host_used[dev]), htot = LD(&d->memory_host_used);
        uint64_t h = bytes < hmine ? bytes : hmine;
        ST(&sl->host_used[dev], hmine - h);
        ST(&d->memory_host_used, htot >= h ? htot - h : 0);
    }
    ST(&sl->used[dev], mine - bytes);
    ST(&d->memory_used, tot >= bytes ? tot - bytes : 0);
    unlock_region(r);
}

void fracgpu_region_to_host(struct fracgpu_region *r, int slot, unsigned dev, uint64_t bytes)
{
    struct fracgpu_region_device *d = &r->dev[dev];
    struct fracgpu_region_slot *sl = &r->slot[slot];
    lock_region(r);
    /* Only bytes already reserved (counted in used[]) can be served from the host. */
    uint64_t u = LD(&sl->used[dev]), h = LD(&sl->host_used[dev]);
    uint64_t room = u > h ? u - h : 0;
    if (bytes > room)
        bytes = room;
    ST(&sl->host_used[dev], LD(&sl->host_used[dev]) + bytes);
    ST(&d->memory_host_used, LD(&d->memory_host_used) + bytes);
    __atomic_fetch_add(&d->host_allocations, 1, __ATOMIC_RELAXED);
    unlock_region(r);
}
