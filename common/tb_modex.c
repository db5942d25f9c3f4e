/*
 * tbrdma common layer: modex entries (see tb_modex.h).
 */
#include "tb_modex.h"

size_t tb_modex_size(unsigned ndevices)
{
    return sizeof(tb_wire_modex_t) + (size_t) ndevices * sizeof(tb_wire_modex_dev_t);
}

int tb_modex_check(const void *buf, size_t len, const char **why)
{
    const tb_wire_modex_t *mx = buf;
    const char *fault = NULL;

    if (NULL == buf || len < sizeof(*mx)) {
        fault = "shorter than its header";
    } else if (TB_WIRE_MODEX_MAGIC != tb_wire_le32(mx->magic)) {
        fault = "not a tbrdma entry";
    } else if (TB_WIRE_MODEX_VERSION != mx->version) {
        fault = "of another tbrdma version";
    } else if (0 == mx->ndevices || mx->ndevices > TB_WIRE_MODEX_MAX_DEVICES
               || len != tb_modex_size(mx->ndevices)) {
        fault = "of a wrong size for its device count";
    } else if (0 != mx->reserved || 0 != mx->reserved2 || mx->path > TB_MODEX_PATH_ENGINE) {
        fault = "with reserved bits set";
    } else {
        for (unsigned i = 0; i < mx->ndevices; i++) {
            const tb_wire_modex_dev_t *d = &mx->devices[i];
            if (0 != d->reserved || 0 != d->reserved2 || 0 == d->ipv4 || 0 == d->cm_port) {
                fault = "with an unusable device";
                break;
            }
        }
    }
    if (why) {
        *why = fault;
    }
    return fault ? -1 : 0;
}

int tb_modex_find_device(const tb_wire_modex_t *mx, uint32_t ipv4)
{
    for (unsigned i = 0; i < mx->ndevices; i++) {
        if (mx->devices[i].ipv4 == ipv4) {
            return (int) i;
        }
    }
    return -1;
}

int tb_modex_find_cable(const tb_wire_modex_t *mx, uint32_t ipv4, uint32_t netmask)
{
    int found = -1;

    if (0 == netmask) {
        return -1;
    }
    for (unsigned i = 0; i < mx->ndevices; i++) {
        const tb_wire_modex_dev_t *d = &mx->devices[i];
        if ((d->ipv4 & netmask) == (ipv4 & netmask) && d->ipv4 != ipv4) {
            if (found >= 0) {
                return TB_MODEX_AMBIGUOUS;
            }
            found = (int) i;
        }
    }
    return found;
}
