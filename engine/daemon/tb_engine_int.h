/*
 * tbrdma host engine, daemon: the host engine's internals, shared by tb_engine.c
 * (loop), tb_engine_rank.c (rings), tb_engine_attach.c (attach, death) and
 * tb_engine_peer.c (devices, other engines).
 */
#ifndef TB_ENGINE_INT_H
#define TB_ENGINE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "tb_clock.h"
#include "tb_cm.h"
#include "tb_device.h"
#include "tb_domain.h"
#include "tb_engine.h"
#include "tb_eproto.h"
#include "tb_log.h"
#include "tb_shm_ring.h"
#include "tb_topology.h"

#define ENG_MAX_RANKS 64
/* Connections accepted whose attach request has not arrived yet, and how
 * long one may take: the loop never waits for a process to speak. */
#define ENG_MAX_PENDING 16
#define ENG_PENDING_NS 2000000000ull
#define ENG_MAX_PEERS 256
/* Engines one rank may name in its routes (peers are made from its word, so
 * no rank may take more than its share of the table): 16 hosts with 4
 * cables to each fit. */
#define ENG_RANK_MAX_PEERS 64
#define ENG_MAX_ROUTES 4096
/* A route to a rank of this host over device dev, and its device back. */
#define ENG_ROUTE_LOCAL(dev) ((int16_t) (-2 - (int) (dev)))
#define ENG_ROUTE_LOCAL_DEV(route) ((unsigned) (-2 - (int) (route)))
#define ENG_TXQ 1024
/* A peer's table of destination ranks: room for the ranks one engine serves
 * twice over, since ranks add to it on their word (one rank may have at most
 * ENG_MAX_RANKS of them), and twice as many hash slots so probes stay short. */
#define ENG_DST_MAX (2 * ENG_MAX_RANKS)
#define ENG_DST_HASH (2 * ENG_DST_MAX)
#define ENG_DST_NOBODY 0xffu
/* Connection setup to another engine is tried this often (backing off from
 * 50 ms to 500 ms, about 7 s in all): the other engine may not have its
 * job's key yet, or may be starting. */
#define ENG_DIAL_TRIES 20
/* A failed cable's end with the lower engine id dials it again this often
 * while its traffic goes round it (tb_engine_back.c); each try ends by the
 * peer timeout at most. */
#define ENG_BACK_EVERY_NS 1000000000ull
/* Diffie-Hellmans for engines no rank named yet (tb_eng_cm_peer_secret): a burst
 * larger than the engines a host's cables reach (one per cable, and one
 * secret per engine whatever its cables), then 32 a second (about 3 % of a
 * core). */
#define ENG_DH_BURST 32u
_Static_assert(ENG_DH_BURST >= TB_WIRE_ENGINE_MAX_DEVICES, "a burst for every cable's engine");
#define ENG_DH_EVERY_NS 31250000ull

/* What a channel completion cookie points at. */
enum {
    ENG_COOKIE_TX = 1,  /* a rank's record sent from its ring */
    ENG_COOKIE_MSG = 2, /* an eng_msg_t the engine owns */
    ENG_COOKIE_RELAY = 3, /* an eng_msg_t forwarded for other hosts (its link: the peer it came from) */
};

/* Relaying (tb_engine_route.c).  A routed peer keeps at most this share of
 * the credit window in flight, all its destination ranks together, so what a
 * relay can be asked to hold stays a small multiple of it (ENG_RELAY_HOLD). */
#define ENG_ROUTED_WINDOW_SHARE 4u
/* What a relay holds for the neighbour of host index nh, forwarded or
 * waiting for the next hop, per pair of hosts whose route comes through that
 * neighbour to be passed on from here (the only pairs it may send for, with
 * the detours of its own cables through here): the
 * source's routed window counts payload + 64 per message, which holding costs
 * at most 1.75 times (ENG_MSG_COST of an empty DATA); the CREDIT messages
 * for the opposite pair, not under credit, at most one per message it
 * answers, as much again; so four quarter windows, and one largest message. */
#define ENG_RELAY_HOLD(e, nh)                                                            \
    ((uint64_t) (e)->relay_pairs_from[nh]                                               \
         * ((e)->p.credit_window + ENG_MSG_COST(TB_ENGINE_MAX_MSG))                     \
     + (uint64_t) (e)->detour_pairs_from[nh] * ENG_DETOUR_RELAY_HOLD(e))
/* A failed cable's flow going round it through here: what its channel had
 * in flight when it failed, sent again at once (DATA under credit: at most a
 * window per rank of the far host, which one engine serves at most
 * ENG_MAX_RANKS of), then the routed share, as for a pair of hosts. */
#define ENG_DETOUR_RELAY_HOLD(e)                                                         \
    ((uint64_t) (ENG_MAX_RANKS + 1) * ((e)->p.credit_window + ENG_MSG_COST(TB_ENGINE_MAX_MSG)))
/* What one cable's traffic come round it may hold here before this end sees
 * the cable fail (the sender's routed share of the window keeps well within
 * it); a relay that sends more is cut. */
#define ENG_DETOUR_HOLD(e) ((e)->p.credit_window + ENG_MSG_COST(TB_ENGINE_MAX_MSG))
/* The same at the far end of a cable whose traffic for other hosts goes
 * round it too (through a third host): what relayed pairs arriving from the
 * cable's other end, host nh, may hold in flight besides. */
