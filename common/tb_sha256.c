/*
 * tbrdma common layer: SHA-256 and HMAC-SHA256 (see tb_sha256.h).
 */
#include "tb_sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static uint32_t ror(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static void compress(tb_sha256_t *s, const uint8_t *p)
{
    uint32_t w[64], a, b, c, d, e, f, g, h;
    unsigned i;

    for (i = 0; i < 16; i++) {
        w[i] = (uint32_t) p[4 * i] << 24 | (uint32_t) p[4 * i + 1] << 16
               | (uint32_t) p[4 * i + 2] << 8 | p[4 * i + 3];
    }
    for (i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i]
                      + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1;
        d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d;
    s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

void tb_sha256_init(tb_sha256_t *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof(iv));
    s->total = 0;
    s->nbuf = 0;
}

void tb_sha256_update(tb_sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;

    if (len == 0) {
        return;
    }
    s->total += len;
    if (s->nbuf > 0) {
        size_t n = TB_SHA256_BLOCK - s->nbuf < len ? TB_SHA256_BLOCK - s->nbuf : len;
        memcpy(s->buf + s->nbuf, p, n);
        s->nbuf += n;
        p += n;
        len -= n;
        if (s->nbuf < TB_SHA256_BLOCK) {
            return;
        }
        compress(s, s->buf);
        s->nbuf = 0;
    }
    for (; len >= TB_SHA256_BLOCK; p += TB_SHA256_BLOCK, len -= TB_SHA256_BLOCK) {
        compress(s, p);
    }
    memcpy(s->buf, p, len);
    s->nbuf = len;
}

void tb_sha256_final(tb_sha256_t *s, uint8_t out[TB_SHA256_SIZE])
{
    uint64_t bits = s->total * 8;
    uint8_t pad = 0x80, zero = 0, len_be[8];

    for (unsigned i = 0; i < 8; i++) {
        len_be[i] = (uint8_t) (bits >> (56 - 8 * i));
    }
    tb_sha256_update(s, &pad, 1);
    while (s->nbuf != TB_SHA256_BLOCK - 8) {
        tb_sha256_update(s, &zero, 1);
    }
    tb_sha256_update(s, len_be, sizeof(len_be));
    for (unsigned i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t) (s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t) (s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t) (s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t) s->h[i];
    }
    memset(s, 0, sizeof(*s));
}

void tb_hmac_init(tb_hmac_t *m, const void *key, size_t key_len)
{
    uint8_t k[TB_SHA256_BLOCK], pad[TB_SHA256_BLOCK];

    memset(k, 0, sizeof(k));
    if (key_len > TB_SHA256_BLOCK) {
        tb_sha256_t s;
        tb_sha256_init(&s);
        tb_sha256_update(&s, key, key_len);
        tb_sha256_final(&s, k);
    } else {
        memcpy(k, key, key_len);
    }
    for (unsigned i = 0; i < TB_SHA256_BLOCK; i++) {
        pad[i] = k[i] ^ 0x36;
    }
    tb_sha256_init(&m->inner);
    tb_sha256_update(&m->inner, pad, sizeof(pad));
    for (unsigned i = 0; i < TB_SHA256_BLOCK; i++) {
        pad[i] = k[i] ^ 0x5c;
    }
    tb_sha256_init(&m->outer);
    tb_sha256_update(&m->outer, pad, sizeof(pad));
    memset(k, 0, sizeof(k));
    memset(pad, 0, sizeof(pad));
}

void tb_hmac_update(tb_hmac_t *m, const void *data, size_t len)
{
    tb_sha256_update(&m->inner, data, len);
}

void tb_hmac_final(tb_hmac_t *m, uint8_t out[TB_SHA256_SIZE])
{
    uint8_t ih[TB_SHA256_SIZE];

    tb_sha256_final(&m->inner, ih);
    tb_sha256_update(&m->outer, ih, sizeof(ih));
    tb_sha256_final(&m->outer, out);
    memset(ih, 0, sizeof(ih));
}

int tb_mem_equal_ct(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;

    for (size_t i = 0; i < n; i++) {
        d |= x[i] ^ y[i];
    }
    return d == 0;
}

void tb_mem_wipe(void *p, size_t n)
{
    volatile uint8_t *v = p;

    while (n--) {
        *v++ = 0;
    }
}
