/*
 * tbrdma common layer: a process's modex entry (tb_wire.h): what it
 * publishes about its devices and connection setup, and how a peer reads it.
 * The entry comes from another process and is checked whole before use.
 */
#ifndef TB_MODEX_H
#define TB_MODEX_H

#include <stddef.h>
#include <stdint.h>

#include "tb_wire.h"

/* Bytes of an entry with ndevices devices. */
size_t tb_modex_size(unsigned ndevices);

/* Check an entry of len bytes: magic, version, device count, exact size, and
 * every reserved field zero.  0, or -1 with *why naming the fault. */
int tb_modex_check(const void *buf, size_t len, const char **why);

/* The entry's device on the subnet of ipv4/netmask (network byte order) and
 * not at ipv4 itself: the far end of that cable.  Its index, -1 if none,
 * TB_MODEX_AMBIGUOUS if several are (ports that share one subnet, as a Mac's
 * self-assigned 169.254/16 addresses do: a subnet then names no cable).
 * The entry must have passed tb_modex_check. */
#define TB_MODEX_AMBIGUOUS (-2)
int tb_modex_find_cable(const tb_wire_modex_t *mx, uint32_t ipv4, uint32_t netmask);

/* The entry's device at ipv4 itself: a process of this host through the
 * same engine has this host's devices.  Its index, or -1. */
int tb_modex_find_device(const tb_wire_modex_t *mx, uint32_t ipv4);

#endif /* TB_MODEX_H */