#define ENG_ROUND_HOLD(e, nh)                                                            \
    (ENG_DETOUR_HOLD(e)                                                                  \
     + (uint64_t) (e)->arrive_pairs_from[nh]                                             \
           * ((e)->p.credit_window + ENG_MSG_COST(TB_ENGINE_MAX_MSG)))
/* Relayed messages that came before this host's ranks gave the job's table
 * (they wait for it): at most this many bytes, then the neighbour is cut. */
#define ENG_RELAY_EARLY (64u << 20)

/* Bytes of a rank's ring, or of messages waiting for credit, that one pass
 * of the loop takes before it polls the devices again. */
#define ENG_TX_SHARE (1u << 20)
/* Reads of 4 KiB that one pass takes from one rank's socket. */
#define ENG_SOCKET_READS 4
/* Connection-setup sockets per device watched while the engine sleeps (more
 * are served at the next pass, at most one sleep later). */
#define ENG_CM_POLL 16

/* The parts of the loop timed for tb_eng_log_loop (GAP: between two polls
 * of the devices). */
enum { ENG_PH_DEVICES, ENG_PH_RANKS, ENG_PH_PEERS, ENG_PH_SOCKETS, ENG_PH_SLEEP, ENG_PH_GAP,
       ENG_PHASES };

typedef struct eng_rank eng_rank_t;
typedef struct eng_peer eng_peer_t;

/* The way round one cable of the job: its hosts, from its end of lower
 * index to the other (tb_topo_detour); len 0 when there is none. */
typedef struct eng_detour {
    uint8_t len;
    uint8_t host[TB_TOPO_MAX_HOSTS];
} eng_detour_t;

/* A rank's SEND in flight in a channel, straight from its ring. */
typedef struct eng_txrec {
    int kind;
    bool done;
    eng_rank_t *rank;
    uint64_t end;       /* the record's end in the ring */
    tb_wire_emsg_t hdr; /* what precedes its payload on the channel */
} eng_txrec_t;

/* A RECV in a rank's ring, for credit: the credit it cost (tb_ecredit_cost)
 * from peer, ending at end. */
typedef struct eng_rxrec {
    uint64_t end;
    uint16_t peer;
    uint32_t bytes;
} eng_rxrec_t;

/* A message the engine holds: a record waiting for room in a rank's ring, a
 * rank's message waiting for credit (data = header and payload), or a
 * control message in a channel. */
typedef struct eng_msg {
    int kind;
    struct eng_msg *next;
    uint8_t type;
    uint8_t tag;
    uint16_t link;
    uint32_t vpid; /* record: the source; waiting for credit: the destination */
    uint32_t pid;  /* record: as tb_wire_erec_t's */
    int src_slot;  /* waiting for credit: the sending rank's slot, -1 once it left */
    size_t len;
    /* Waiting for credit, left where it lies: its payload is in the sending
     * rank's ring at payload, kept there by ref (a txq entry not done), and
     * data holds only its header (len still counts the whole message). */
    eng_txrec_t *ref;
    const uint8_t *payload;
    uint8_t data[];
} eng_msg_t;

/* A message waits for credit in its rank's ring, not copied.  Beyond these
 * shares of the ring's bytes and txq entries pinned, what waits for a
 * destination whose credit has not moved for ENG_UNPIN_AFTER_NS is copied
 * out, so a destination that does not read can never fill its senders' rings
 * (they would stop sending to anyone); what waits for a destination whose
 * credit flows stays, and a full ring holds its rank back instead. */
#define ENG_REF_RING_SHARE 2u /* at most 1/2 of the ring */
#define ENG_REF_TXQ (ENG_TXQ / 2)
/* Longer than credit takes to come back on a busy host (100 ms copied out
 * half of a 1 MiB stream with 4 ranks per host on the virtual cluster), short
 * beside a computation that stops a destination reading. */
#define ENG_UNPIN_AFTER_NS (1000ull * 1000000ull)

/* What a held message of len bytes costs the engine, its header and the
 * allocator's own included: the bounds on held messages (held_max) count
 * this, so empty messages cannot pile up without bound. */
#define ENG_MSG_COST(len) (sizeof(eng_msg_t) + (len) + 16u)

typedef enum {
    ENG_RANK_FREE = 0,
    ENG_RANK_ATTACHED,
    ENG_RANK_DEAD,  /* left or failed; freed once its socket and sends are done */
    ENG_RANK_NODEV, /* attached only to learn there is no device */
} eng_rank_state_t;

struct eng_rank {
    tb_engine_t *e;
    unsigned slot;
    int state;
    int fd;
    uint32_t vpid;
    pid_t pid;
    void *seg;
    size_t seg_len;
    tb_shm_ring_t tx; /* rank -> engine */
    tb_shm_ring_t rx; /* engine -> rank */
    int16_t *routes;  /* the rank's route number -> peer index, -1; ENG_ROUTE_LOCAL(dev): a rank
                       * of this host, over device dev */
    uint8_t route_host[ENG_MAX_ROUTES / 8]; /* routes flagged TB_EROUTE_F_HOST */
    eng_txrec_t txq[ENG_TXQ];
    unsigned txq_first, txq_len;
    eng_rxrec_t *rxq;
    unsigned rxq_first, rxq_len, rxq_cap;
    eng_msg_t *ovf_head, *ovf_tail; /* records waiting for room in rx */
    uint64_t ovf_bytes;  /* what they cost (ENG_MSG_COST) */
    uint64_t held_bytes; /* what its messages waiting for credit cost (ENG_MSG_COST) */
    uint8_t announced[ENG_MAX_PEERS / 8];
    uint8_t named[ENG_MAX_PEERS / 8]; /* the peers its routes named */
    unsigned nnamed;
    bool bye;      /* its BYE record was read */
    bool leaving;  /* it said on its socket that it finalizes */
    bool blocked;  /* its ring waits for credit, room or the channel */
    /* The peer whose channel writes a message into a record reserved in rx
     * (tb_engine_place.c): till it is whole, other records wait in the
     * overflow, and the rank is not freed. */
    eng_peer_t *placing;
    unsigned npinned; /* its messages waiting for credit left in tx (eng_msg_t.ref) */
    uint64_t unpin_check_ns; /* pinned beyond its share: when to look for starved ones */
};

