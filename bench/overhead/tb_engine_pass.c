/*
 * What an idle rank costs the host engine in each pass of its loop, natively.
 * With a rank on every core, most of an engine's ranks have nothing for it
 * in a given pass, yet it looks at each of them every pass, and a message
 * arriving from one waits, on average, half a pass.
 *
 * The engine is the real daemon code assembled in memory (the tests'
 * engine harness); its ranks' rings are empty.  Two ways of passing over an
 * idle rank are timed in the same run, alternately:
 *   - the calls: the rank's three steps (its ring, its overflow, its
 *     credit), each finding nothing, as every pass made them before;
 *   - the check: tb_eng_rank_idle, one load of the ring's next stamp, which
 *     is what the engine's pass now does first.
 *
 * Prints "pass_idle_calls_ns <median ns per idle rank>" and
 * "pass_idle_check_ns <median ns per idle rank>".
 *
 *   tb_engine_pass [--passes N]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_harness.h"

#define BATCHES 9

static double clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e9 + (double) ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static double pass_calls(tb_engine_t *e, unsigned long passes)
{
    volatile int work = 0;
    double t0 = clock_ns();

    for (unsigned long i = 0; i < passes; i++) {
        for (unsigned k = 0; k < EH_RANKS; k++) {
            eng_rank_t *r = &e->ranks[k];
            work += tb_eng_rank_tx_progress(r);
            work += tb_eng_rank_flush_overflow(r);
            work += tb_eng_rank_credit_progress(r);
        }
    }
    return (clock_ns() - t0) / (double) (passes * EH_RANKS);
}

static double pass_check(tb_engine_t *e, unsigned long passes)
{
    volatile int work = 0;
    double t0 = clock_ns();

    for (unsigned long i = 0; i < passes; i++) {
        for (unsigned k = 0; k < EH_RANKS; k++) {
            eng_rank_t *r = &e->ranks[k];
            if (!tb_eng_rank_idle(r)) {
                work += tb_eng_rank_tx_progress(r);
            }
        }
    }
    return (clock_ns() - t0) / (double) (passes * EH_RANKS);
}

int main(int argc, char **argv)
{
    unsigned long passes = 2000000;
    double calls[BATCHES], check[BATCHES];
    eng_harness_t h;
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        if (0 == strcmp(argv[i], "--passes") && i + 1 < argc) {
            passes = strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: tb_engine_pass [--passes N]\n");
            return 2;
        }
    }
    if (passes < BATCHES || 0 != eh_init(&h)) {
        fprintf(stderr, "tb_engine_pass: --passes must be at least %d, and memory there\n",
                BATCHES);
        return 2;
    }
    /* The harness's ranks have no socket, which the engine takes for a rank
     * that went away: give each one, so that they are alive and idle. */
    for (unsigned k = 0; k < EH_RANKS; k++) {
        h.e->ranks[k].fd = open("/dev/null", O_RDONLY);
        if (h.e->ranks[k].fd < 0) {
            perror("tb_engine_pass: /dev/null");
            goto out;
        }
    }
    for (unsigned k = 0; k < EH_RANKS; k++) {
        if (!tb_eng_rank_idle(&h.e->ranks[k])) {
            fprintf(stderr, "tb_engine_pass: rank %u is not idle\n", k);
            goto out;
        }
    }
    for (unsigned b = 0; b < BATCHES; b++) {
        calls[b] = pass_calls(h.e, passes / BATCHES);
        check[b] = pass_check(h.e, passes / BATCHES);
    }
    qsort(calls, BATCHES, sizeof(calls[0]), cmp_double);
    qsort(check, BATCHES, sizeof(check[0]), cmp_double);
    printf("pass_idle_calls_ns %.2f\n", calls[BATCHES / 2]);
    printf("pass_idle_check_ns %.2f\n", check[BATCHES / 2]);
    rc = 0;
out:
    eh_fini(&h);
    return rc;
}
