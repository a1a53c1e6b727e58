/* Configuration and shared simulated state of the GPU test doubles. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "fake.h"

#define STATE_MAGIC 0x45544154534b4146ull

static pthread_mutex_t cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_config *current;
static struct timespec cfg_mtime;
static off_t cfg_size = -1;
static struct fake_state *state;

uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int fake_pid_alive(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return kill(pid, 0) == 0 || errno == EPERM;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static int parse_uuid_bytes(const char *s, unsigned char out[16])
{
    if (strncmp(s, "GPU-", 4) == 0)
        s += 4;
    unsigned n = 0;
    for (; *s && n < 32; s++) {
        if (*s == '-')
            continue;
        char c = *s;
        int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (v < 0)
            return -1;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(v << 4);
        else
            out[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32 && *s == '\0' ? 0 : -1;
}

static void defaults(struct fake_config *c)
{
    memset(c, 0, sizeof *c);
    c->device_count = 1;
    snprintf(c->driver_version, sizeof c->driver_version, "550.54.15");
    c->cuda_version = 12040;
    c->default_kernel_us = 10;
    c->multiprocessor_count = 16;
    c->host_memory = 64ull << 30;
    for (unsigned i = 0; i < FAKE_MAX_DEVICES; i++) {
        struct fake_dev *d = &c->dev[i];
        snprintf(d->uuid, sizeof d->uuid, "GPU-fa4e0000-0000-4000-8000-%012x", i);
        parse_uuid_bytes(d->uuid, d->uuid_bytes);
        snprintf(d->name, sizeof d->name, "NVIDIA Fake GPU 16GB");
        d->memory = 16ull << 30;
        snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", 0x10 + i);
        d->minor = i;
        d->utilization = -1;
    }
}

static void bad(const char *path, unsigned line, const char *what)
{
    fprintf(stderr, "fake GPU config %s line %u: %s\n", path, line, what);
}

static void add_error(struct fake_error *errs, unsigned *n, const char *fn, const char *val)
{
    if (*n >= FAKE_MAX_ERRORS)
        return;
    snprintf(errs[*n].fn, sizeof errs[*n].fn, "%s", fn);
    errs[*n].code = atoi(val);
    (*n)++;
}

static void apply(struct fake_config *c, const char *path, unsigned line, char *key, char *val)
{
    if (strcmp(key, "device_count") == 0) {
        c->device_count = (unsigned)atoi(val);
        if (c->device_count > FAKE_MAX_DEVICES)
            c->device_count = FAKE_MAX_DEVICES;
    } else if (strcmp(key, "driver_version") == 0) {
        snprintf(c->driver_version, sizeof c->driver_version, "%s", val);
    } else if (strcmp(key, "cuda_version") == 0) {
        c->cuda_version = atoi(val);
    } else if (strcmp(key, "state_file") == 0) {
        snprintf(c->state_file, sizeof c->state_file, "%s", val);
    } else if (strcmp(key, "events_file") == 0) {
        snprintf(c->events_file, sizeof c->events_file, "%s", val);
    } else if (strcmp(key, "context_bytes") == 0) {
        c->context_bytes = strtoull(val, NULL, 10);
    } else if (strcmp(key, "host_memory_bytes") == 0) {
        c->host_memory = strtoull(val, NULL, 10);
    } else if (strcmp(key, "multiprocessor_count") == 0) {
        c->multiprocessor_count = (unsigned)atoi(val);
    } else if (strcmp(key, "default_kernel_us") == 0) {
        c->default_kernel_us = (unsigned)atoi(val);
    } else if (strncmp(key, "cuda_error.", 11) == 0) {
        add_error(c->cuda_errors, &c->n_cuda_errors, key + 11, val);
    } else if (strncmp(key, "nvml_error.", 11) == 0) {
        add_error(c->nvml_errors, &c->n_nvml_errors, key + 11, val);
    } else if (strncmp(key, "device.", 7) == 0) {
        char *end;
        unsigned long i = strtoul(key + 7, &end, 10);
        if (end == key + 7 || *end != '.' || i >= FAKE_MAX_DEVICES) {
            bad(path, line, "bad device index");
            return;
        }
        struct fake_dev *d = &c->dev[i];
        const char *f = end + 1;
        if (strcmp(f, "uuid") == 0) {
            if (parse_uuid_bytes(val, d->uuid_bytes) != 0)
                bad(path, line, "uuid must be GPU- and 32 hex digits");
            else
                snprintf(d->uuid, sizeof d->uuid, "%s", val);
        } else if (strcmp(f, "name") == 0) {
            snprintf(d->name, sizeof d->name, "%s", val);
        } else if (strcmp(f, "memory_bytes") == 0) {
            d->memory = strtoull(val, NULL, 10);
        } else if (strcmp(f, "pci_bus_id") == 0) {
            snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "%s", val);
        } else if (strcmp(f, "minor") == 0) {
            d->minor = (unsigned)atoi(val);
        } else if (strcmp(f, "mig_mode") == 0) {
            d->mig_mode = (unsigned)atoi(val);
        } else if (strcmp(f, "accounting_mode") == 0) {
            d->accounting_mode = (unsigned)atoi(val);
        } else if (strcmp(f, "utilization_gpu") == 0) {
            d->utilization = atoi(val);
        } else if (strncmp(f, "nvml_error.", 11) == 0) {
            add_error(d->errors, &d->n_errors, f + 11, val);
        } else {
            bad(path, line, "unknown device field");
        }
    } else {
        bad(path, line, "unknown key");
    }
}

static struct fake_config *load(const char *path)
{
    struct fake_config *c = malloc(sizeof *c);
    if (c == NULL)
        return NULL;
    defaults(c);
    if (path == NULL || *path == '\0')
        return c;
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        fprintf(stderr, "fake GPU config %s: %s (using defaults)\n", path, strerror(errno));
        return c;
    }
    char buf[1024];
    unsigned line = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        buf[strcspn(buf, "\r\n")] = '\0';
        if (buf[0] == '\0' || buf[0] == '#')
            continue;
        char *eq = strchr(buf, '=');
        if (eq == NULL) {
            bad(path, line, "expected key=value");
            continue;
        }
        *eq = '\0';
        apply(c, path, line, buf, eq + 1);
    }
    fclose(f);
    return c;
}

const struct fake_config *fake_config(int reload)
{
    const struct fake_config *c = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
    if (c != NULL && !reload)
        return c;
    const char *path = getenv(FAKE_ENV_CONFIG);
    struct stat st;
    int have = path != NULL && stat(path, &st) == 0;
    pthread_mutex_lock(&cfg_mu);
    if (current == NULL || (have && (st.st_mtim.tv_sec != cfg_mtime.tv_sec ||
                                     st.st_mtim.tv_nsec != cfg_mtime.tv_nsec ||
                                     st.st_size != cfg_size))) {
        struct fake_config *n = load(path);
        if (n != NULL) {
            /* Older snapshots stay allocated: other threads may still read them. */
            __atomic_store_n(&current, n, __ATOMIC_RELEASE);
            if (have) {
                cfg_mtime = st.st_mtim;
                cfg_size = st.st_size;
            }
        }
    }
    c = current;
    pthread_mutex_unlock(&cfg_mu);
    return c;
}

