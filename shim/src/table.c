/*
 * Per-process map from what a program holds (device pointer, memory handle,
 * array, context) to what was counted for it, so a free releases exactly the
 * reserved amount. Open addressing with linear probing and backward-shift
 * deletion; one process-local mutex.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fracgpu_alloc *slots;
static size_t cap, count;

static size_t hash(uint32_t kind, uint64_t key)
{
    uint64_t h = key ^ ((uint64_t)kind << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h;
}

static int grow(void)
{
    size_t ncap = cap ? cap * 2 : 1024;
    struct fracgpu_alloc *n = calloc(ncap, sizeof *n);
    if (n == NULL)
        return -1;
    for (size_t i = 0; i < cap; i++) {
        if (slots[i].kind == 0)
            continue;
        size_t j = hash(slots[i].kind, slots[i].key) & (ncap - 1);
        while (n[j].kind != 0)
            j = (j + 1) & (ncap - 1);
        n[j] = slots[i];
    }
    free(slots);
    slots = n;
    cap = ncap;
    return 0;
}

int fracgpu_table_put(uint32_t kind, uint64_t key, uint64_t size, unsigned dev, uint64_t ctx)
{
    int rc = 0;
    pthread_mutex_lock(&table_mu);
    if ((count + 1) * 10 > cap * 7 && grow() != 0) {
        rc = -1;
    } else {
        size_t i = hash(kind, key) & (cap - 1);
        while (slots[i].kind != 0 && !(slots[i].kind == kind && slots[i].key == key))
            i = (i + 1) & (cap - 1);
        if (slots[i].kind == 0)
            count++;
        slots[i] = (struct fracgpu_alloc){key, size, kind, dev, ctx};
    }
    pthread_mutex_unlock(&table_mu);
    return rc;
}

int fracgpu_table_take(uint32_t kind, uint64_t key, uint64_t *size, unsigned *dev)
{
    uint64_t ctx;
    return fracgpu_table_take_aux(kind, key, size, dev, &ctx);
}

int fracgpu_table_take_aux(uint32_t kind, uint64_t key, uint64_t *size, unsigned *dev,
                           uint64_t *ctx)
{
    int rc = -1;
    pthread_mutex_lock(&table_mu);
    if (cap) {
        size_t i = hash(kind, key) & (cap - 1);
        while (slots[i].kind != 0) {
            if (slots[i].kind == kind && slots[i].key == key) {
                *size = slots[i].size;
                *dev = slots[i].dev;
                *ctx = slots[i].ctx;
                rc = 0;
                /* backward-shift deletion keeps probe chains intact */
                size_t hole = i, j = i;
                for (;;) {
                    j = (j + 1) & (cap - 1);
                    if (slots[j].kind == 0)
                        break;
                    size_t home = hash(slots[j].kind, slots[j].key) & (cap - 1);
                    if (((j - home) & (cap - 1)) >= ((j - hole) & (cap - 1))) {
                        slots[hole] = slots[j];
                        hole = j;
                    }
                }
                slots[hole].kind = 0;
                count--;
                break;
            }
            i = (i + 1) & (cap - 1);
        }
    }
    pthread_mutex_unlock(&table_mu);
    return rc;
}

/* Remove every entry made in ctx (its destruction freed them all); the
 * callback releases each one's reservation. */
void fracgpu_table_take_ctx(uint64_t ctx,
                            void (*release)(unsigned dev, uint64_t size, uint32_t kind))
{
    pthread_mutex_lock(&table_mu);
    struct fracgpu_alloc *old = slots;
    size_t ocap = cap;
    struct fracgpu_alloc *fresh = old ? calloc(ocap, sizeof *fresh) : NULL;
    if (fresh != NULL) {
        slots = fresh;
        count = 0;
        for (size_t i = 0; i < ocap; i++) {
            if (old[i].kind == 0)
                continue;
            /* Pool memory and graphs belong to the device, not the context (and their
             * ctx field holds something else). */
            if (old[i].ctx == ctx && old[i].kind != ALLOC_CTX && old[i].kind != ALLOC_POOL_PTR &&
                old[i].kind < ALLOC_EXEC) {
                release(old[i].dev, old[i].size, old[i].kind);
                continue;
            }
            size_t j = hash(old[i].kind, old[i].key) & (cap - 1);
            while (slots[j].kind != 0)
                j = (j + 1) & (cap - 1);
            slots[j] = old[i];
            count++;
        }
        free(old);
    }
    pthread_mutex_unlock(&table_mu);
}

void fracgpu_table_reset_after_fork(void)
{
    /* The child owns none of the parent's device memory. */
    pthread_mutex_init(&table_mu, NULL);
    if (slots)
        memset(slots, 0, cap * sizeof *slots);
    count = 0;
}
