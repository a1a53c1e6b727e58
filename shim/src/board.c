/*
 * Priority and "alone" between containers sharing a GPU, through the GPU's
 * board: a file in a node-wide directory that only the agent writes and that
 * containers see read-only. This container announces its launches in its own
 * region (dev[].active_launch_ns); the agent gathers every container's
 * announcement into the board, with the high-priority stamp computed from
 * the limits it wrote itself. So nothing another container writes is read
 * here: a neighbour cannot truncate, forge or grow what this shim reads.
 *
 * The board is read with pread into a private snapshot, never mapped, so a
 * short, missing or garbage file cannot fault this process (no SIGBUS), and
 * every value read is bounded (a stamp cannot lie in the future by more than
 * the hold, a board the agent stopped refreshing says nothing).
 * Best effort: without the directory there is no priority and no burst.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

_Static_assert(sizeof(struct fracgpu_board) == FRACGPU_BOARD_SIZE, "board size");
_Static_assert(offsetof(struct fracgpu_board, high_active_until_ns) ==
               FRACGPU_BOARD_OFF_HIGH_ACTIVE_UNTIL_NS, "");
_Static_assert(offsetof(struct fracgpu_board, published_ns) == FRACGPU_BOARD_OFF_PUBLISHED_NS, "");
_Static_assert(offsetof(struct fracgpu_board, sequence) == FRACGPU_BOARD_OFF_SEQUENCE, "");
_Static_assert(offsetof(struct fracgpu_board, entry_count) == FRACGPU_BOARD_OFF_ENTRY_COUNT, "");
_Static_assert(offsetof(struct fracgpu_board, entry) == FRACGPU_BOARD_OFF_ENTRIES, "");
_Static_assert(sizeof(((struct fracgpu_board *)0)->entry[0]) == FRACGPU_BOARD_ENTRY_SIZE, "");
_Static_assert(offsetof(struct fracgpu_board, sequence_end) == FRACGPU_BOARD_OFF_SEQUENCE_END, "");
_Static_assert(FRACGPU_BOARD_READ_SIZE == FRACGPU_BOARD_OFF_SEQUENCE_END + 8, "");

#define ANNOUNCE_NS 1000000ull  /* refresh our own announcement at most every 1 ms */
#define REOPEN_NS 1000000000ull /* look for a missing board again after 1 s */
#define MAX_WAIT_STEP_NS 10000000ull

struct fracgpu_board_view {
    char path[4200];
    pthread_mutex_t mu; /* one refresher at a time; readers use the last snapshot */
    int fd;             /* -1: not open */
    uint64_t next_open_ns, read_ns;
    /* the snapshot, read with atomics */
    int fresh;
    uint64_t high_until, others_active;
};

static struct fracgpu_board_view views[FRACGPU_MAX_DEVICES];
static unsigned n_views;
static pthread_mutex_t views_mu = PTHREAD_MUTEX_INITIALIZER;

struct fracgpu_board_view *fracgpu_board_open(const char *dir, const char *uuid)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return NULL;
    pthread_mutex_lock(&views_mu);
    struct fracgpu_board_view *v = n_views < FRACGPU_MAX_DEVICES ? &views[n_views++] : NULL;
    pthread_mutex_unlock(&views_mu);
    if (v == NULL)
        return NULL;
    snprintf(v->path, sizeof v->path, "%s/%s", dir, uuid);
    pthread_mutex_init(&v->mu, NULL);
    v->fd = -1;
    return v;
}

/* A regular file only, never through a link, never blocking on a FIFO. */
static int open_board(struct fracgpu_board_view *v)
{
    int fd = open(v->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        LOGW("priority board %s is not a regular file: ignored", v->path);
        close(fd);
        return -1;
    }
    return fd;
}

static void refresh(struct fracgpu_board_view *v, uint64_t now)
{
    if (now < __atomic_load_n(&v->read_ns, __ATOMIC_ACQUIRE) + FRACGPU_BOARD_REFRESH_NS)
        return;
    if (pthread_mutex_trylock(&v->mu) != 0)
        return; /* another thread is reading it: use the snapshot we have */
    __atomic_store_n(&v->read_ns, now, __ATOMIC_RELEASE);
    if (v->fd < 0 && now >= v->next_open_ns) {
        v->fd = open_board(v);
        if (v->fd < 0)
            v->next_open_ns = now + REOPEN_NS;
    }
    struct fracgpu_board_state st = {0};
    int ok = -1;
    if (v->fd >= 0) {
        unsigned char buf[FRACGPU_BOARD_READ_SIZE];
        ssize_t n = pread(v->fd, buf, sizeof buf, 0);
        uint64_t my_id = G.region ? __atomic_load_n(&G.region->hdr.created_ns, __ATOMIC_RELAXED) : 0;
        if (n == (ssize_t)sizeof buf)
            ok = fracgpu_board_parse(buf, sizeof buf, my_id, now, &st);
    }
    if (ok != 0)
        memset(&st, 0, sizeof st); /* missing, short or garbage: says nothing */
    __atomic_store_n(&v->high_until, st.high_until, __ATOMIC_RELAXED);
    __atomic_store_n(&v->others_active, st.others_active, __ATOMIC_RELAXED);
    __atomic_store_n(&v->fresh, st.fresh, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&v->mu);
}

