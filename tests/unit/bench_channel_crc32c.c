/*
 * Throughput of the CRC32C the channel uses on every frame, hardware and
 * table implementations, over frame-sized buffers.  Prints GB/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tb_crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t crc, const void *buf, size_t len);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static double measure(crc_fn fn, const unsigned char *buf, size_t len, size_t total)
{
    volatile uint32_t sink = 0;
    size_t iters = total / len;
    double t0 = now_s();

    for (size_t i = 0; i < iters; i++) {
        sink ^= fn(0, buf, len);
    }
    (void) sink;
    return (double) (iters * len) / (now_s() - t0) / 1e9;
}

int main(void)
{
    static const size_t lens[] = {80, 4096, 65536, 1 << 20};
    size_t total = 1u << 30;
    unsigned char *buf = malloc(1 << 20);

    if (!buf) {
        return 1;
    }
    for (size_t i = 0; i < (1 << 20); i++) {
        buf[i] = (unsigned char) (i * 131 + 7);
    }
    printf("crc32c implementation in use: %s\n", tb_crc32c_impl());
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        printf("%8zu B frames: %6.2f GB/s (%s), %6.2f GB/s (table)\n", lens[i],
               measure(tb_crc32c, buf, lens[i], total), tb_crc32c_impl(),
               measure(tb_crc32c_sw, buf, lens[i], total / 4));
    }
    free(buf);
    return 0;
}
