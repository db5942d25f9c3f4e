/*
 * tbrdma common layer: CRC32C (Castagnoli), used to check every frame.
 *
 * Uses the CPU's CRC32C instruction when there is one (SSE4.2 on x86-64,
 * the ARMv8 CRC32 extension on arm64, which every Apple Silicon core has),
 * chosen once at run time, else a portable slicing-by-8 table.
 */
#ifndef TB_CRC32C_H
#define TB_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over len bytes; standard CRC32C, so
 * tb_crc32c(0, "123456789", 9) == 0xe3069283. */
uint32_t tb_crc32c(uint32_t crc, const void *buf, size_t len);

/* The portable implementation, exposed so tests can compare the two. */
uint32_t tb_crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* Name of the implementation tb_crc32c() uses ("sse4.2", "armv8", "table"). */
const char *tb_crc32c_impl(void);

#endif /* TB_CRC32C_H */
