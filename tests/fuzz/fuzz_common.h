/*
 * Shared by the fuzz targets (tests/fuzz/fuzz_*.c): a reader over the fuzz
 * input, a silent log sink, and checks that abort with a message (a finding).
 */
#ifndef TB_FUZZ_COMMON_H
#define TB_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_wire.h"

/* A finding the sanitizers would not see: a broken invariant of the API. */
#define FUZZ_ASSERT(cond, ...)                                          \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "fuzz invariant violated at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                               \
            fputc('\n', stderr);                                        \
            abort();                                                    \
        }                                                               \
    } while (0)

/* The input, consumed front to back; reads past the end give zeros. */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t left;
} fuzz_in_t;

static inline void fuzz_in_init(fuzz_in_t *in, const uint8_t *data, size_t size)
{
    in->p = data;
    in->left = size;
}

static inline uint8_t fuzz_u8(fuzz_in_t *in)
{
    if (in->left == 0) {
        return 0;
    }
    in->left--;
    return *in->p++;
}

static inline uint16_t fuzz_u16(fuzz_in_t *in)
{
    uint16_t lo = fuzz_u8(in);
    return (uint16_t) (lo | (uint16_t) fuzz_u8(in) << 8);
}

/* Copy n bytes to out (zero-filled past the end); returns the bytes that
 * came from the input. */
static inline size_t fuzz_bytes(fuzz_in_t *in, void *out, size_t n)
{
    size_t k = n < in->left ? n : in->left;
    memcpy(out, in->p, k);
    memset((uint8_t *) out + k, 0, n - k);
    in->p += k;
    in->left -= k;
    return k;
}

/* Messages are formatted (the formatting is exercised) and dropped. */
static void fuzz_log_sink(tb_log_level_t level, const char *msg, void *ctx)
{
    volatile size_t n = strlen(msg);
    (void) level;
    (void) ctx;
    (void) n;
}

static inline void fuzz_quiet(void)
{
    /* TB_FUZZ_VERBOSE=1 shows them, when reproducing a finding. */
    if (getenv("TB_FUZZ_VERBOSE")) {
        tb_log_set_sink(NULL, NULL, TB_LOG_DEBUG);
    } else {
        tb_log_set_sink(fuzz_log_sink, NULL, TB_LOG_DEBUG);
    }
}

/* Make an address blob pass the channel's integrity checks. */
static inline void fuzz_addr_seal(tb_wire_addr_t *a)
{
    a->crc = tb_wire_le32(tb_crc32c(0, a, TB_WIRE_ADDR_SIZE - 4));
}

#endif /* TB_FUZZ_COMMON_H */
