/*
 * tbrdma host engine: its protocol, with the ranks of its host (attach over
 * a Unix socket, records in shared-memory rings) and with other hosts'
 * engines (messages over their channel).  Byte order and rules as in
 * common/tb_wire.h: little-endian, every layout's size asserted, and any
 * change to a layout bumps TB_WIRE_ENGINE_VERSION.
 */
#ifndef TB_EPROTO_H
#define TB_EPROTO_H

#include <stddef.h>
#include <stdint.h>

#include "tb_wire.h"

/* The largest message between two ranks through engines (a put or get of
 * 512 KiB with its header fits), and so the smallest ring that takes one
 * (a record is at most a quarter of its ring). */
#define TB_ENGINE_MAX_MSG ((512u << 10) + 64u)
#define TB_ENGINE_MIN_RING (4u << 20)

/* A rank's doorbell byte on its socket: TB_EDOORBELL_BYE says it finalizes
 * (its socket closing next is not a death). */
#define TB_EDOORBELL 1
#define TB_EDOORBELL_BYE 'B'

/*
 * Ranks and their engine.  The host engine (daemon/tb_engine.h): one
 * process per host and job owns the devices; the job's processes on that
 * host (its ranks) reach it through a Unix socket in the job's directory
 * (client/tb_jobdir.h: attach, doorbells, and its closing as the sign of
 * death) and two rings in shared memory per rank (client/tb_shm_ring.h),
 * which carry records.
 *
 * Attach: the rank connects, sends tb_wire_eattach_t with the descriptor of
 * its shared memory (SCM_RIGHTS); the engine checks the peer's credentials
 * and the job key and answers tb_wire_eattach_reply_t.
 */
#define TB_WIRE_ENGINE_MAGIC 0x45524254u /* "TBRE" */
#define TB_WIRE_ENGINE_VERSION 9
#define TB_WIRE_ENGINE_MAX_DEVICES TB_WIRE_MODEX_MAX_DEVICES

typedef struct __attribute__((packed)) tb_wire_eattach {
    uint32_t magic;
    uint8_t version;
    uint8_t reserved[3];   /* zero */
    uint32_t vpid;         /* the rank's number in the job */
    uint32_t pid;
    uint64_t ring_size;    /* bytes of each ring's data; the segment is
                            * TB_SHM_RING_CTRL + 2 * ring_size */
    uint8_t key[TB_WIRE_SECRET_SIZE]; /* the job's key on this host */
} tb_wire_eattach_t;

typedef struct __attribute__((packed)) tb_wire_edev {
    char name[64];   /* NUL-terminated */
    char netdev[16]; /* NUL-terminated */
    uint32_t ipv4;   /* network byte order */
    uint32_t netmask;
    uint8_t gid[16];
    uint16_t cm_port; /* the engine's connection manager on this cable */
    uint16_t reserved;
    uint32_t reserved2;
} tb_wire_edev_t;

enum {
    TB_EATTACH_OK = 0,
    TB_EATTACH_REFUSED = 1, /* bad key, credentials or request: why says which */
    TB_EATTACH_NODEV = 2,   /* the engine has no usable device: why says why */
    TB_EATTACH_FULL = 3,    /* no room for another rank */
};

typedef struct __attribute__((packed)) tb_wire_eattach_reply {
    uint32_t magic;
    uint8_t version;
    uint8_t status; /* TB_EATTACH_* */
    uint8_t ndevices;
    uint8_t reserved;
    uint32_t engine_pid;
    uint32_t max_record; /* the largest record payload either ring takes */
    /* The rank's own pid as the engine saw it on the socket (its pid
     * namespace may differ): the pid the rank publishes, and the one every
     * message for it must name (tb_wire_erec_t). */
    uint32_t rank_pid;
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
    char why[200]; /* NUL-terminated */
    tb_wire_edev_t devices[TB_WIRE_ENGINE_MAX_DEVICES];
} tb_wire_eattach_reply_t;

_Static_assert(sizeof(tb_wire_eattach_t) == 56, "engine attach layout");
_Static_assert(sizeof(tb_wire_edev_t) == 112, "engine device layout");
_Static_assert(sizeof(tb_wire_eattach_reply_t) == 252 + 16 * 112, "engine attach reply layout");

/* A ring record: this header, then len bytes, padded to TB_WIRE_EREC_ALIGN. */
#define TB_WIRE_EREC_ALIGN 32u /* a header (24 bytes) fits wherever a record may start */

