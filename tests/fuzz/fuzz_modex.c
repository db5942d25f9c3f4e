/*
 * Fuzz target: a peer's modex entry (tb_modex.h) as the BTL reads it:
 * tb_modex_check() on the bytes as published, and when it passes,
 * tb_modex_find_cable() for the subnets of a few local devices.
 *
 * Input: flags byte, then the entry.  With M_SEAL the harness fixes the
 * magic and version and trims or pads the entry to its device count's size.
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tb_modex.h"

enum {
    M_SEAL = 0x01,
    M_ZERO_RESERVED = 0x02, /* clear every reserved field */
};

/* Local devices: address and netmask (host order here). */
static const struct {
    uint32_t ip, mask;
} local_devs[] = {
    {0xa9fe0101u, 0xffff0000u}, /* 169.254.1.1/16: a link-local Thunderbolt bridge */
    {0x0a000001u, 0xfffffffcu}, /* 10.0.0.1/30: one cable */
    {0x0a000005u, 0xfffffffcu}, /* 10.0.0.5/30 */
    {0xc0a80101u, 0xffffff00u}, /* 192.168.1.1/24 */
    {0x0a000009u, 0xffffffffu}, /* /32: nothing else on its subnet */
    {0x0a00000du, 0x00000000u}, /* netmask 0: never matches */
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    const char *why = NULL;
    uint8_t flags;
    size_t len;
    uint8_t *buf;
    tb_wire_modex_t *mx;
    int rc;

    if (!init) {
        fuzz_quiet();
        init = 1;
    }
    if (size == 0) {
        return 0;
    }
    flags = data[0];
    data++;
    size--;
    len = size;
    if ((flags & M_SEAL) && size >= sizeof(tb_wire_modex_t)) {
        len = tb_modex_size(data[5]);
    }
    /* Exactly len bytes of heap, so that ASan sees any read past the end. */
    buf = malloc(len ? len : 1);
    FUZZ_ASSERT(buf, "out of memory");
    memset(buf, 0, len);
    memcpy(buf, data, len < size ? len : size);
    mx = (tb_wire_modex_t *) buf;
    if ((flags & M_SEAL) && len >= sizeof(*mx)) {
        mx->magic = tb_wire_le32(TB_WIRE_MODEX_MAGIC);
        mx->version = TB_WIRE_MODEX_VERSION;
    }
    if ((flags & M_ZERO_RESERVED) && len >= sizeof(*mx)) {
        mx->reserved = 0;
        mx->reserved2 = 0;
        for (unsigned i = 0; i < mx->ndevices && tb_modex_size(i + 1) <= len; i++) {
            mx->devices[i].reserved = 0;
            mx->devices[i].reserved2 = 0;
        }
    }

    rc = tb_modex_check(buf, len, &why);
    FUZZ_ASSERT(rc == 0 ? why == NULL : (why != NULL && strlen(why) > 0),
                "tb_modex_check returned %d with why %s", rc, why ? why : "(null)");
    FUZZ_ASSERT(tb_modex_check(buf, len, NULL) == rc, "tb_modex_check differs without why");
    if (rc == 0) {
        FUZZ_ASSERT(len >= sizeof(*mx) && mx->ndevices >= 1
                        && mx->ndevices <= TB_WIRE_MODEX_MAX_DEVICES
                        && len == tb_modex_size(mx->ndevices),
                    "tb_modex_check passed an entry of %zu bytes with %u devices", len,
                    len >= sizeof(*mx) ? mx->ndevices : 0);
        for (size_t d = 0; d < sizeof(local_devs) / sizeof(local_devs[0]); d++) {
            uint32_t ip = htonl(local_devs[d].ip), mask = htonl(local_devs[d].mask);
            int i = tb_modex_find_cable(mx, ip, mask);
            unsigned on_subnet = 0;
            for (unsigned k = 0; mask != 0 && k < mx->ndevices; k++) {
                on_subnet += (mx->devices[k].ipv4 & mask) == (ip & mask)
                             && mx->devices[k].ipv4 != ip;
            }
            /* A subnet that holds several of the peer's ports names no cable. */
            FUZZ_ASSERT(i == (on_subnet == 0 ? -1 : on_subnet > 1 ? TB_MODEX_AMBIGUOUS : i)
                            && i >= TB_MODEX_AMBIGUOUS && i < (int) mx->ndevices,
                        "find_cable returned %d of %u with %u on the subnet", i, mx->ndevices,
                        on_subnet);
            if (i >= 0) {
                const tb_wire_modex_dev_t *dev = &mx->devices[i];
                FUZZ_ASSERT(mask != 0 && (dev->ipv4 & mask) == (ip & mask) && dev->ipv4 != ip,
                            "find_cable chose a device off the subnet");
                FUZZ_ASSERT(dev->cm_port != 0, "find_cable chose a device without a port");
            }
        }
    }
    /* Also the entry taken at a wrong length. */
    if (len > 0) {
        FUZZ_ASSERT(rc != 0 || tb_modex_check(buf, len - 1, NULL) != 0,
                    "an entry one byte short passed");
    }
    free(buf);
    return 0;
}
