/*
 * Priority between containers sharing a GPU. Each GPU has a small board file
 * in a node-wide directory. A high-priority container stamps "busy until
 * now + hold" on every launch; a low-priority container waits before
 * launching while that stamp is in the future, so its work does not slow the
 * high-priority one. Best effort: without the directory there is no priority.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

_Static_assert(sizeof(struct fracgpu_board) == FRACGPU_BOARD_SIZE, "board size");
_Static_assert(offsetof(struct fracgpu_board, high_active_until_ns) ==
               FRACGPU_BOARD_OFF_HIGH_ACTIVE_UNTIL_NS, "");
_Static_assert(offsetof(struct fracgpu_board, high_launches) == FRACGPU_BOARD_OFF_HIGH_LAUNCHES, "");
_Static_assert(offsetof(struct fracgpu_board, low_wait_ns) == FRACGPU_BOARD_OFF_LOW_WAIT_NS, "");

static struct fracgpu_board *map_board(int fd)
{
    void *p = mmap(NULL, FRACGPU_BOARD_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

struct fracgpu_board *fracgpu_board_open(const char *dir, const char *uuid)
{
    char path[4200], tmp[4300];
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, uuid);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) {
        /* build it privately, then publish it whole */
        snprintf(tmp, sizeof tmp, "%s.init.%d", path, (int)getpid());
        int t = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (t >= 0) {
            fchmod(t, 0666);
            struct fracgpu_board *b = ftruncate(t, FRACGPU_BOARD_SIZE) == 0 ? map_board(t) : NULL;
            if (b != NULL) {
                b->version = FRACGPU_BOARD_VERSION;
                b->size = FRACGPU_BOARD_SIZE;
                __atomic_store_n(&b->magic, FRACGPU_BOARD_MAGIC, __ATOMIC_RELEASE);
                munmap(b, FRACGPU_BOARD_SIZE);
                if (link(tmp, path) != 0 && errno != EEXIST)
                    LOGW("cannot publish priority board %s: %s", path, strerror(errno));
            }
            close(t);
            unlink(tmp);
        }
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) {
        LOGW("no priority board %s: %s", path, strerror(errno));
        return NULL;
    }
    struct fracgpu_board *b = NULL;
    if (fstat(fd, &st) == 0 && st.st_size == FRACGPU_BOARD_SIZE)
        b = map_board(fd);
    close(fd);
    if (b != NULL && (__atomic_load_n(&b->magic, __ATOMIC_ACQUIRE) != FRACGPU_BOARD_MAGIC ||
                      b->version != FRACGPU_BOARD_VERSION)) {
        LOGE("priority board %s has another format; priority is off for this GPU", path);
        munmap(b, FRACGPU_BOARD_SIZE);
        b = NULL;
    }
    return b;
}

int fracgpu_priority_before(int di)
{
    struct fracgpu_board *b = di >= 0 ? G.board[di] : NULL;
    if (b == NULL)
        return 0;
    if (G.limits.priority == FRACGPU_PRIORITY_HIGH) {
        uint64_t until = fracgpu_now_ns() + FRACGPU_BOARD_HIGH_HOLD_NS;
        /* write only when it moves by a millisecond: keeps the line quiet */
        if (until > __atomic_load_n(&b->high_active_until_ns, __ATOMIC_RELAXED) + 1000000)
            __atomic_store_n(&b->high_active_until_ns, until, __ATOMIC_RELEASE);
        __atomic_fetch_add(&b->high_launches, 1, __ATOMIC_RELAXED);
        return 0;
    }
    uint64_t until = __atomic_load_n(&b->high_active_until_ns, __ATOMIC_ACQUIRE);
    if (LIKELY(until == 0))
        return 0; /* no high-priority work has ever run on this GPU */
    /* A paced container runs at most at its requested share while a neighbour is
     * active (no burst then): that share is guaranteed, whatever the neighbours'
     * priority, so it never waits for them. Only work without a reserved share
     * (unpaced, best effort) yields to high priority. */
    if (G.limits.compute_limit_enabled && G.limits.dev[di].core_limit < 100)
        return fracgpu_now_ns() < until + FRACGPU_PRIORITY_RECENT_NS;
    uint64_t now = fracgpu_now_ns(), start = now;
    while ((until = __atomic_load_n(&b->high_active_until_ns, __ATOMIC_ACQUIRE)) > now) {
        uint64_t wait = until - now;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        nanosleep(&ts, NULL);
        now = fracgpu_now_ns();
    }
    if (now > start)
        __atomic_fetch_add(&b->low_wait_ns, now - start, __ATOMIC_RELAXED);
    /* Keep our in-flight work bounded while high priority was recently busy. */
    return now < until + FRACGPU_PRIORITY_RECENT_NS;
}

_Static_assert(offsetof(struct fracgpu_board, entry) == FRACGPU_BOARD_OFF_ENTRIES, "");
_Static_assert(sizeof(((struct fracgpu_board *)0)->entry[0]) == FRACGPU_BOARD_ENTRY_SIZE, "");

#define HEARTBEAT_NS 10000000ull   /* refresh our entry at most every 10 ms */
#define STALE_NS 60000000000ull    /* an entry silent for a minute may be reused */

static int my_entry[FRACGPU_MAX_DEVICES] = {[0 ... FRACGPU_MAX_DEVICES - 1] = -1};

static int claim_entry(struct fracgpu_board *b, uint64_t id, uint64_t now)
{
    for (int i = 0; i < FRACGPU_BOARD_MAX_ENTRIES; i++)
        if (__atomic_load_n(&b->entry[i].id, __ATOMIC_ACQUIRE) == id)
            return i;
    for (int i = 0; i < FRACGPU_BOARD_MAX_ENTRIES; i++) {
        uint64_t old = __atomic_load_n(&b->entry[i].id, __ATOMIC_ACQUIRE);
        uint64_t seen = __atomic_load_n(&b->entry[i].last_active_ns, __ATOMIC_ACQUIRE);
        if (old != 0 && seen + STALE_NS > now)
            continue;
        if (__atomic_compare_exchange_n(&b->entry[i].id, &old, id, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return i;
    }
    return -1; /* board full: we simply never count as alone */
}

int fracgpu_board_alone(int di, uint64_t now)
{
    struct fracgpu_board *b = G.board[di];
    if (b == NULL)
        return 0; /* without a board nobody can tell: never burst */
    uint64_t id = G.region->hdr.created_ns;
    int mine = my_entry[di];
    if (mine < 0 || __atomic_load_n(&b->entry[mine].id, __ATOMIC_ACQUIRE) != id)
        mine = my_entry[di] = claim_entry(b, id, now);
    if (mine < 0)
        return 0;
    if (now > __atomic_load_n(&b->entry[mine].last_active_ns, __ATOMIC_RELAXED) + HEARTBEAT_NS)
        __atomic_store_n(&b->entry[mine].last_active_ns, now, __ATOMIC_RELEASE);
    if (__atomic_load_n(&b->high_active_until_ns, __ATOMIC_ACQUIRE) + FRACGPU_BOARD_ALONE_NS > now &&
        G.limits.priority != FRACGPU_PRIORITY_HIGH)
        return 0;
    for (int i = 0; i < FRACGPU_BOARD_MAX_ENTRIES; i++) {
        if (i == mine || __atomic_load_n(&b->entry[i].id, __ATOMIC_ACQUIRE) == 0)
            continue;
        if (__atomic_load_n(&b->entry[i].last_active_ns, __ATOMIC_ACQUIRE) + FRACGPU_BOARD_ALONE_NS >
            now)
            return 0;
    }
    return 1;
}
