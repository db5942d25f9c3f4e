/*
 * tbrdma common layer: RDMA devices, their ports, addresses and limits.
 *
 * One device per Thunderbolt port (rdma_enX on macOS, paired with the IP
 * interface enX).  A device is usable when its port is active and it has an
 * IPv4-mapped RoCE GID: that address is what tells which cable reaches which
 * peer, and is needed to address the peer at all.
 */
#ifndef TB_DEVICE_H
#define TB_DEVICE_H

#include "tb_namefilter.h"
#include "tb_verbs.h"

#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

/* Apple's RDMA over Thunderbolt (docs: thunderbolt-rdma.md in the project's
 * design notes); every device is held to them so that what works on a Linux
 * NIC or soft-RoCE also works on a Mac. */
#define TB_APPLE_MAX_QP 10
#define TB_APPLE_MAX_MR 100
#define TB_APPLE_MAX_RECV_DEPTH 32
#define TB_APPLE_MAX_SGE 1
#define TB_APPLE_MAX_MSG_SIZE 16773120u
#define TB_FRAME_SIZE 4096u

#define TB_DEVICE_NAME_MAX 64

typedef struct tb_device_limits {
    int max_qp;        /* queue pairs on the device, all processes together */
    int max_mr;        /* memory registrations on the device */
    int max_qp_wr;     /* outstanding work requests per queue (receive depth) */
    int max_sge;       /* scatter-gather entries per work request */
    int max_cqe;       /* completion queue entries */
    uint32_t max_msg;  /* bytes in one message */
    uint32_t mtu;      /* active path MTU in bytes */
} tb_device_limits_t;

typedef struct tb_device {
    char name[TB_DEVICE_NAME_MAX];
    char netdev[IF_NAMESIZE];  /* paired IP interface, "" if unknown */
    uint8_t port;
    bool usable;
    char reason[160];          /* why not usable */
    int gid_index;             /* of the IPv4-mapped GID, -1 if none */
    union ibv_gid gid;
    struct in_addr ipv4;       /* from the IPv4-mapped GID */
    struct in_addr netmask;    /* of netdev, 0 if unknown */
    tb_device_limits_t hw;     /* as the device reports them */
    tb_device_limits_t limits; /* what tbrdma uses: hw clamped to Apple's rules */
    struct ibv_context *context; /* open while usable */
} tb_device_t;

typedef struct tb_device_list {
    tb_verbs_t verbs;
    int count;
    tb_device_t *devices;
} tb_device_list_t;

/* Load the verbs library (NULL: default), list every device that passes the
 * filter, query it, and keep a context open on the usable ones.  A machine
 * with no device is not an error (count 0); a library that cannot be loaded
 * is (-1, err says what to do). */
int tb_device_list_open(tb_device_list_t *list, const char *verbs_library,
                        const tb_namefilter_t *filter, char *err, size_t errlen);

void tb_device_list_close(tb_device_list_t *list);

int tb_device_list_usable_count(const tb_device_list_t *list);

/* How many usable devices of the list have ipv4 (network byte order) on
 * their subnet: more than one, and a peer's address there names no single
 * cable of this host. */
int tb_device_list_count_subnet(const tb_device_list_t *list, uint32_t ipv4);

/* Pure helpers, exposed for tests and tools. */
bool tb_gid_is_ipv4_mapped(const union ibv_gid *gid);
void tb_gid_to_string(const union ibv_gid *gid, char *buf, size_t buflen);
uint32_t tb_mtu_to_bytes(enum ibv_mtu mtu);
void tb_device_limits_clamp(const tb_device_limits_t *hw, tb_device_limits_t *out);
/* The IP interface paired with an RDMA device when the OS does not say:
 * Apple names them rdma_enX / enX. */
void tb_device_guess_netdev(const char *device_name, char *netdev, size_t len);

#endif /* TB_DEVICE_H */
