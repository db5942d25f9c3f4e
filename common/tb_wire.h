/*
 * tbrdma wire formats of the transport: the reliable-channel frame header,
 * the connection address blob exchanged out of band, what a process
 * publishes (modex), put/get over the channel, and connection setup.  The
 * host engine's own formats are in engine/tb_eproto.h.
 *
 * Byte order is explicitly little-endian.  Every host that has RDMA over
 * Thunderbolt (Apple Silicon) and every test host (x86-64, arm64) is
 * little-endian, so the conversions below compile to nothing on the hot path
 * while the format stays defined for any host.
 *
 * Any change to a layout below must bump its version.
 */
#ifndef TB_WIRE_H
#define TB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define TB_WIRE_FRAME_MAGIC 0x43524254u /* "TBRC" in little-endian byte order */
#define TB_WIRE_ADDR_MAGIC 0x41524254u  /* "TBRA" */
#define TB_WIRE_VERSION 2

/* Apple's hardware moves data in 4 KiB frames; a send must land in a receive
 * posted with the same number of frames, and one message is at most this. */
#define TB_WIRE_HW_FRAME 4096u
#define TB_WIRE_HW_MAX_MSG 16773120u

/* Lane 0 carries small frames (latency, all control traffic); lane 1, when
 * configured, carries bulk frames. */
#define TB_WIRE_MAX_LANES 2

typedef enum {
    TB_FRAME_HELLO = 1, /* first frames of a connection; carries the incarnation */
    TB_FRAME_DATA = 2,  /* one fragment of a message */
    TB_FRAME_ACK = 3,   /* acks and credits only; also the keepalive */
    TB_FRAME_CLOSE = 4, /* the sender is closing the channel */
} tb_frame_type_t;

enum {
    TB_FRAME_F_ACK_REQ = 0x01,     /* answer with an ACK frame at once */
    TB_FRAME_F_NAK0 = 0x02,        /* gap seen on lane 0: go back to ack[0] + 1 now */
    TB_FRAME_F_NAK1 = 0x04,        /* same for lane 1 */
    TB_FRAME_F_PAYLOAD_CRC = 0x08, /* payload_crc is valid and must be checked */
    TB_FRAME_F_RETX = 0x10,        /* a retransmission (diagnostics only) */
    TB_FRAME_F_KEEPALIVE = 0x20,   /* sent because the link was idle */
    TB_FRAME_F_PROBE = 0x40,       /* sent because a retransmit timer expired (with
                                    * ACK_REQ): the answer says what arrived */
};

/*
 * Every frame starts with this header; the payload follows it directly.
 *
 * tsn counts transmissions on the frame's lane (every frame, retransmissions
 * included, takes the next tsn); credit[l] is an absolute tsn limit: the
 * receiver has posted receives for every transmission up to and including it.
 * Absolute limits make lost or duplicated credit updates heal by themselves.
 * seq numbers DATA frames on their lane (a retransmission keeps its seq);
 * ack[l] is the last seq received in order on lane l.  All sequence numbers
 * are compared modulo 2^32.
 */
typedef struct __attribute__((packed)) tb_wire_frame_hdr {
    uint32_t magic;
    uint8_t version;
    uint8_t type;  /* tb_frame_type_t */
    uint8_t lane;  /* the lane the frame was posted on */
    uint8_t flags; /* TB_FRAME_F_* */
    uint64_t src_epoch; /* sender's incarnation */
    uint64_t dst_epoch; /* the receiver's incarnation as the sender knows it */
    uint32_t tsn;
    uint32_t seq;
    uint32_t ack[TB_WIRE_MAX_LANES];
    uint32_t credit[TB_WIRE_MAX_LANES];
    uint32_t msg_id;      /* channel-wide message number: delivery order */
    uint32_t msg_len;     /* DATA: total message length; ACK with TB_FRAME_F_NAK0:
                           * lane 0's held-frames bitmap (bit i: seq ack[0] + 2 + i
                           * is held by the receiver and need not be resent) */
    uint32_t frag_offset; /* DATA: offset of this payload in the message; ACK with
                           * TB_FRAME_F_NAK1: lane 1's held-frames bitmap */
    uint32_t payload_len; /* payload bytes in this frame */
    uint8_t tag;          /* user tag */
    uint8_t reserved[3];  /* zero */
    uint16_t echo_tsn[TB_WIRE_MAX_LANES]; /* low 16 bits of the highest tsn the sender
                                           * had received on each lane: tells a
                                           * retransmission's ack from the
                                           * original's, and answers a probe */
    uint32_t payload_crc; /* CRC32C of the payload (TB_FRAME_F_PAYLOAD_CRC) */
    uint32_t hdr_crc;     /* CRC32C of all the bytes above; always checked */
} tb_wire_frame_hdr_t;