/* The hardware follows the config: a process whose config names another state_file
 * (a test process that loads the NVML double once and is pointed at new hardware) maps
 * that one. The old mapping stays: other threads may still read it. */
static const struct fake_config *state_cfg; /* the config state was last checked against */
static char state_path[sizeof ((struct fake_config *)0)->state_file];

struct fake_state *fake_state(void)
{
    struct fake_state *s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    const struct fake_config *c = fake_config(0);
    if (s != NULL && __atomic_load_n(&state_cfg, __ATOMIC_ACQUIRE) == c)
        return s;
    pthread_mutex_lock(&cfg_mu);
    if (state != NULL && strcmp(state_path, c->state_file) != 0)
        __atomic_store_n(&state, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&state_cfg, c, __ATOMIC_RELEASE);
    if (state == NULL) {
        snprintf(state_path, sizeof state_path, "%s", c->state_file);
        void *p = MAP_FAILED;
        if (c->state_file[0]) {
            int fd = open(c->state_file, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
            if (fd >= 0) {
                struct stat st;
                if (fstat(fd, &st) == 0 && st.st_size < (off_t)sizeof(struct fake_state))
                    if (ftruncate(fd, sizeof(struct fake_state)) != 0)
                        perror("fake GPU state");
                p = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
            }
        }
        if (p == MAP_FAILED)
            p = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        __atomic_store_n(&state, (struct fake_state *)p, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cfg_mu);
    return state;
}

int fake_error_for(const struct fake_error *errs, unsigned n, const char *fn)
{
    for (unsigned i = 0; i < n; i++)
        if (strcmp(errs[i].fn, fn) == 0 || strcmp(errs[i].fn, "*") == 0)
            return errs[i].code;
    return 0;
}
