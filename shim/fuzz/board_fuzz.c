/*
 * libFuzzer harness for the shim's board parser (src/board_parse.c): what a
 * shim makes of the bytes it pread from a GPU's board, whatever they are
 * (truncated, torn, garbage, forged stamps and counts).
 *
 * Input: 8 bytes of "now", 8 bytes of the reader's own id, then the bytes read
 * (any length: a short read is a truncated board). The parser gets exactly those
 * bytes in a buffer of their size, so ASan reports any read past them.
 * Any broken invariant of fracgpu_abi.h's board section aborts.
 * Build: make -C shim fuzz; run: shim/build/fuzz/board_fuzz CORPUS shim/fuzz/board_corpus
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "board_fuzz: invariant broken: %s (line %d)\n", #cond,   \
                    __LINE__);                                                        \
            abort();                                                                  \
        }                                                                             \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 16)
        return 0;
    uint64_t now, my_id;
    memcpy(&now, data, 8);
    memcpy(&my_id, data + 8, 8);
    size_t len = size - 16;
    unsigned char *buf = malloc(len ? len : 1);
    memcpy(buf, data + 16, len);
    struct fracgpu_board_state st;
    memset(&st, 0xa5, sizeof st);
    int rc = fracgpu_board_parse(buf, len, my_id, now, &st);
    CHECK(rc == 0 || rc == -1);
    if (rc != 0 || !st.fresh) {
        /* says nothing: no wait, nobody seen (the caller then never bursts) */
        CHECK(st.fresh == 0 && st.high_until == 0 && st.others_active == 0);
    } else {
        CHECK(st.fresh == 1);
        CHECK(len >= FRACGPU_BOARD_READ_SIZE);
        CHECK(st.published != 0);
        CHECK(st.published <= now || st.published - now <= FRACGPU_BOARD_FUTURE_SLACK_NS);
        CHECK(st.published >= now || now - st.published <= FRACGPU_BOARD_STALE_NS);
        /* a wait for high priority ends at most a hold after publication */
        CHECK(st.high_until <= st.published ||
              st.high_until - st.published <= FRACGPU_BOARD_HIGH_HOLD_NS);
        CHECK(st.others_active <= st.published);
    }
    free(buf);
    return 0;
}