/* Credit toward one rank behind a peer engine.  An engine serves at most
 * ENG_MAX_RANKS ranks: the table's size is fixed (ENG_DST_MAX), whatever
 * vpids the ranks name; one with nothing in flight or waiting can be
 * forgotten to make room. */
typedef struct eng_dst {
    uint32_t vpid;
    uint32_t used;    /* bytes in flight (tb_ecredit_cost) */
    uint32_t nwait;   /* messages waiting for credit */
    uint32_t blocked; /* a mark for the scan of the waiting list */
    uint8_t adder;    /* the slot of the rank that named it, ENG_DST_NOBODY once it left */
    uint64_t moved_ns; /* its credit last came back, or a message began to wait for it */
} eng_dst_t;

typedef enum {
    ENG_PEER_IDLE = 0,
    ENG_PEER_CONNECTING,
    ENG_PEER_CONNECTED,
    ENG_PEER_FAILED,
    ENG_PEER_CLOSED,
} eng_peer_state_t;

struct eng_peer {
    tb_engine_t *e;
    unsigned idx;
    unsigned dev;
    uint8_t id[TB_WIRE_ENGINE_ID_SIZE];
    int state;
    tb_conn_t *conn;
    bool known; /* a rank told where it is (ipv4, port, gid) */
    unsigned dial_tries;
    uint64_t redial_at; /* 0, or when to dial again after a setup that failed */
    bool want_dial;
    bool destroy;
    uint32_t ipv4;
    uint16_t port;
    uint8_t gid[16];
    uint8_t pair_secret[TB_WIRE_SECRET_SIZE]; /* tb_eng_cm_peer_secret's, once have_pair */
    bool have_pair;
    /* The ranks behind it that this host's ranks send to, and where each is
     * in dst (index + 1; 0: free), by vpid. */
    eng_dst_t dst[ENG_DST_MAX];
    unsigned ndst;
    uint8_t dst_slot[ENG_DST_HASH];
    uint32_t scan_gen;
    bool credit_changed;
    eng_msg_t *wait_head, *wait_tail;
    /* Notices (a rank gone) the channel had no room for: sent before
     * anything else once it has. */
    eng_msg_t *notice_head, *notice_tail;
    unsigned nnotices;
    bool notices_full; /* said once that more were not kept */
    /* The processes it said are gone, as rank and pid (a process that
     * attached in a rank's name dies as itself): each is told to this
     * host's ranks once, and an engine serves at most ENG_MAX_RANKS, so
     * more is a lie. */
    struct {
        uint32_t vpid;
        uint32_t pid;
    } gone[ENG_MAX_RANKS];
    unsigned ngone;
    /* A routed peer (an engine no cable of this host reaches): its messages
     * go over via's channel behind relay[tag] (tb_engine_route.c); host is
     * its index in the job's table, used_total what is in flight to it.  A
     * peer over a cable that failed goes round it the same way (detoured:
     * via set, not routed; tb_eng_peer_detour). */
    bool routed;
    eng_peer_t *via;
    unsigned host;
    uint64_t used_total;
    tb_wire_erelay_t relay[TB_ETAG_BACK + 1];
    /* A neighbour: messages forwarded through it that its channel had no
     * room for, in order, and what this engine holds of what it relays for
     * it (its queue here and elsewhere, and in channels). */
    eng_msg_t *fwd_head, *fwd_tail;
    uint64_t relay_held;
    /* A neighbour whose cable failed while another cable to its host
     * stood: what went over this cable for other hosts (relayed, and the
     * messages of the peers that go through it) goes over relay_to's from
     * then on, for the rest of the job (tb_eng_peer_detour).  unsent_relay:
     * such messages its failed channel handed back, in order, to send again
     * first (relay_unsent_lost: it could not hand back every one);
     * fwd_hold: how many messages at the head of fwd go before the peers
     * that go through this one may send again (tb_eng_peer_channel). */
    eng_peer_t *relay_to;
    /* A neighbour whose cable failed with its way round through other
     * hosts: what went over the cable for other hosts goes round it too,
     * each message behind the flow's own relay header (relay[TB_ETAG_RELAY],
     * naming the cable), from fwd; the routed peers that went through it
     * send behind it the same way (tb_eng_peer_send_begin). */
    bool tunnel;
    eng_msg_t *unsent_relay_head, *unsent_relay_tail;
    bool relay_unsent_lost;
    unsigned fwd_hold;
    /* Its flow's numbers (tb_wire_emsg_t.seq): the next to send, the next
     * expected; duplicates dropped.  What its failed channel handed back,
     * in order, goes again before anything else. */
    uint32_t tx_seq, rx_seq;
    uint64_t dups;
    eng_msg_t *resend_head, *resend_tail;
    unsigned nresend;
    bool lost_unsent; /* its channel could not hand back everything */
    /* Its cable's traffic come round it through a relay while this end's
     * channel still stood: believed only once that fails too (till then a
     * relay could pass anything off as it), held in order, at most
     * ENG_DETOUR_HOLD; link: the relay's peer index. */
    eng_msg_t *round_head, *round_tail;
    uint64_t round_cost;
    /* Its failed cable coming back (tb_engine_back.c): back_at, when this
     * end dials it again (0: the other end dials); back, a new channel over
     * it (conn) while the flow goes round; back_up, that channel set up,
     * back_id its try (the two ends' epochs xor'd); back_seq, the number of
     * the BACK sent round, once sent (back_sent: the flow waits for
     * BACK_OK); back_came, the far end's latest BACK (back_came_id, number
     * back_ok_seq), not yet matched with this try; back_rx, the far end's
     * BACK of this try came (its flow comes over the cable now), owed a
     * BACK_OK while back_ok_due. */
    uint64_t back_at;
    unsigned back_tries; /* since it went round: only the first failure is logged */
    bool back, back_up, back_sent, back_came, back_rx, back_ok_due;
    uint64_t back_id, back_came_id;
    uint32_t back_seq, back_ok_seq;
    uint64_t ret[ENG_MAX_RANKS]; /* credit owed for each local rank */
    /* Per local rank: bytes delivered from this peer and not yet credited
     * back.  The sender may not exceed the window: this end enforces it. */
    uint64_t delivered[ENG_MAX_RANKS];
    bool ret_pending;
};