typedef enum {
    TB_EREC_PAD = 0,    /* filler up to the ring's end */
    /* rank -> engine */
    TB_EREC_SEND = 1,   /* a message for rank vpid over route link */
    TB_EREC_ROUTE = 2,  /* link (the rank's route number) = tb_wire_eroute_t */
    TB_EREC_JOBKEY = 3, /* the job's engine secret (TB_WIRE_SECRET_SIZE bytes) */
    TB_EREC_BYE = 4,    /* the rank finalizes: nothing follows */
    TB_EREC_HOSTS = 5,  /* the job's hosts and their cables' ends: tb_wire_ehost_t[] */
    /* engine -> rank */
    TB_EREC_RECV = 16,  /* a message from rank vpid through the engine's peer link */
    TB_EREC_PEER = 17,  /* peer link is the engine tb_wire_epeer_t names */
    TB_EREC_GONE = 18,  /* process pid, rank vpid behind peer link, died (or, for
                         * the pid a send named, is not there); payload: why */
    TB_EREC_DOWN = 19,  /* peer link (that engine, or its cable) failed; payload: why */
} tb_erec_type_t;

/* RECV and GONE records whose link is TB_ELINK_LOCAL + dev come from a
 * rank of this engine's own host, sent over the rank's route on device dev:
 * the engine hands them from ring to ring (a route naming the engine itself
 * says so).  Peer links are below it.
 *
 * A RECV record's link also carries TB_ELINK_HOST when the message was sent
 * over a route flagged TB_EROUTE_F_HOST: from the sender's host-wide module
 * (one that reaches every peer, whichever cable leads there), for the
 * receiver's own, so that answers come back to the module that asked. */
#define TB_ELINK_LOCAL 0x8000u
#define TB_ELINK_HOST 0x4000u

typedef struct __attribute__((packed)) tb_wire_erec {
    /* Written last, with release order: the record's position in the ring's
     * stream plus one, xor the ring's nonce.  The consumer reads a record
     * where it lies once its stamp says it is complete: no separate head. */
    uint64_t stamp;
    uint32_t len;  /* payload bytes after this header */
    uint8_t type;  /* tb_erec_type_t */
    uint8_t tag;   /* SEND, RECV: the message's tag */
    uint16_t link; /* SEND, ROUTE: the rank's route; RECV..DOWN: the engine's peer */
    uint32_t vpid; /* SEND: destination; RECV, GONE: source */
    /* SEND: the destination's pid as its modex entry says; RECV, GONE: the
     * source's pid as its engine saw it attach (the socket's credentials,
     * not the rank's word).  A process that attached under another rank's
     * vpid so neither receives that rank's messages nor passes for it. */
    uint32_t pid;
} tb_wire_erec_t;

enum {
    TB_EROUTE_F_HOST = 0x01, /* the rank's host-wide module (see TB_ELINK_HOST) */
    /* To an engine no cable of this host reaches: engine_id names it, dev
     * the device of the first hop; the engines relay (TB_ETAG_RELAY) along
     * the route the job's cabling gives (common/tb_topology.h).  ipv4,
     * cm_port and gid are zero. */
    TB_EROUTE_F_ROUTED = 0x02,
};

typedef struct __attribute__((packed)) tb_wire_eroute {
    uint8_t dev;   /* the engine's device (index in the attach reply) */
    uint8_t flags; /* TB_EROUTE_F_* */
    uint8_t reserved[2];
    uint32_t ipv4;    /* the far engine's address on that cable */
    uint16_t cm_port; /* and its connection manager's port */
    uint16_t reserved2;
    uint8_t gid[16]; /* its device's gid, which its blob must carry */
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
    uint32_t reserved3;
} tb_wire_eroute_t;

typedef struct __attribute__((packed)) tb_wire_epeer {
    uint8_t dev;
    uint8_t reserved[7];
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
} tb_wire_epeer_t;

/* One end of a cable in the job's table of hosts (TB_EREC_HOSTS): the
 * entries are sorted by engine id, then dev, and a host's devs count from 0.
 * A rank builds it from the job's modex entries, so every rank of every host
 * gives its engine the same table. */
typedef struct __attribute__((packed)) tb_wire_ehost {
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
    uint32_t ipv4; /* network byte order */
    uint32_t netmask;
    uint8_t gid[16];
    uint16_t cm_port; /* that engine's connection manager on this cable */
    uint8_t dev;
    uint8_t reserved[5];
} tb_wire_ehost_t;

