/*
 * Parsing a GPU's board snapshot (src/board.c reads it with pread). Pure: no
 * globals, no I/O, so the fuzzer (fuzz/board_fuzz.c) runs it on any bytes.
 * Everything in the file is bounded before use; see fracgpu_abi.h.
 */
#include <string.h>
#include "shim.h"

static uint64_t rd64(const unsigned char *b, size_t off)
{
    uint64_t v;
    memcpy(&v, b + off, sizeof v);
    return v;
}

static uint32_t rd32(const unsigned char *b, size_t off)
{
    uint32_t v;
    memcpy(&v, b + off, sizeof v);
    return v;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

int fracgpu_board_parse(const unsigned char *buf, size_t len, uint64_t my_id, uint64_t now,
                        struct fracgpu_board_state *out)
{
    memset(out, 0, sizeof *out);
    if (buf == NULL || len < FRACGPU_BOARD_READ_SIZE)
        return -1;
    if (rd64(buf, FRACGPU_BOARD_OFF_MAGIC) != FRACGPU_BOARD_MAGIC ||
        rd32(buf, FRACGPU_BOARD_OFF_VERSION) != FRACGPU_BOARD_VERSION ||
        rd32(buf, FRACGPU_BOARD_OFF_SIZE) != FRACGPU_BOARD_SIZE)
        return -1;
    if (rd64(buf, FRACGPU_BOARD_OFF_SEQUENCE) != rd64(buf, FRACGPU_BOARD_OFF_SEQUENCE_END))
        return -1; /* read while being written */
    uint32_t count = rd32(buf, FRACGPU_BOARD_OFF_ENTRY_COUNT);
    if (count > FRACGPU_BOARD_MAX_ENTRIES)
        return -1;
    uint64_t published = rd64(buf, FRACGPU_BOARD_OFF_PUBLISHED_NS);
    if (published > sat_add(now, FRACGPU_BOARD_FUTURE_SLACK_NS))
        return -1; /* from the future: not a board this node's agent wrote */
    out->published = published;
    if (sat_add(published, FRACGPU_BOARD_STALE_NS) < now || published == 0)
        return 0; /* stale: says nothing (fresh = 0) */
    out->fresh = 1;
    /* A high-priority stamp holds at most FRACGPU_BOARD_HIGH_HOLD_NS past the
     * moment the agent published it: waits for it are bounded. */
    uint64_t high = rd64(buf, FRACGPU_BOARD_OFF_HIGH_ACTIVE_UNTIL_NS);
    if (high > sat_add(published, FRACGPU_BOARD_HIGH_HOLD_NS))
        high = sat_add(published, FRACGPU_BOARD_HIGH_HOLD_NS);
    out->high_until = high;
    for (uint32_t i = 0; i < count; i++) {
        size_t off = FRACGPU_BOARD_OFF_ENTRIES + (size_t)i * FRACGPU_BOARD_ENTRY_SIZE;
        uint64_t id = rd64(buf, off), last = rd64(buf, off + 8);
        if (last > published)
            last = published;
        if (id != 0 && id == my_id)
            continue; /* ourselves (an ambiguous id 0 is always someone else) */
        if (last > out->others_active)
            out->others_active = last;
    }
    return 0;
}
