/*
 * The floor for the engine's CPU per MiB (bench/engine): ns one memcpy of a
 * MiB takes on this core, warm, median of batches.  Prints "memcpy_ns_per_mib N".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB (1u << 20)
#define BATCHES 15
#define PER_BATCH 200

static double now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec * 1e9 + (double) t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

int main(void)
{
    char *src = malloc(MIB), *dst = malloc(MIB);
    double ns[BATCHES];

    if (NULL == src || NULL == dst) {
        fprintf(stderr, "memcpy_mib: out of memory\n");
        return 1;
    }
    memset(src, 1, MIB);
    memset(dst, 2, MIB);
    for (int b = 0; b < BATCHES; ++b) {
        double t0 = now_ns();
        for (int i = 0; i < PER_BATCH; ++i) {
            memcpy(dst, src, MIB);
            /* Keep the copies: the compiler must not drop them. */
            __asm__ volatile("" : : "r"(dst) : "memory");
            src[i % MIB]++;
        }
        ns[b] = (now_ns() - t0) / PER_BATCH;
    }
    qsort(ns, BATCHES, sizeof(ns[0]), cmp);
    printf("memcpy_ns_per_mib %.0f\n", ns[BATCHES / 2]);
    free(src);
    free(dst);
    return 0;
}
