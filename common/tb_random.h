/*
 * tbrdma common layer: random values that differ across processes and
 * incarnations (channel epochs, first sequence numbers), and secrets that
 * must not be guessable (connection-setup secrets, exposed-memory keys).
 */
#ifndef TB_RANDOM_H
#define TB_RANDOM_H

#include <stddef.h>
#include <stdint.h>

/* A random, non-zero 64-bit value. */
uint64_t tb_random64(void);

/* len bytes from the operating system's cryptographic random source.  0, or
 * -1 (errno set) when there is none: a secret must then not be made up. */
int tb_random_bytes(void *buf, size_t len);

#endif /* TB_RANDOM_H */