typedef struct eng_dev {
    tb_engine_t *e;
    unsigned idx;
    tb_device_t *dev;
    tb_domain_t *dom;
    tb_cm_t *cm;
    uint16_t port;
} eng_dev_t;

struct tb_engine {
    tb_engine_params_t p;
    /* Its identity is an X25519 public key, whose private half never leaves
     * the engine: a peer engine is known by what only it can prove. */
    uint8_t id[TB_WIRE_ENGINE_ID_SIZE];
    uint8_t id_priv[TB_WIRE_ENGINE_ID_SIZE];
    /* Diffie-Hellmans left for callers no rank named (tb_eng_cm_peer_secret). */
    unsigned dh_tokens;
    uint64_t dh_refill_ns;
    uint8_t key[TB_WIRE_SECRET_SIZE];     /* the job's key on this host (attach) */
    uint8_t job_key[TB_WIRE_SECRET_SIZE]; /* the job's key between engines */
    bool have_key;
    tb_log_limit_t key_warn; /* warnings of a different job key */
    tb_log_limit_t pid_warn; /* messages for a rank whose pid is not the one expected */
    tb_device_list_t devlist;
    bool devlist_open;
    unsigned ndev;
    eng_dev_t devs[TB_WIRE_ENGINE_MAX_DEVICES];
    char nodev_why[200];
    uint32_t max_record;
    int dirfd; /* the job's directory, opened once (tb_jobdir.h) */
    int listen_fd;
    int pending_fd[ENG_MAX_PENDING]; /* -1: free */
    uint64_t pending_since[ENG_MAX_PENDING];
    eng_rank_t ranks[ENG_MAX_RANKS];
    unsigned rank_hwm; /* ranks[rank_hwm..] are free: the loop looks no further */
    unsigned nranks;
    bool ever_attached;
    bool finished; /* every rank left: the job is over on this host */
    unsigned faults; /* ranks and peer engines lost: the log is kept */
    bool events;   /* every device has completion events (armed before sleeping) */
    uint64_t last_traffic_ns; /* the last loop that moved a message: a rank's,
                               * or one from a peer engine (rx_msgs); the
                               * channels' keepalives and acks are not traffic */
    uint64_t rx_msgs;         /* messages the channels delivered to the engine */
    /* Payload bytes of messages between this host's ranks and peer engines,
     * each way, and the bytes copied to move them (the engine's copies, and
     * its channels' into their send slots or out of their receive slots;
     * the receive side's from channels gone, tb_eng_peer_drop_conn): the
     * copies per byte, logged at the end. */
    uint64_t tx_bytes, tx_copied, rx_bytes, rx_copied;
    /* The longest each part of the loop took, and the longest gap between
     * two polls of the devices: a stalled link's report says whether the
     * engine itself stalled (tb_eng_log_loop). */
    uint64_t max_ns[ENG_PHASES];
    /* Its sleeps, to tell a long sleep in silence from one that kept work
     * waiting: how many; how many ran to their end, and the most one
     * overran what it asked (the engine waited that long for a CPU); and
     * how many of those found messages waiting when they ended (a wake-up
     * that did not come, or a message that came just then), with the
     * longest such sleep. */
    uint64_t sleeps, sleeps_full, sleeps_late;
    uint64_t sleep_overrun_max_ns, sleep_late_max_ns;
    uint64_t last_detach_ns;
    eng_peer_t *peers[ENG_MAX_PEERS];
    unsigned npeers;
    /* The job's cabling, from the first table of hosts a rank gave
     * (TB_EREC_HOSTS), and where each device of each host is called. */
    tb_topo_t *topo;
    tb_wire_ehost_t *hosts;
    size_t nhost_entries;
    unsigned me; /* this engine's index in topo */
    tb_log_limit_t topo_warn;
    /* Relayed messages that came before the table, as (peer, message). */
    eng_msg_t *early_head, *early_tail;
    uint64_t early_bytes;
    uint64_t relayed_msgs, relayed_bytes; /* forwarded for other hosts */
    /* The pairs of hosts it forwarded for (relayed_pairs[src], bit dst): told
     * when the way between them through here is lost. */
    uint64_t relayed_pairs[TB_TOPO_MAX_HOSTS];
    /* The pairs (unreach_told[src], bit dst) told their way on is gone. */
    uint64_t unreach_told[TB_TOPO_MAX_HOSTS];
    /* Per neighbour host: the pairs of hosts that relay through it to here
     * and on (ENG_RELAY_HOLD). */
    uint32_t relay_pairs_from[TB_TOPO_MAX_HOSTS];
    /* And the flows of cables that may fail and go round through here, one
     * per cable and way, from the neighbour before this engine on the way
     * round, or from the neighbour itself when this engine is cabled to the
     * far end too (ENG_RELAY_HOLD); what such a cable carries for other
     * hosts goes round with it, and counts in relay_pairs_from. */
    uint32_t detour_pairs_from[TB_TOPO_MAX_HOSTS];
    /* Per neighbour host: every pair whose route reaches this engine from it,
     * ending here or going on (what a failed cable's way round may bring
     * before this end sees it fail: ENG_ROUND_HOLD). */
    uint32_t arrive_pairs_from[TB_TOPO_MAX_HOSTS];
    /* The way round each cable of the job (tb_topo_detour), by host and
     * device, made with the table; the failed cables' flows this engine
     * passed on (detour_seen[src][device], as relay headers name them),
     * and those whose source was told the way is cut. */
    eng_detour_t *detours;
    uint8_t detour_seen[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_DEVS];
    uint8_t detour_told[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_DEVS];
    /* Per pair of hosts (src, dst) whose route reaches this engine, passing
     * through or ending here: the neighbour it comes from, plus one (0 for
     * the other pairs), and this engine's device its cable ends on.  Every
     * relayed message is checked against it. */
    uint8_t arrive_from[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_HOSTS];
    uint8_t arrive_dev[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_HOSTS];
};

