/*
 * tbrdma common layer: SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104).
 *
 * Used to authenticate connection setup and to derive exposed-memory keys;
 * nothing here is on the data path.  Written from the standards so the
 * transport needs no crypto library on either platform.
 */
#ifndef TB_SHA256_H
#define TB_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define TB_SHA256_SIZE 32u
#define TB_SHA256_BLOCK 64u

typedef struct tb_sha256 {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t buf[TB_SHA256_BLOCK];
    size_t nbuf;
} tb_sha256_t;

void tb_sha256_init(tb_sha256_t *s);
void tb_sha256_update(tb_sha256_t *s, const void *data, size_t len);
void tb_sha256_final(tb_sha256_t *s, uint8_t out[TB_SHA256_SIZE]);

typedef struct tb_hmac {
    tb_sha256_t inner;
    tb_sha256_t outer;
} tb_hmac_t;

void tb_hmac_init(tb_hmac_t *m, const void *key, size_t key_len);
void tb_hmac_update(tb_hmac_t *m, const void *data, size_t len);
void tb_hmac_final(tb_hmac_t *m, uint8_t out[TB_SHA256_SIZE]);

/* Compare n bytes in time independent of where they differ: 1 if equal. */
int tb_mem_equal_ct(const void *a, const void *b, size_t n);

/* Zero n bytes of a secret, in a way the compiler keeps. */
void tb_mem_wipe(void *p, size_t n);

#endif /* TB_SHA256_H */
