/*
 * tbrdma common layer: random values that differ across processes and
 * incarnations (channel epochs, first sequence numbers, exposed-memory keys).
 */
#ifndef TB_RANDOM_H
#define TB_RANDOM_H

#include <stdint.h>

/* A random, non-zero 64-bit value. */
uint64_t tb_random64(void);

#endif /* TB_RANDOM_H */