/* The next number of p's flow into the header h of a message (not yet
 * counted: tb_eng_seq_sent once the channel took it). */
static inline void tb_eng_seq_put(const eng_peer_t *p, void *h)
{
    uint32_t seq = tb_wire_le32(p->tx_seq);

    memcpy((uint8_t *) h + offsetof(tb_wire_emsg_t, seq), &seq, sizeof(seq));
}

static inline void tb_eng_seq_sent(eng_peer_t *p)
{
    p->tx_seq++;
}

/* p's messages go through another host (routed, or detoured through one):
 * they share a part of the credit window, which bounds what relays hold. */
static inline bool tb_eng_peer_relayed(const eng_peer_t *p)
{
    return NULL != p->via && 0 != memcmp(p->via->id, p->id, sizeof(p->id));
}

/* Credit toward destination d behind p: a DATA message of plen payload bytes
 * taken, and c bytes given back; the peer's total moves with it (a routed
 * peer's destinations share a window, tb_eng_credit_ok). */
static inline void tb_eng_credit_take(eng_peer_t *p, eng_dst_t *d, size_t plen)
{
    d->used += (uint32_t) tb_ecredit_cost(plen);
    p->used_total += tb_ecredit_cost(plen);
}

static inline void tb_eng_credit_give(eng_peer_t *p, eng_dst_t *d, uint32_t c)
{
    c = c < d->used ? c : d->used;
    d->used -= c;
    d->moved_ns = tb_now_ns();
    p->used_total -= c < p->used_total ? c : p->used_total;
    p->credit_changed = true;
}

/* What waits for d has waited ENG_UNPIN_AFTER_NS with no credit back. */
static inline bool tb_eng_dst_starved(const eng_dst_t *d, uint64_t now)
{
    return d->nwait && now - d->moved_ns >= ENG_UNPIN_AFTER_NS;
}

/* A DATA message of plen payload bytes from p fits rank r's credit window at
 * this end.  As the sender counts (credit_ok): one message may exceed the
 * window only when nothing else is outstanding. */
static inline bool tb_eng_window_ok(const eng_peer_t *p, const eng_rank_t *r, size_t plen)
{
    return 0 == p->delivered[r->slot]
           || p->delivered[r->slot] + tb_ecredit_cost(plen) <= p->e->p.credit_window;
}

/* The link a RECV record of a message h from p names (TB_ELINK_HOST when it
 * went between the ranks' host-wide modules). */
static inline uint16_t tb_eng_recv_link(const eng_peer_t *p, const tb_wire_emsg_t *h)
{
    return (uint16_t) (p->idx | (h->flags & TB_EMSG_F_HOST ? TB_ELINK_HOST : 0));
}

/* An attached rank with nothing for the engine this pass: no record in its
 * ring, nothing queued toward it or waiting for its reading, its socket
 * open.  Most of a busy host's ranks are idle in a given pass, and this
 * costs a load of the ring's next stamp and no call. */
static inline bool tb_eng_rank_idle(const eng_rank_t *r)
{
    return !r->blocked && !tb_shm_ring_ready(&r->tx) && NULL == r->ovf_head && 0 == r->rxq_len
           && 0 == r->npinned && r->fd >= 0;
}

/* tb_engine_rank.c: a rank's rings. */
int tb_eng_rank_tx_progress(eng_rank_t *r);
int tb_eng_rank_flush_overflow(eng_rank_t *r);
int tb_eng_rank_credit_progress(eng_rank_t *r);
eng_rank_t *tb_eng_find_rank(tb_engine_t *e, uint32_t vpid);
/* r is the process pid (as its socket's credentials said at attach): the
 * one the job published for r's vpid, so the one messages for it are for. */