_Static_assert(sizeof(tb_wire_erec_t) == 24, "ring record layout");
_Static_assert(sizeof(tb_wire_ehost_t) == 64, "host table entry layout");
_Static_assert(sizeof(tb_wire_eroute_t) == 64, "route record layout");
_Static_assert(sizeof(tb_wire_epeer_t) == 40, "peer record layout");

/*
 * Between engines, over their channel: one header, then the payload; every
 * header is checked by daemon/tb_emsg.h before use.  Channel tags:
 */
enum {
    TB_ETAG_DATA = 1,   /* a message from rank src to rank dst */
    TB_ETAG_CREDIT = 2, /* rank dst consumed credit bytes of what this engine sent it */
    TB_ETAG_GONE = 3,   /* rank src died; payload: why */
    /* A message between two engines no cable joins, carried by the engines
     * on the route: tb_wire_erelay_t, then the message (its tag, header and
     * payload as between neighbours). */
    TB_ETAG_RELAY = 4,
    /* Only inside RELAY, from a relay (its src_host): it lost the way to the
     * host tb_wire_eunreach_t names; then why, as text. */
    TB_ETAG_UNREACH = 5,
    /* A failed cable that works again (daemon/tb_engine_back.c).  BACK: the
     * last message of the flow that goes round the cable; what follows comes
     * over it, once the far end answers BACK_OK (not numbered, over the
     * cable's new channel, seq naming the BACK it answers).  Header only;
     * src and dst: the new channel's two epochs xor'd (tb_wire_addr_t's, the
     * same at both ends), low half in src: which try of the cable it is. */
    TB_ETAG_BACK = 6,
    TB_ETAG_BACK_OK = 7,
};

typedef struct __attribute__((packed)) tb_wire_eunreach {
    uint16_t host;
    uint8_t reserved[6];
} tb_wire_eunreach_t;

typedef struct __attribute__((packed)) tb_wire_erelay {
    uint32_t digest;   /* of the job's host table both ends route by */
    uint16_t src_host; /* index in that table (sorted by engine id) */
    uint16_t dst_host;
    uint8_t tag;       /* the message's own: DATA, CREDIT, GONE, UNREACH; BACK, RELAY (flow) */
    uint8_t hops_left; /* set to the number of hosts; a relay that finds 0 drops it */
    /* 0: between two engines no cable joins, along the table's route.  d + 1:
     * the traffic of src_host's cable on its device d to dst_host, which
     * failed, going round it: over another cable to dst_host, or along the
     * cable's way round through other hosts (common/tb_topology.h's
     * tb_topo_detour, daemon/tb_engine_detour.c).  Its tag may then also be
     * RELAY (what the cable carried for other hosts, behind this header) or
     * UNREACH (from a host on the way round, named by tb_wire_eunreach_t:
     * the way is cut there). */
    uint8_t flow;
    uint8_t reserved[5];
} tb_wire_erelay_t;

_Static_assert(sizeof(tb_wire_erelay_t) == 16, "relay header layout");
_Static_assert(sizeof(tb_wire_eunreach_t) == 8, "relay notice layout");

enum {
    TB_EMSG_F_HOST = 0x01, /* DATA: between the ranks' host-wide modules */
};

typedef struct __attribute__((packed)) tb_wire_emsg {
    uint32_t src;
    uint32_t dst;
    uint8_t tag;
    uint8_t flags; /* TB_EMSG_F_* */
    uint8_t reserved[2];
    uint32_t credit;  /* CREDIT */
    uint32_t src_pid; /* DATA, GONE: as the source's engine saw it attach */
    uint32_t dst_pid; /* DATA: as the sender read it in the modex */
    /* The message's number in its flow (one per peer engine and cable, or
     * per routed peer), from 0: a flow whose cable fails is sent again,
     * from the oldest message the channel may not have delivered, another
     * way, and the receiver drops what it already has by this number. */
    uint32_t seq;
    uint32_t reserved2;
} tb_wire_emsg_t;

_Static_assert(sizeof(tb_wire_emsg_t) == 32, "engine message layout");

/* Credit between engines (per destination rank, the receiving engine's
 * window) counts what a DATA message costs its receiver, not only its
 * payload: the payload plus TB_WIRE_ECREDIT_OVERHEAD, which covers a held
 * message's header and allocation or a ring record's header and padding.
 * So empty messages are bounded like full ones.  Version 3 counts so. */
#define TB_WIRE_ECREDIT_OVERHEAD 64u

static inline uint64_t tb_ecredit_cost(uint64_t payload_len)
{
    return payload_len + TB_WIRE_ECREDIT_OVERHEAD;
}

#endif /* TB_EPROTO_H */
