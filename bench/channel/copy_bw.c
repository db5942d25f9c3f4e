/*
 * Per-byte cost of a copy on this CPU (bench/channel/guest-bench): the channel
 * copies every payload byte twice, into a send slot and out of a receive slot.
 * Prints GB/s for frame-sized copies.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(void)
{
    static const size_t lens[] = {4096, 65536, 1u << 20};
    size_t total = 1u << 30;
    unsigned char *a = malloc(1u << 20), *b = malloc(1u << 20);

    if (!a || !b) {
        return 1;
    }
    memset(a, 7, 1u << 20);
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (size_t i = 0; i < total / lens[k]; i++) {
            a[i % lens[k]] = (unsigned char) i; /* keep each copy live */
            memcpy(b, a, lens[k]);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("memcpy %8zu B: %6.2f GB/s (%d)\n", lens[k],
               (double) total / ((double) (t1.tv_sec - t0.tv_sec)
                                 + (double) (t1.tv_nsec - t0.tv_nsec) / 1e9) / 1e9, b[5]);
    }
    free(a);
    free(b);
    return 0;
}
