/*
 * tbrdma common layer: CRC32C (see tb_crc32c.h).
 */
#include "tb_crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#if defined(__linux__) && !defined(__ARM_FEATURE_CRC32)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif
#endif

#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

typedef uint32_t (*crc_fn_t)(uint32_t crc, const unsigned char *p, size_t len);

static crc_fn_t crc_impl_fn;
static const char *crc_impl_name;

static void table_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        }
        crc_table[0][i] = c;
    }
    for (unsigned i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            uint32_t prev = crc_table[t - 1][i];
            crc_table[t][i] = (prev >> 8) ^ crc_table[0][prev & 0xff];
        }
    }
}

/* Slicing-by-8: eight table lookups per 8 input bytes; little-endian loads. */
static uint32_t crc_table_update(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len >= 8) {
        uint32_t lo = crc ^ ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16
                             | (uint32_t) p[3] << 24);
        uint32_t hi = (uint32_t) p[4] | (uint32_t) p[5] << 8 | (uint32_t) p[6] << 16
                      | (uint32_t) p[7] << 24;
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff]
              ^ crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24]
              ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff]
              ^ crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    }
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw_update(uint32_t crc,
                                                                 const unsigned char *p,
                                                                 size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    crc = (uint32_t) c;
    while (len--) {
        crc = _mm_crc32_u8(crc, *p++);
    }
    return crc;
}

static int crc_hw_available(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#define CRC_HW_NAME "sse4.2"

#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_CRC32)
#define CRC_HW_ATTR
#else
#define CRC_HW_ATTR __attribute__((target("+crc")))
#endif
CRC_HW_ATTR static uint32_t crc_hw_update(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = __crc32cd(crc, v);
        p += 8;
        len -= 8;
    }
    while (len--) {
        crc = __crc32cb(crc, *p++);
    }
    return crc;
}

static int crc_hw_available(void)
{
#if defined(__ARM_FEATURE_CRC32)
    return 1; /* the compiler's target (e.g. every Apple Silicon core) has it */
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
    return 0;
#endif
}
#define CRC_HW_NAME "armv8"
#endif

static void crc_init(void)
{
    table_init();
    crc_impl_fn = crc_table_update;
    crc_impl_name = "table";
#if defined(CRC_HW_NAME)
    if (crc_hw_available()) {
        crc_impl_fn = crc_hw_update;
        crc_impl_name = CRC_HW_NAME;
    }
#endif
}

uint32_t tb_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_impl_fn(~crc, buf, len);
}

uint32_t tb_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_table_update(~crc, buf, len);
}

const char *tb_crc32c_impl(void)
{
    pthread_once(&crc_once, crc_init);
    return crc_impl_name;
}