bool tb_eng_rank_is(const eng_rank_t *r, uint32_t pid);
void tb_eng_rank_post(eng_rank_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                      uint32_t pid, const void *a, size_t alen, const void *b, size_t blen);
void tb_eng_rank_announce(eng_rank_t *r, eng_peer_t *p);
void tb_eng_rank_fail(eng_rank_t *r, const char *why);
eng_txrec_t *tb_eng_txq_push(eng_rank_t *r, uint64_t end);
void tb_eng_txq_pop_last(eng_rank_t *r);
eng_msg_t *tb_eng_msg_new(uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid, const void *a,
                          size_t alen, const void *b, size_t blen);
/* Append m to the list head..tail (a rank's overflow, a peer's waiting or
 * notice list). */
static inline void tb_eng_msg_append(eng_msg_t **head, eng_msg_t **tail, eng_msg_t *m)
{
    if (*tail) {
        (*tail)->next = m;
    } else {
        *head = m;
    }
    *tail = m;
}

/* The first of the list head..tail, taken off it (NULL: empty). */
static inline eng_msg_t *tb_eng_msg_pop(eng_msg_t **head, eng_msg_t **tail)
{
    eng_msg_t *m = *head;

    if (m) {
        *head = m->next;
        if (NULL == *head) {
            *tail = NULL;
        }
        m->next = NULL; /* appended elsewhere, it must not drag its old list along */
    }
    return m;
}

/* m back at the front of the list head..tail (a send that did not go). */
static inline void tb_eng_msg_push_front(eng_msg_t **head, eng_msg_t **tail, eng_msg_t *m)
{
    m->next = *head;
    *head = m;
    if (NULL == *tail) {
        *tail = m;
    }
}

/* Every message of the list head..tail freed. */
static inline void tb_eng_msg_free_all(eng_msg_t **head, eng_msg_t **tail)
{
    eng_msg_t *m;

    while ((m = tb_eng_msg_pop(head, tail))) {
        free(m);
    }
}
void tb_eng_tx_consumed(eng_rank_t *r, uint64_t end);
/* A RECV of len payload bytes from peer link ends at the ring's head now:
 * its credit goes back once the rank has read it. */
void tb_eng_rank_received(eng_rank_t *r, uint16_t link, size_t len);
void tb_eng_tx_done(eng_txrec_t *t);

/* tb_engine_attach.c: ranks attaching, leaving, dying. */
void tb_eng_accept(tb_engine_t *e, uint64_t now);
void tb_eng_expire_pending(tb_engine_t *e, uint64_t now);
void tb_eng_attach_rank(tb_engine_t *e, int fd);
void tb_eng_rank_free(eng_rank_t *r);

/* tb_engine_dial.c: devices, and setting up channels to other engines. */
int tb_eng_devices_open(tb_engine_t *e, char *why, size_t whylen);
/* The connection managers first (their callbacks reach peers), then the
 * peers, then the devices. */
void tb_eng_cms_close(tb_engine_t *e);
void tb_eng_devices_close(tb_engine_t *e);
int tb_eng_devices_progress(tb_engine_t *e, uint64_t now);
void tb_eng_peer_dial(eng_peer_t *p);
/* The connection manager's call to p's engine over its cable, for p's
 * channel (p->conn, made): a TB_CM_* code (its outcome comes to cm_done). */
int tb_eng_peer_call(eng_peer_t *p, uint64_t now);
void tb_eng_peers_dial_waiting(tb_engine_t *e);
/* Whether a Diffie-Hellman for a caller no rank named may run now (one is
 * then counted). */
bool tb_eng_dh_allowed(tb_engine_t *e, uint64_t now);
/* The connection manager's peer_secret for device ctx (an eng_dev_t). */
int tb_eng_cm_peer_secret(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret);

/* tb_engine_credit.c: credit toward the ranks behind a peer, and what waits
 * for it. */
/* The destination vpid behind p (made, for the rank in slot adder, if there is
 * room; adder -1: only if it is there). */
eng_dst_t *tb_eng_dst_of(eng_peer_t *p, uint32_t vpid, int adder);
/* A message of len payload bytes may go to d now (and, to a routed peer,
 * within its total window). */
bool tb_eng_credit_ok(const eng_peer_t *p, const eng_dst_t *d, size_t len);
/* r's message (header h, payload) waits for credit or the channel; 1 when it
 * stays in r's ring (its record is then consumed by a txq entry), 0 when the
 * caller must mark the record ending at end consumed. */
int tb_eng_hold(eng_peer_t *p, eng_dst_t *d, eng_rank_t *r, const tb_wire_emsg_t *h,
                const void *payload, size_t len, uint64_t end);
/* Drop what waits for p: all of it (dst NULL), or what is for process pid as
 * rank *dst. */
void tb_eng_drop_waiting(eng_peer_t *p, const uint32_t *dst, uint32_t pid);
/* Send what waits for p as far as credit and the channel allow: how many. */
int tb_eng_send_waiting(eng_peer_t *p);

/* tb_engine_route.c: the job's cabling, routed peers, relaying. */
/* A rank's table of hosts (TB_EREC_HOSTS): 0 taken or ignored (logged), -1
 * malformed. */
int tb_eng_topo_set(tb_engine_t *e, const void *payload, size_t len);
/* The routed peer for engine id (made if the table routes to it; NULL with
 * *why when it does not). */