#define TB_WIRE_HDR_SIZE 80u
_Static_assert(sizeof(tb_wire_frame_hdr_t) == TB_WIRE_HDR_SIZE, "frame header layout");
_Static_assert(offsetof(tb_wire_frame_hdr_t, tsn) == 24, "frame header layout");
_Static_assert(offsetof(tb_wire_frame_hdr_t, tag) == 64, "frame header layout");
_Static_assert(offsetof(tb_wire_frame_hdr_t, echo_tsn) == 68, "frame header layout");
_Static_assert(offsetof(tb_wire_frame_hdr_t, hdr_crc) == TB_WIRE_HDR_SIZE - 4,
               "hdr_crc must be last: it covers everything before it");

/*
 * Connection address blob.  The channel fills the protocol fields, the link
 * fills gid, qpn and mtu; crc covers all bytes before it.
 */
typedef struct __attribute__((packed)) tb_wire_addr {
    uint32_t magic;
    uint8_t version;
    uint8_t nlanes;
    uint16_t mtu;       /* path MTU in bytes */
    uint64_t epoch;     /* random per channel incarnation, never 0 */
    uint8_t gid[16];
    uint32_t qpn[TB_WIRE_MAX_LANES];
    uint32_t psn[TB_WIRE_MAX_LANES];        /* first tsn and seq per lane */
    uint32_t frame_size[TB_WIRE_MAX_LANES]; /* bytes per receive buffer */
    uint16_t recv_depth[TB_WIRE_MAX_LANES];
    uint32_t crc;
} tb_wire_addr_t;

#define TB_WIRE_ADDR_SIZE 64u
_Static_assert(sizeof(tb_wire_addr_t) == TB_WIRE_ADDR_SIZE, "address blob layout");
_Static_assert(offsetof(tb_wire_addr_t, crc) == TB_WIRE_ADDR_SIZE - 4, "crc must be last");

/*
 * Remote memory access emulated over the channel (Apple's RDMA has no RDMA
 * WRITE or READ).  These ride in channel messages with the tags below:
 * channel tags under 0x10 are tbrdma's own; Open MPI's users of a BTL use
 * 0x10 and up (5.0's MCA_BTL_TAG_BTL_BASE, taken by its AM-RDMA base, which
 * one-sided MPI runs through; 4.1 starts at MCA_BTL_TAG_BTL, 0x20).
 *
 * PUT carries the data after the header and is answered by PUT_ACK;
 * GET_REQ is answered by GET_RESP carrying the data.  ATOMIC carries a
 * tb_wire_rma_atomic_t after the header (len: the operand's width, 4 or 8)
 * and is answered by ATOMIC_RESP carrying the target's old value (8 bytes,
 * little-endian).  The target checks (key, addr, len) against memory it
 * registered before touching any byte; a refused request is answered with a
 * non-zero status and no data.
 *
 * A requester keeps at most TB_WIRE_RMA_WINDOW requests unanswered per peer
 * (and per module: a cable's or the host's) and holds the rest until answers
 * come; a target holds answers its channel cannot take yet up to that many,
 * and fails a peer that sends more.  So a correct requester never makes its
 * target hold more than the window, however slow the link.
 *
 * Version 2 added ATOMIC and ATOMIC_RESP.
 */
#define TB_WIRE_RMA_VERSION 2
#define TB_WIRE_RMA_WINDOW 4096u

enum {
    TB_TAG_RMA_PUT = 0x01,
    TB_TAG_RMA_PUT_ACK = 0x02,
    TB_TAG_RMA_GET_REQ = 0x03,
    TB_TAG_RMA_GET_RESP = 0x04,
    TB_TAG_RMA_ATOMIC = 0x05,
    TB_TAG_RMA_ATOMIC_RESP = 0x06,
    TB_TAG_FIRST_USER = 0x10,
};

typedef enum {
    TB_RMA_OK = 0,
    TB_RMA_ENOKEY = 1,  /* no region registered under that key */
    TB_RMA_ERANGE = 2,  /* [addr, addr+len) is not inside the region */
    TB_RMA_EACCES = 3,  /* the region does not allow this access */
    TB_RMA_EPROTO = 4,  /* malformed request */
    TB_RMA_EALIGN = 5,  /* an atomic's address is not a multiple of its width */
} tb_rma_status_t;
#define TB_RMA_STATUS_MAX TB_RMA_EALIGN

/* An atomic's operation.  Integers, two's complement; MIN and MAX compare
 * signed.  CSWAP stores operand where the old value equals compare. */