void fracgpu_board_reset_after_fork(void)
{
    for (unsigned i = 0; i < FRACGPU_MAX_DEVICES; i++)
        pthread_mutex_init(&views[i].mu, NULL);
    pthread_mutex_init(&views_mu, NULL);
}

/* Our own announcement, in our own region: the agent reads it. */
static void announce(int di, uint64_t now)
{
    uint64_t *p = &G.region->dev[di].active_launch_ns;
    if (now > __atomic_load_n(p, __ATOMIC_RELAXED) + ANNOUNCE_NS)
        __atomic_store_n(p, now, __ATOMIC_RELAXED);
}

int fracgpu_priority_before(int di)
{
    struct fracgpu_board_view *v = di >= 0 ? G.board[di] : NULL;
    if (v == NULL)
        return 0;
    /* The coarse clock (a few ms of resolution, same time base) is enough for a
     * 1 ms announcement and a 2 ms refresh, and costs a fraction of the precise one. */
    struct timespec ts_now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts_now);
    uint64_t now = (uint64_t)ts_now.tv_sec * 1000000000ull + (uint64_t)ts_now.tv_nsec;
    announce(di, now);
    if (G.limits.priority == FRACGPU_PRIORITY_HIGH)
        return 0;
    /* Best-effort work (no reserved share, unpaced) on a shared GPU always keeps at
     * most a ring of launches in flight: a deep backlog in the GPU's queues would
     * hold back the kernels of a neighbour arriving later and take the share it
     * was promised. Other unpaced work does so next to a recently active
     * neighbour. */
    int best_effort = !G.limits.compute_limit_enabled;
    refresh(v, now);
    if (!__atomic_load_n(&v->fresh, __ATOMIC_ACQUIRE))
        return best_effort;
    int paced = G.limits.compute_limit_enabled && G.limits.dev[di].core_limit < 100;
    int neighbour = best_effort || (!paced && __atomic_load_n(&v->others_active, __ATOMIC_RELAXED) +
                                                     FRACGPU_PRIORITY_RECENT_NS > now);
    uint64_t until = __atomic_load_n(&v->high_until, __ATOMIC_RELAXED);
    if (LIKELY(until == 0))
        return neighbour; /* no high-priority work on this GPU */
    /* A paced container runs at most at its requested share while a neighbour is
     * active (no burst then): that share is guaranteed, whatever the neighbours'
     * priority, so it never waits for them. Only work without a reserved share
     * (unpaced, best effort) yields to high priority. */
    if (paced)
        return now < until + FRACGPU_PRIORITY_RECENT_NS;
    now = fracgpu_now_ns();
    uint64_t start = now;
    /* Each step waits at most until the stamp the agent last published, which
     * lies at most a hold past its publication: a board that stops moving
     * releases us within FRACGPU_BOARD_HIGH_HOLD_NS. */
    while (until > now) {
        uint64_t wait = until - now;
        if (wait > MAX_WAIT_STEP_NS)
            wait = MAX_WAIT_STEP_NS;
        struct timespec ts = {0, (long)wait};
        nanosleep(&ts, NULL);
        now = fracgpu_now_ns();
        announce(di, now);
        refresh(v, now);
        until = __atomic_load_n(&v->fresh, __ATOMIC_ACQUIRE)
                    ? __atomic_load_n(&v->high_until, __ATOMIC_RELAXED)
                    : 0;
    }
    if (now > start)
        __atomic_fetch_add(&G.region->dev[di].throttle_ns, now - start, __ATOMIC_RELAXED);
    /* Keep our in-flight work bounded while high priority was recently busy. */
    return 1;
}

int fracgpu_board_alone(int di, uint64_t now)
{
    struct fracgpu_board_view *v = G.board[di];
    if (v == NULL)
        return 0; /* without a board nobody can tell: never burst */
    refresh(v, now);
    if (!__atomic_load_n(&v->fresh, __ATOMIC_ACQUIRE))
        return 0; /* the agent is not publishing: we cannot know */
    if (G.limits.priority != FRACGPU_PRIORITY_HIGH &&
        __atomic_load_n(&v->high_until, __ATOMIC_RELAXED) + FRACGPU_BOARD_ALONE_NS > now)
        return 0;
    return __atomic_load_n(&v->others_active, __ATOMIC_RELAXED) + FRACGPU_BOARD_ALONE_NS <= now;
}
