/*
 * tbrdma common layer: X25519 (see tb_x25519.h).
 *
 * A field element mod p = 2^255 - 19 is 16 signed limbs of 16 bits (limb i
 * weighs 2^(16 i)); products fit an int64 with room, and 2^256 = 38 mod p
 * folds the top back.  The ladder is the RFC's, with a constant-time swap.
 */
#include "tb_x25519.h"

#include <string.h>

#include "tb_random.h"
#include "tb_sha256.h"

typedef int64_t fe_t[16];

/* Bring every limb into [0, 2^16), the carry out of the top folded as 38. */
static void fe_carry(fe_t a)
{
    for (int i = 0; i < 16; ++i) {
        int64_t c = a[i] >> 16; /* floor, also for negative limbs */
        a[i] -= c * 65536;
        if (i < 15) {
            a[i + 1] += c;
        } else {
            a[0] += 38 * c;
        }
    }
}

static void fe_add(fe_t o, const fe_t a, const fe_t b)
{
    for (int i = 0; i < 16; ++i) {
        o[i] = a[i] + b[i];
    }
}

static void fe_sub(fe_t o, const fe_t a, const fe_t b)
{
    for (int i = 0; i < 16; ++i) {
        o[i] = a[i] - b[i];
    }
}

static void fe_mul(fe_t o, const fe_t a, const fe_t b)
{
    int64_t t[31] = {0};

    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) {
            t[i + j] += a[i] * b[j];
        }
    }
    for (int i = 0; i < 15; ++i) {
        t[i] += 38 * t[i + 16];
    }
    memcpy(o, t, sizeof(fe_t));
    fe_carry(o);
    fe_carry(o);
}

/* Swap a and b when bit is 1, without a branch on it. */
static void fe_cswap(fe_t a, fe_t b, int64_t bit)
{
    int64_t mask = -bit;

    for (int i = 0; i < 16; ++i) {
        int64_t t = mask & (a[i] ^ b[i]);
        a[i] ^= t;
        b[i] ^= t;
    }
}

/* a^(p-2) = 1/a: p - 2 = 2^255 - 21 has every bit below 255 set but 2 and 4. */
static void fe_invert(fe_t o, const fe_t a)
{
    fe_t c;

    memcpy(c, a, sizeof(c));
    for (int i = 253; i >= 0; --i) {
        fe_mul(c, c, c);
        if (2 != i && 4 != i) {
            fe_mul(c, c, a);
        }
    }
    memcpy(o, c, sizeof(c));
}

static void fe_unpack(fe_t o, const uint8_t in[32])
{
    for (int i = 0; i < 16; ++i) {
        o[i] = (int64_t) in[2 * i] | ((int64_t) in[2 * i + 1] << 8);
    }
    o[15] &= 0x7fff; /* the RFC ignores the top bit of u */
}

/* The unique representative in [0, p), little-endian. */
static void fe_pack(uint8_t out[32], const fe_t a)
{
    fe_t t, m;

    memcpy(t, a, sizeof(t));
    fe_carry(t);
    fe_carry(t);
    fe_carry(t);
    /* Now 0 <= t < 2^256 < 3p: subtracting p at most twice reduces it. */
    for (int round = 0; round < 2; ++round) {
        int64_t borrow = 0;
        for (int i = 0; i < 16; ++i) {
            int64_t pi = 0 == i ? 0xffed : 15 == i ? 0x7fff : 0xffff;
            m[i] = t[i] - pi - borrow;
            borrow = (m[i] >> 16) & 1;
            m[i] &= 0xffff;
        }
        /* No borrow out of the top: t >= p, keep t - p. */
        fe_cswap(t, m, 1 - borrow);
    }
    for (int i = 0; i < 16; ++i) {
        out[2 * i] = (uint8_t) (t[i] & 0xff);
        out[2 * i + 1] = (uint8_t) ((t[i] >> 8) & 0xff);
    }
}

void tb_x25519(uint8_t out[TB_X25519_SIZE], const uint8_t scalar[TB_X25519_SIZE],
               const uint8_t point[TB_X25519_SIZE])
{
    static const fe_t a24 = {121665 & 0xffff, 121665 >> 16};
    uint8_t k[32];
    fe_t x1, x2 = {1}, z2 = {0}, x3, z3 = {1};
    fe_t a, aa, b, bb, e, c, d, da, cb;
    int64_t swap = 0;

    memcpy(k, scalar, sizeof(k));
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    fe_unpack(x1, point);
    memcpy(x3, x1, sizeof(x3));
    for (int t = 254; t >= 0; --t) {
        int64_t bit = (k[t >> 3] >> (t & 7)) & 1;
        swap ^= bit;
        fe_cswap(x2, x3, swap);
        fe_cswap(z2, z3, swap);
        swap = bit;
        fe_add(a, x2, z2);
        fe_mul(aa, a, a);
        fe_sub(b, x2, z2);
        fe_mul(bb, b, b);
        fe_sub(e, aa, bb);
        fe_add(c, x3, z3);
        fe_sub(d, x3, z3);
        fe_mul(da, d, a);
        fe_mul(cb, c, b);
        fe_add(x3, da, cb);
        fe_mul(x3, x3, x3);
        fe_sub(z3, da, cb);
        fe_mul(z3, z3, z3);
        fe_mul(z3, z3, x1);
        fe_mul(x2, aa, bb);
        fe_mul(z2, a24, e);
        fe_add(z2, z2, aa);
        fe_mul(z2, z2, e);
    }
    fe_cswap(x2, x3, swap);
    fe_cswap(z2, z3, swap);
    fe_invert(z2, z2);
    fe_mul(x2, x2, z2);
    fe_pack(out, x2);
    tb_mem_wipe(k, sizeof(k));
}

int tb_x25519_keypair(uint8_t pub[TB_X25519_SIZE], uint8_t priv[TB_X25519_SIZE])
{
    static const uint8_t base[TB_X25519_SIZE] = {9};

    if (0 != tb_random_bytes(priv, TB_X25519_SIZE)) {
        return -1;
    }
    tb_x25519(pub, priv, base);
    return 0;
}

int tb_x25519_shared(uint8_t out[TB_X25519_SIZE], const uint8_t mine[TB_X25519_SIZE],
                     const uint8_t theirs[TB_X25519_SIZE])
{
    uint8_t any = 0;

    tb_x25519(out, mine, theirs);
    for (unsigned i = 0; i < TB_X25519_SIZE; ++i) {
        any |= out[i];
    }
    return 0 != any ? 0 : -1;
}