eng_peer_t *tb_eng_routed_peer(tb_engine_t *e, const uint8_t *id, const char **why);
/* Sends to p: on a routed peer, over its neighbour's channel ch behind the
 * relay header.  As tb_channel_send_begin and tb_channel_sendv. */
void *tb_eng_peer_send_begin(eng_peer_t *p, tb_channel_t *ch, uint8_t tag, size_t len);
int tb_eng_peer_sendv(eng_peer_t *p, tb_channel_t *ch, uint8_t tag, const struct iovec *iov,
                      int iovcnt, void *cookie);
/* p's cable failed (status, why): its traffic goes round it, over another
 * cable to the same host or along its way round through other hosts, and
 * what the channel handed back goes again first.  False when there is no way round
 * (or p may not take one): p must fail. */
bool tb_eng_peer_detour(eng_peer_t *p, int status, const char *why);
/* What came round p's cable through relays while its channel stood: taken
 * (p went round it too), or dropped (p failed). */
void tb_eng_round_take(eng_peer_t *p);
void tb_eng_round_drop(eng_peer_t *p);
/* A RELAY message from neighbour p. */
void tb_eng_relay_recv(eng_peer_t *p, const void *data, size_t len);
/* Neighbour q failed: what waited to go through it is dropped, and the ends
 * of what went through it are told (TB_ETAG_UNREACH). */
void tb_eng_relay_lost(eng_peer_t *q, const char *why);
/* The ways round the job's cables, made when the table comes, and the
 * bounds they add to relaying (tb_engine_detour.c); freed with the table. */
int tb_eng_detours_index(tb_engine_t *e);
/* The host after at on the way round host h's cable on its device k,
 * going toward host to (one of the cable's ends); -1 when at is not on it
 * or is to. */
int tb_eng_detour_next(const tb_engine_t *e, unsigned h, unsigned k, unsigned at, unsigned to);
/* How a failed cable's message (relay header rh, naming it) from neighbour
 * host nh comes: along the cable's way round, from the host before this one
 * (ENG_ROUND_WAY); two hops through a host cabled to both ends, the way an
 * end takes when the first hop of that way is down too (ENG_ROUND_SHORT:
 * from the source, to a relay cabled to the far end, or to the far end from
 * a host cabled to the source); or neither (0: a relay that sends it is cut). */
enum { ENG_ROUND_WAY = 1, ENG_ROUND_SHORT = 2 };
int tb_eng_detour_ok(const tb_engine_t *e, const tb_wire_erelay_t *rh, int nh);
/* Another cable than host h's on device k joins its two hosts. */
bool tb_eng_detour_other_cable(const tb_engine_t *e, unsigned h, unsigned k);
/* The way round host s's cable on device k is cut here: its source s is
 * told, once, along the way back (a notice in the flow of the cable's other
 * end: TB_ETAG_UNREACH behind the relay header naming it). */
void tb_eng_detour_cut(tb_engine_t *e, unsigned s, unsigned k, const char *why);
/* The cable to neighbour host qh is lost (no other to it stands): the ends of
 * every failed cable's flow that went round through here over it are told,
 * those on this side. */
void tb_eng_detour_lost(tb_engine_t *e, unsigned qh, const char *why);
/* A notice that a way is cut (TB_ETAG_UNREACH), relayed from this engine to
 * host to as from host src (itself, or a failed cable's other end: flow,
 * that end's device + 1, or 0), naming host named and why. */
void tb_eng_notice_send(tb_engine_t *e, unsigned src, unsigned to, unsigned flow, unsigned named,
                        const char *why);
/* Send a relayed message on (tb_engine_route.c): header rh, then blen bytes
 * of body, copied; from, the neighbour it came from (NULL: this engine's). */
void tb_eng_relay_out(tb_engine_t *e, unsigned dst, const tb_wire_erelay_t *rh,
                      const void *body, size_t blen, eng_peer_t *from);
/* q's failed channel handed back a RELAY message (iov NULL: one it could
 * not), kept in q->unsent_relay; _drop forgets what was not moved. */
void tb_eng_relay_unsent(eng_peer_t *q, const struct iovec *iov, int iovcnt, size_t len);
void tb_eng_relay_unsent_drop(eng_peer_t *q);
/* The neighbour engine of host h over this engine's device dev, made and
 * dialled if need be. */
eng_peer_t *tb_eng_neighbour(tb_engine_t *e, unsigned h, unsigned dev);
/* The cable what goes over neighbour w goes over: w, or the one w's traffic
 * moved to (relay_to, never more than one step: a cable's traffic moves to
 * one whose own has not moved), unless that is p, a cable failing now. */
eng_peer_t *tb_eng_relay_end(eng_peer_t *w, const eng_peer_t *p);
/* What went over cable from (its own, and what moved to it) goes over to
 * from now on; to's own, if it had moved to from, comes back to it. */
void tb_eng_relay_redirect(eng_peer_t *from, eng_peer_t *to);
/* Send neighbour q's forward queue as far as its channel takes it. */
int tb_eng_fwd_drain(eng_peer_t *q);
/* A forwarded message's send completed (its cookie). */
void tb_eng_relay_done(tb_engine_t *e, eng_msg_t *m);
/* Routed peers follow their neighbour's state; forward queues drain. */
int tb_eng_routes_progress(tb_engine_t *e);
/* Everything relaying holds, freed (the engine ends). */
void tb_eng_routes_destroy(tb_engine_t *e);

/* tb_engine_back.c: a failed cable that works again carries its flow again. */
/* p's traffic went round its cable (again): this end dials it from time to
 * time if its engine id is the lower. */