enum {
    TB_RMA_AOP_ADD = 1,
    TB_RMA_AOP_AND = 2,
    TB_RMA_AOP_OR = 3,
    TB_RMA_AOP_XOR = 4,
    TB_RMA_AOP_LAND = 5,
    TB_RMA_AOP_LOR = 6,
    TB_RMA_AOP_LXOR = 7,
    TB_RMA_AOP_SWAP = 8,
    TB_RMA_AOP_MIN = 9,
    TB_RMA_AOP_MAX = 10,
    TB_RMA_AOP_CSWAP = 11,
    TB_RMA_AOP_LAST = TB_RMA_AOP_CSWAP,
};

typedef struct __attribute__((packed)) tb_wire_rma_atomic {
    uint8_t op;         /* TB_RMA_AOP_* */
    uint8_t reserved;   /* zero */
    uint16_t reserved2; /* zero */
    uint32_t reserved3; /* zero */
    uint64_t operand;   /* a 4-byte atomic uses the low half of both */
    uint64_t compare;   /* CSWAP only, zero otherwise */
} tb_wire_rma_atomic_t;

#define TB_WIRE_RMA_ATOMIC_SIZE 24u
_Static_assert(sizeof(tb_wire_rma_atomic_t) == TB_WIRE_RMA_ATOMIC_SIZE, "RMA atomic layout");

typedef struct __attribute__((packed)) tb_wire_rma_hdr {
    uint8_t version;
    uint8_t status;      /* tb_rma_status_t, in replies */
    uint16_t reserved;   /* zero */
    uint32_t reserved2;  /* zero */
    uint64_t req_id;     /* the requester's, echoed in the reply */
    uint64_t key;        /* the target's registration key */
    uint64_t addr;       /* target address */
    uint64_t len;        /* bytes to put or get */
} tb_wire_rma_hdr_t;

#define TB_WIRE_RMA_HDR_SIZE 40u
_Static_assert(sizeof(tb_wire_rma_hdr_t) == TB_WIRE_RMA_HDR_SIZE, "RMA header layout");

/*
 * What a process publishes about itself (Open MPI's modex): one entry per
 * device it uses.  A peer finds the cable between them by subnet: each cable
 * has its own small IPv4 subnet, so a local device and a peer device whose
 * addresses share the local device's subnet are the two ends of one cable.
 * cm_port is the TCP port (on that address) where connections are set up.
 *
 * cm_secret is this process's connection-setup secret.  The modex reaches
 * only the processes of the job (through the launcher, never a cable), so
 * two of them derive a key from both their secrets that nobody else has, and
 * authenticate every connection-setup message with it (tb_cm.h).
 *
 * path says who owns the process's queue pairs: the process itself
 * (TB_MODEX_PATH_DIRECT: cm_port is its own connection manager), or its
 * host's engine (TB_MODEX_PATH_ENGINE: cm_port is the engine's, engine_id
 * names that engine and is its public key, zero otherwise).  Two processes reach each other only
 * over the same path.
 */
#define TB_WIRE_MODEX_MAGIC 0x4d524254u /* "TBRM" */
/* Version 5: an engine's id is its X25519 public key (32 bytes), which
 * engines prove, and a rank on the engine path publishes its pid (engine
 * protocol version 5, engine/tb_eproto.h); engines meet only through their
 * ranks' modex, so this is what keeps engines of different versions apart. */
#define TB_WIRE_MODEX_VERSION 5
#define TB_WIRE_ENGINE_ID_SIZE 32

enum {
    TB_MODEX_PATH_DIRECT = 0,
    TB_MODEX_PATH_ENGINE = 1,
};
#define TB_WIRE_MODEX_MAX_DEVICES 16
#define TB_WIRE_SECRET_SIZE 32

typedef struct __attribute__((packed)) tb_wire_modex_dev {
    uint32_t ipv4;    /* network byte order, as in struct in_addr */
    uint32_t netmask; /* network byte order */
    uint8_t gid[16];
    uint16_t cm_port; /* little-endian, like every other integer here */
    uint16_t reserved;
    uint32_t reserved2;
} tb_wire_modex_dev_t;

typedef struct __attribute__((packed)) tb_wire_modex {
    uint32_t magic;
    uint8_t version;
    uint8_t ndevices;
    uint8_t path;     /* TB_MODEX_PATH_* */
    uint8_t reserved; /* zero */
    uint8_t cm_secret[TB_WIRE_SECRET_SIZE];
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
    uint32_t pid; /* TB_MODEX_PATH_ENGINE: this process, as its engine sees it */
    uint32_t reserved2; /* zero */
    tb_wire_modex_dev_t devices[]; /* ndevices entries */
} tb_wire_modex_t;

_Static_assert(sizeof(tb_wire_modex_dev_t) == 32, "modex device entry layout");
_Static_assert(sizeof(tb_wire_modex_t) == 80, "modex header layout");

