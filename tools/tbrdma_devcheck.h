/*
 * What keeps a Thunderbolt port from carrying tbrdma's traffic, found the way
 * a user would look, each with what to do about it: the Thunderbolt Bridge
 * still holding the port's interface, an interface without an IPv4 address
 * yet, a device that lists but cannot make a UC queue pair (Thunderbolt 4
 * ports show rdma_en* devices too), and RDMA not enabled at all.
 * Used by tbrdma_devinfo only.
 */
#ifndef TBRDMA_DEVCHECK_H
#define TBRDMA_DEVCHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "tb_device.h"

/* The interface paired with dev: the one its discovery found, else the one
 * Linux names for its first GID; "" when neither says. */
void tb_devcheck_netdev(const tb_device_t *dev, char *ifname, size_t len);

/* 1 if ifname has an IPv4 address, 0 if not, -1 if this host has no
 * interface of that name. */
int tb_devcheck_has_ipv4(const char *ifname);

/* True if ifname is a member of a bridge, whose name goes to bridge. */
bool tb_devcheck_bridged(const char *ifname, char *bridge, size_t len);

/* True if the text `ifconfig BRIDGE` prints on macOS lists ifname as a
 * member ("member: en2 flags=..."). */
bool tb_devcheck_ifconfig_lists_member(const char *text, const char *ifname);

/* For an open device: 0 if it makes a UC queue pair (then destroyed), else
 * -1 with which call failed, its errno, and what to do, in why. */
int tb_devcheck_uc_qp(const tb_verbs_t *verbs, const tb_device_t *dev, char *why, size_t len);

/* What to do when this host lists no RDMA device at all. */
const char *tb_devcheck_no_device_hint(void);

#endif /* TBRDMA_DEVCHECK_H */