void tb_eng_back_arm(eng_peer_t *p, uint64_t now);
/* Dialing, BACK and BACK_OK, as they fall due: how many happened. */
int tb_eng_back_progress(eng_peer_t *p, uint64_t now);
/* The connection manager's accept for p, which goes round its cable: a new
 * channel over it made (true), or the call refused. */
bool tb_eng_back_accept(eng_peer_t *p);
/* Whether the connection manager's outcome for p is its new channel's (then
 * taken: set up, or dropped till the next try). */
bool tb_eng_back_setup_done(eng_peer_t *p, int status, const tb_wire_addr_t *peer,
                            const char *why);
/* p's channel failed (status): true when it was a new one its flow had not
 * moved onto and the far engine did not close it (dropped; the flow goes on
 * round), false for the usual failure. */
bool tb_eng_back_failed(eng_peer_t *p, int status, const char *why);
/* The far end's BACK numbered seq for try id came (in its flow), or its
 * BACK_OK over the new channel. */
void tb_eng_back_came(eng_peer_t *p, uint64_t id, uint32_t seq);
void tb_eng_back_ok(eng_peer_t *p, uint64_t id, uint32_t seq);
/* The try of a BACK or BACK_OK header h. */
uint64_t tb_eng_back_id_of(const tb_wire_emsg_t *h);

/* tb_engine_peer.c: other engines. */
/* A control message tag (CREDIT, GONE, BACK) to p, numbered in its flow:
 * true once queued; with keep, one that cannot go now waits in order (see
 * the function). */
bool tb_eng_send_ctrl(eng_peer_t *p, uint8_t tag, uint32_t src, uint32_t src_pid, uint32_t dst,
                      uint32_t credit, const char *text, bool keep);
/* p's channel once set up, or NULL. */
tb_channel_t *tb_eng_peer_channel(eng_peer_t *p);
/* The peer engine id over device dev; made (when add is set and the table
 * has room) if there is none yet. */
eng_peer_t *tb_eng_peer_for(tb_engine_t *e, unsigned dev, const uint8_t *id, bool add);
void tb_eng_peer_learn(eng_peer_t *p, const tb_wire_eroute_t *rt);
/* p's channel, made and ready for the connection manager's exchange (0), or
 * p failed (-1). */
int tb_eng_peer_make_conn(eng_peer_t *p);
/* The same, p's state left as it is: 0, or -errno with p as it was. */
int tb_eng_peer_new_conn(eng_peer_t *p);
/* Destroy p's channel (outside its callbacks), counting what it copied. */
void tb_eng_peer_drop_conn(eng_peer_t *p);
/* The channel to p is gone: every rank is told, what waited dropped. */
void tb_eng_peer_fail(eng_peer_t *p, int status, const char *why);
/* A message from the peer engine (its channel's receive callback; tests and
 * the fuzz target call it straight). */
void tb_eng_peer_recv(eng_peer_t *p, uint8_t tag, const void *data, size_t len);
/* tb_engine_place.c: a message of more than one frame written by the channel
 * straight into the destination's ring (its recv_place and recv_placed;
 * tests call them straight).  place: where its bytes from *skip on go, or
 * NULL for the ordinary path (tb_eng_peer_recv). */
void *tb_eng_peer_recv_place(eng_peer_t *p, uint8_t tag, size_t len, const void *head,
                             size_t head_len, size_t *skip);
void tb_eng_peer_recv_placed(eng_peer_t *p, uint8_t tag, const void *head, size_t skip,
                             size_t len);
/* p's channel goes: what it was writing into rings is forgotten.  Call before
 * destroying the channel, never while it may still write. */
void tb_eng_place_release(eng_peer_t *p);
/* The loop's longest phases, to the log (after a fault). */
void tb_eng_log_loop(const tb_engine_t *e);
/* The sleeps' counts, at a tb_log level. */
void tb_eng_log_sleeps(const tb_engine_t *e, tb_log_level_t level);
/* Each connected channel's state, to the log (after a fault). */
void tb_eng_peers_log_state(tb_engine_t *e);
/* A rank's SEND: 1 consumed (sent, held, or dropped), 0 retry later, -1 bad. */
int tb_eng_send(eng_rank_t *r, const tb_wire_erec_t *h, const void *payload, uint64_t start,
                uint64_t end);
/* To a rank of this host, arriving on link (TB_ELINK_LOCAL + dev, and
 * TB_ELINK_HOST for a host-wide route). */
int tb_eng_send_local(eng_rank_t *r, const tb_wire_erec_t *h, const void *payload, uint64_t end,
                      uint16_t link);
int tb_eng_peers_progress(tb_engine_t *e, uint64_t now);
void tb_eng_peers_forget_rank(tb_engine_t *e, eng_rank_t *r);
/* r's messages waiting for credit in its ring are copied out, so its ring and
 * txq move on: all of them (the rank goes), or those for destinations starved
 * (it pins more than its share). */
void tb_eng_peers_unpin(tb_engine_t *e, eng_rank_t *r);
void tb_eng_peers_unpin_starved(tb_engine_t *e, eng_rank_t *r);
void tb_eng_peers_rank_gone(tb_engine_t *e, uint32_t vpid, uint32_t pid, const char *why);
size_t tb_eng_peers_unacked(tb_engine_t *e);
unsigned tb_eng_peers_open(tb_engine_t *e);
void tb_eng_peers_close(tb_engine_t *e);
void tb_eng_peers_destroy(tb_engine_t *e);

#endif /* TB_ENGINE_INT_H */