/*
 * Connection setup over TCP (tb_cm.h), version 2.  Four fixed-size messages,
 * each starting with tb_wire_cm_hdr_t; which one comes next is known from the
 * exchange's state, so each is read whole before it is looked at:
 *
 *   requester -> responder  HELLO      nonce_r
 *   responder -> requester  CHALLENGE  nonce_s
 *   requester -> responder  REQUEST    identities, blob, mac
 *   responder -> requester  REPLY      status, blob, mac
 *
 * The macs are HMAC-SHA256 under the pair's key over both nonces and the
 * message (the REPLY's also over the REQUEST's mac), so neither a forged nor
 * a replayed message is accepted, and the responder says nothing about itself
 * before the requester has proved it belongs to the job.
 */
#define TB_WIRE_CM_MAGIC 0x4d434254u /* "TBCM" */
#define TB_WIRE_CM_VERSION 2
#define TB_WIRE_CM_NONCE 16
#define TB_WIRE_CM_ID_MAX 64
#define TB_WIRE_CM_MAC 32

enum {
    TB_CM_MSG_HELLO = 1,
    TB_CM_MSG_CHALLENGE = 2,
    TB_CM_MSG_REQUEST = 3,
    TB_CM_MSG_REPLY = 4,
};

/* REPLY status. */
enum {
    TB_CM_R_ACCEPT = 0,
    TB_CM_R_REFUSED = 1,   /* the responder's owner refused */
    TB_CM_R_COLLISION = 2, /* both asked at once; the responder's request stands */
};

typedef struct __attribute__((packed)) tb_wire_cm_hdr {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint16_t reserved; /* zero */
} tb_wire_cm_hdr_t;

typedef struct __attribute__((packed)) tb_wire_cm_nonce_msg {
    tb_wire_cm_hdr_t hdr; /* HELLO or CHALLENGE */
    uint8_t nonce[TB_WIRE_CM_NONCE];
} tb_wire_cm_nonce_msg_t;

typedef struct __attribute__((packed)) tb_wire_cm_request {
    tb_wire_cm_hdr_t hdr;
    uint8_t id_len;      /* the requester's identity: 1..TB_WIRE_CM_ID_MAX */
    uint8_t peer_id_len; /* the identity it wants to reach */
    uint8_t reserved[6];
    uint8_t id[TB_WIRE_CM_ID_MAX]; /* zero beyond id_len */
    uint8_t peer_id[TB_WIRE_CM_ID_MAX];
    tb_wire_addr_t addr;
    uint8_t mac[TB_WIRE_CM_MAC];
} tb_wire_cm_request_t;

typedef struct __attribute__((packed)) tb_wire_cm_reply {
    tb_wire_cm_hdr_t hdr;
    uint8_t status;
    uint8_t reserved[7];
    tb_wire_addr_t addr; /* zero unless status is TB_CM_R_ACCEPT */
    uint8_t mac[TB_WIRE_CM_MAC];
} tb_wire_cm_reply_t;

_Static_assert(sizeof(tb_wire_cm_hdr_t) == 8, "cm header layout");
_Static_assert(sizeof(tb_wire_cm_nonce_msg_t) == 24, "cm nonce message layout");
_Static_assert(sizeof(tb_wire_cm_request_t) == 240, "cm request layout");
_Static_assert(sizeof(tb_wire_cm_reply_t) == 112, "cm reply layout");

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint16_t tb_wire_le16(uint16_t v) { return v; }
static inline uint32_t tb_wire_le32(uint32_t v) { return v; }
static inline uint64_t tb_wire_le64(uint64_t v) { return v; }
#elif defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
static inline uint16_t tb_wire_le16(uint16_t v) { return __builtin_bswap16(v); }
static inline uint32_t tb_wire_le32(uint32_t v) { return __builtin_bswap32(v); }
static inline uint64_t tb_wire_le64(uint64_t v) { return __builtin_bswap64(v); }
#else
#error "tb_wire.h: cannot tell the host byte order"
#endif

/* Number of 4 KiB hardware frames a transfer of len bytes occupies (0 B is 1). */
static inline uint32_t tb_wire_hw_frames(size_t len)
{
    return len == 0 ? 1u : (uint32_t) ((len + TB_WIRE_HW_FRAME - 1) / TB_WIRE_HW_FRAME);
}

/* Serial-number arithmetic (RFC 1982 style) for 32-bit sequence numbers (and
 * for the 16-bit tsn echoes: tsns in flight at once differ by far less). */
static inline int16_t tb_seq16_diff(uint16_t a, uint16_t b)
{
    return (int16_t) (uint16_t) (a - b);
}

static inline int32_t tb_seq_diff(uint32_t a, uint32_t b)
{
    return (int32_t) (a - b);
}

static inline int tb_seq_lt(uint32_t a, uint32_t b)
{
    return tb_seq_diff(a, b) < 0;
}

static inline int tb_seq_le(uint32_t a, uint32_t b)
{
    return tb_seq_diff(a, b) <= 0;
}

#endif /* TB_WIRE_H */
