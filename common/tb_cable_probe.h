/*
 * tbrdma common layer: which cable reaches an address.
 *
 * Thunderbolt ports may all sit in one subnet (macOS self-assigns every
 * port an address in 169.254.0.0/16; some users give all ports one /24), so
 * a subnet names no cable.  A TCP connect from a socket bound to one of this
 * host's interfaces, to a listener bound to one of the peer's, completes
 * only if the two interfaces are the two ends of one cable: the SYN leaves
 * on this end only, and a listener bound to its interface takes no SYN that
 * came in on another port of its host (which a host may answer ARP for).
 * Connection managers bind their sockets the same way (tb_cm_params_t's
 * bind_netdev), so the connection that follows takes the same cable, and
 * the authenticated exchange then proves the far end's identity.
 */
#ifndef TB_CABLE_PROBE_H
#define TB_CABLE_PROBE_H

#include <stddef.h>
#include <stdint.h>

/* Bind socket fd to the interface netdev (Linux: SO_BINDTODEVICE; macOS:
 * IP_BOUND_IF): it sends through no other interface, and a listener takes
 * only what arrives on that one.  0, or -errno (-ENOTSUP where the system
 * has no such option). */
int tb_sock_bind_netdev(int fd, const char *netdev);

/* A TCP socket for dialling from the interface netdev with the source
 * src_ipv4 (network byte order); plain when netdev is NULL or "".  The
 * caller sets its flags.  The descriptor, or -1 with errno set. */
int tb_sock_dial_from(const char *netdev, uint32_t src_ipv4);

enum {
    TB_PROBE_UNKNOWN = -1, /* could not try (a socket call failed): cannot tell */
    TB_PROBE_NO = 0,       /* refused, unreachable, or no answer before the deadline */
    TB_PROBE_REACHED = 1,  /* the TCP connection completed through that interface */
};

typedef struct tb_cable_probe {
    const char *netdev; /* this host's interface to send through */
    uint32_t src_ipv4;  /* its address (network byte order), bound as the source */
    uint32_t dst_ipv4;  /* the peer's port (network byte order) */
    uint16_t dst_port;  /* host byte order: a listener bound to that port's interface */
    int result;         /* TB_PROBE_*, set by tb_cable_probe_run */
    int err;            /* errno of a failed attempt, 0 otherwise */
} tb_cable_probe_t;

/* Try every probe at once, each as a non-blocking connect, and wait until
 * each has an answer or timeout_ns has passed (an address no host answers
 * ARP for on that cable takes the full time).  A connection made is closed
 * at once, before the listener's owner reads anything from it. */
void tb_cable_probe_run(tb_cable_probe_t *probes, size_t n, uint64_t timeout_ns);

#endif /* TB_CABLE_PROBE_H */
