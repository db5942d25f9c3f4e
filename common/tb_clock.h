/*
 * tbrdma common layer: the monotonic clock every timer here runs on.
 */
#ifndef TB_CLOCK_H
#define TB_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tb_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

#endif /* TB_CLOCK_H */
