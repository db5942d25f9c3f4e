/*
 * Unit tests of what connection setup rests on: SHA-256, HMAC-SHA256 and
 * X25519 against the standards' test vectors, the pair key, and the checks
 * of a peer's modex entry.
 */
#include <arpa/inet.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_cm.h"
#include "tb_emsg.h"
#include "tb_modex.h"
#include "tb_sha256.h"
#include "tb_wire.h"
#include "tb_x25519.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        sprintf(out + 2 * i, "%02x", d[i]);
    }
}

static void sha(const void *m, size_t n, char *out)
{
    uint8_t d[TB_SHA256_SIZE];
    tb_sha256_t s;
    tb_sha256_init(&s);
    tb_sha256_update(&s, m, n);
    tb_sha256_final(&s, d);
    hex(d, sizeof(d), out);
}

/* FIPS 180-4 examples, and a long message fed in odd pieces. */
START_TEST(sha256_vectors)
{
    char out[65];
    static const char two_blocks[] =
        "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    uint8_t d[TB_SHA256_SIZE];
    tb_sha256_t s;
    char *million = malloc(1000000);

    sha("abc", 3, out);
    ck_assert_str_eq(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha("", 0, out);
    ck_assert_str_eq(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha(two_blocks, strlen(two_blocks), out);
    ck_assert_str_eq(out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    ck_assert_ptr_nonnull(million);
    memset(million, 'a', 1000000);
    tb_sha256_init(&s);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 997 + 1) {
        tb_sha256_update(&s, million + off, off + step > 1000000 ? 1000000 - off : step);
    }
    tb_sha256_final(&s, d);
    hex(d, sizeof(d), out);
    ck_assert_str_eq(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}
END_TEST

static void hmac(const void *k, size_t kn, const void *m, size_t mn, char *out)
{
    uint8_t d[TB_SHA256_SIZE];
    tb_hmac_t h;
    tb_hmac_init(&h, k, kn);
    tb_hmac_update(&h, m, mn);
    tb_hmac_final(&h, d);
    hex(d, sizeof(d), out);
}

/* RFC 4231 test cases 1, 2 and 6 (a key longer than a block). */
START_TEST(hmac_vectors)
{
    uint8_t key[131];
    char out[65];
    static const char big[] = "Test Using Larger Than Block-Size Key - Hash Key First";

    memset(key, 0x0b, 20);
    hmac(key, 20, "Hi There", 8, out);
    ck_assert_str_eq(out, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    hmac("Jefe", 4, "what do ya want for nothing?", 28, out);
    ck_assert_str_eq(out, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key, 0xaa, sizeof(key));
    hmac(key, sizeof(key), big, strlen(big), out);
    ck_assert_str_eq(out, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    ck_assert_int_eq(tb_mem_equal_ct("abcd", "abcd", 4), 1);
    ck_assert_int_eq(tb_mem_equal_ct("abcd", "abce", 4), 0);
}
END_TEST

/* Both ends derive the same key; a different secret gives another. */
START_TEST(pair_key_is_symmetric)
{
    uint8_t sa[TB_WIRE_SECRET_SIZE], sb[TB_WIRE_SECRET_SIZE], k1[32], k2[32], k3[32];

    memset(sa, 1, sizeof(sa));
    memset(sb, 2, sizeof(sb));
    tb_cm_pair_key("alpha", 5, sa, "beta", 4, sb, k1);
    tb_cm_pair_key("beta", 4, sb, "alpha", 5, sa, k2);
    ck_assert_int_eq(memcmp(k1, k2, 32), 0);
    sb[0] ^= 1;
    tb_cm_pair_key("alpha", 5, sa, "beta", 4, sb, k3);
    ck_assert_int_ne(memcmp(k1, k3, 32), 0);
}
END_TEST

static void unhex(const char *h, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        ck_assert_int_eq(sscanf(h + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t) v;
    }
}

/* RFC 7748: the Diffie-Hellman example of section 6.1, section 5.2's second
 * vector (its u has the top bit set, which X25519 ignores), and 1000 rounds
 * of section 5.2's iteration (every limb and carry of the field is used). */
START_TEST(x25519_vectors)
{
    static const uint8_t base[32] = {9};
    uint8_t a[32], b[32], pa[32], pb[32], s1[32], s2[32], k[32] = {9}, u[32] = {9}, r[32];
    char out[65];

    unhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a", a, 32);
    unhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb", b, 32);
    tb_x25519(pa, a, base);
    tb_x25519(pb, b, base);
    hex(pa, 32, out);
    ck_assert_str_eq(out, "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
    hex(pb, 32, out);
    ck_assert_str_eq(out, "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
    ck_assert_int_eq(tb_x25519_shared(s1, a, pb), 0);
    ck_assert_int_eq(tb_x25519_shared(s2, b, pa), 0);
    hex(s1, 32, out);
    ck_assert_str_eq(out, "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
    ck_assert_int_eq(memcmp(s1, s2, 32), 0);
    unhex("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d", a, 32);
    unhex("e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493", b, 32);
    tb_x25519(s1, a, b);
    hex(s1, 32, out);
    ck_assert_str_eq(out, "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957");
    for (int i = 0; i < 1000; i++) {
        tb_x25519(r, k, u);
        memcpy(u, k, 32);
        memcpy(k, r, 32);
    }
    hex(k, 32, out);
    ck_assert_str_eq(out, "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51");
}
END_TEST

/* Fresh key pairs agree with each other, and a point of small order (whose
 * shared secret anyone knows) is refused. */
START_TEST(x25519_pairs_and_small_order)
{
    uint8_t pa[32], a[32], pb[32], b[32], s1[32], s2[32], zero[32] = {0}, one[32] = {1};

    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(tb_x25519_keypair(pa, a), 0);
        ck_assert_int_eq(tb_x25519_keypair(pb, b), 0);
        ck_assert_int_eq(tb_x25519_shared(s1, a, pb), 0);
        ck_assert_int_eq(tb_x25519_shared(s2, b, pa), 0);
        ck_assert_int_eq(memcmp(s1, s2, 32), 0);
        ck_assert_int_ne(memcmp(pa, pb, 32), 0);
    }
    ck_assert_int_eq(tb_x25519_shared(s1, a, zero), -1);
    ck_assert_int_eq(tb_x25519_shared(s1, a, one), -1);
}
END_TEST

static size_t entry(uint8_t *buf, unsigned n)
{
    tb_wire_modex_t *mx = (tb_wire_modex_t *) buf;
    size_t len = tb_modex_size(n);

    memset(buf, 0, len);
    mx->magic = tb_wire_le32(TB_WIRE_MODEX_MAGIC);
    mx->version = TB_WIRE_MODEX_VERSION;
    mx->ndevices = (uint8_t) n;
    for (unsigned i = 0; i < n; i++) {
        mx->devices[i].ipv4 = htonl(0x0a640000u | (i << 8) | 2); /* 10.100.i.2 */
        mx->devices[i].netmask = htonl(0xfffffffcu);
        mx->devices[i].cm_port = tb_wire_le16(4000 + i);
    }
    return len;
}

START_TEST(modex_entry_checks)
{
    uint8_t buf[1024];
    tb_wire_modex_t *mx = (tb_wire_modex_t *) buf;
    const char *why;
    size_t len = entry(buf, 3);

    ck_assert_int_eq(tb_modex_check(buf, len, &why), 0);
    ck_assert_ptr_null(why);
    /* the far end of 10.100.1.1/30 is the entry's 10.100.1.2 */
    ck_assert_int_eq(tb_modex_find_cable(mx, htonl(0x0a640101u), htonl(0xfffffffcu)), 1);
    ck_assert_int_eq(tb_modex_find_cable(mx, htonl(0x0a640901u), htonl(0xfffffffcu)), -1);
    ck_assert_int_eq(tb_modex_find_cable(mx, htonl(0x0a640102u), htonl(0xfffffffcu)), -1);
    /* a /16 holds all three of the peer's ports: no cable is named (it
     * once named the first, and a rank dialled over a cable that did not
     * reach it) */
    ck_assert_int_eq(tb_modex_find_cable(mx, htonl(0x0a640001u), htonl(0xffff0000u)),
                     TB_MODEX_AMBIGUOUS);
    /* the same device, for a process of the same host */
    ck_assert_int_eq(tb_modex_find_device(mx, htonl(0x0a640102u)), 1);
    ck_assert_int_eq(tb_modex_find_device(mx, htonl(0x0a640101u)), -1);
    ck_assert_int_eq(tb_modex_check(buf, len - 1, &why), -1);
    ck_assert_int_eq(tb_modex_check(buf, len + 1, &why), -1);
    ck_assert_int_eq(tb_modex_check(buf, 7, &why), -1);
    ck_assert_int_eq(tb_modex_check(NULL, 0, &why), -1);
    mx->ndevices = TB_WIRE_MODEX_MAX_DEVICES + 1;
    ck_assert_int_eq(tb_modex_check(buf, tb_modex_size(mx->ndevices), &why), -1);
    entry(buf, 3);
    mx->version = 1;
    ck_assert_int_eq(tb_modex_check(buf, len, &why), -1);
    ck_assert_str_eq(why, "of another tbrdma version");
    entry(buf, 3);
    mx->path = TB_MODEX_PATH_ENGINE;
    ck_assert_int_eq(tb_modex_check(buf, len, &why), 0);
    mx->path = TB_MODEX_PATH_ENGINE + 1;
    ck_assert_int_eq(tb_modex_check(buf, len, &why), -1);
    entry(buf, 3);
    mx->reserved2 = 1;
    ck_assert_int_eq(tb_modex_check(buf, len, &why), -1);
    entry(buf, 3);
    mx->devices[2].reserved2 = 1;
    ck_assert_int_eq(tb_modex_check(buf, len, &why), -1);
    entry(buf, 3);
    mx->devices[0].cm_port = 0;
    ck_assert_int_eq(tb_modex_check(buf, len, &why), -1);
    entry(buf, 0);
    ck_assert_int_eq(tb_modex_check(buf, tb_modex_size(0), &why), -1);
}
END_TEST

/* A peer engine's message is used only once its header passes: every tag
 * the engines send, the host module's flag on data only, no reserved bytes,
 * no credit outside CREDIT, CREDIT without a payload or pids, and a
 * destination pid on DATA only. */
START_TEST(engine_message_checks)
{
    uint8_t buf[sizeof(tb_wire_emsg_t) + 8];
    tb_wire_emsg_t *m = (tb_wire_emsg_t *) buf, h;
    const char *why;

    memset(buf, 0, sizeof(buf));
    m->src = tb_wire_le32(3);
    m->dst = tb_wire_le32(4);
    m->flags = TB_EMSG_F_HOST;
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_DATA, buf, sizeof(buf), &h, &why), 0);
    ck_assert_uint_eq(tb_wire_le32(h.src), 3);
    ck_assert_uint_eq(h.flags, TB_EMSG_F_HOST);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_GONE, buf, sizeof(buf), &h, &why), -1);
    m->flags = 0x02;
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_DATA, buf, sizeof(buf), &h, &why), -1);
    m->flags = 0;
    m->reserved[1] = 1;
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_DATA, buf, sizeof(buf), &h, &why), -1);
    m->reserved[1] = 0;
    m->credit = tb_wire_le32(100);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_DATA, buf, sizeof(buf), &h, &why), -1);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_CREDIT, buf, sizeof(buf), &h, &why), -1);
    ck_assert_ptr_nonnull(strstr(why, "payload"));
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_CREDIT, buf, sizeof(*m), &h, &why), 0);
    ck_assert_uint_eq(tb_wire_le32(h.credit), 100);
    m->src_pid = tb_wire_le32(9);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_CREDIT, buf, sizeof(*m), &h, &why), -1);
    m->src_pid = 0;
    m->credit = 0;
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_GONE, buf, sizeof(buf), &h, &why), 0);
    m->dst_pid = tb_wire_le32(9);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_GONE, buf, sizeof(buf), &h, &why), -1);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_DATA, buf, sizeof(buf), &h, &why), 0);
    ck_assert_uint_eq(tb_wire_le32(h.dst_pid), 9);
    m->dst_pid = 0;
    ck_assert_int_eq(tb_emsg_parse(4, buf, sizeof(buf), &h, &why), -1);
    ck_assert_int_eq(tb_emsg_parse(TB_ETAG_DATA, buf, sizeof(*m) - 1, &h, &why), -1);
    ck_assert_ptr_nonnull(strstr(why, "shorter"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("auth");
    SRunner *sr;
    int failed;

    /* 1000 rounds of X25519 take seconds under the sanitizers. */
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, sha256_vectors);
    tcase_add_test(tc, hmac_vectors);
    tcase_add_test(tc, x25519_vectors);
    tcase_add_test(tc, x25519_pairs_and_small_order);
    tcase_add_test(tc, pair_key_is_symmetric);
    tcase_add_test(tc, modex_entry_checks);
    tcase_add_test(tc, engine_message_checks);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
