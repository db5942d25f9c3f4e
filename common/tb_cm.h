/*
 * tbrdma common layer: connection setup over a TCP side channel.
 *
 * Two processes exchange their connection address blobs (tb_wire_addr_t)
 * before their QPs can talk.  Each process runs one tb_cm: it listens on a
 * TCP port (the BTL publishes IPv4 and port in the modex) and, to reach a
 * peer, connects to the peer's port and runs the exchange of tb_wire.h:
 *
 *   requester -> responder   HELLO:     a fresh nonce
 *   responder -> requester   CHALLENGE: a fresh nonce
 *   requester -> responder   REQUEST:   both identities, its blob, mac
 *   responder -> requester   REPLY:     status, its blob, mac
 *
 * Authentication: every process has a secret (published through the modex,
 * which reaches only the job's processes); a pair's key is derived from both
 * secrets (tb_cm_pair_key), and the macs cover both nonces, so only a
 * process of the job can make a request or a reply the other side accepts,
 * and a recorded exchange cannot be replayed.  In pairwise mode (the host
 * engines) the pair's key comes instead from a secret only the two share,
 * so only the process that holds an identity's private key can prove it.
 * Until a request is proven,
 * the responder reveals nothing but a nonce; a refused caller is logged and
 * its socket closed.  An unproven exchange must finish within a short
 * handshake deadline, each source address may hold only a few of them, and
 * when the table is full the oldest unproven one makes way for a new caller,
 * so idle or slow callers cannot starve the job's own peers.
 *
 * The responder's owner is asked to create its side of the connection
 * (accept callback) and supplies the blob for the reply; both owners then
 * learn the peer's blob through the done callback and call tb_conn_connect().
 *
 * Simultaneous connect: when A and B request each other at once, the side
 * with the smaller identity (shorter first, then bytewise) keeps its own
 * request and refuses the other with COLLISION; the larger side answers the
 * winner's request with the blob of its own pending request and completes
 * that request with the winner's blob.  Each side's owner sees exactly one
 * done callback for its request and no accept callback.
 *
 * Everything is non-blocking: sockets are polled by tb_cm_progress(), every
 * exchange has a deadline, malformed messages are refused and never reach
 * the owner.  Not thread safe.  Callbacks run inside tb_cm_progress() (and
 * tb_cm_destroy()); they may call tb_cm_connect(), not tb_cm_destroy().
 */
#ifndef TB_CM_H
#define TB_CM_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tb_wire.h"

#define TB_CM_ID_MAX TB_WIRE_CM_ID_MAX
#define TB_CM_KEY_SIZE 32

enum {
    TB_CM_OK = 0,
    TB_CM_EINVAL = -1,     /* bad argument */
    TB_CM_EUNREACH = -2,   /* TCP connection to the peer failed */
    TB_CM_EREFUSED = -3,   /* the peer's owner refused the connection */
    TB_CM_ETIMEDOUT = -4,  /* no complete answer before the deadline */
    TB_CM_EPROTO = -5,     /* malformed or incompatible message */
    TB_CM_ECLOSED = -6,    /* the peer closed the socket mid-exchange */
    TB_CM_ECANCELED = -7,  /* canceled locally */
    TB_CM_EWRONGPEER = -8, /* the process at that address did not prove the identity asked for */
    TB_CM_ESYS = -9,       /* a socket call failed (errno in the message) */
};

const char *tb_cm_strerror(int status);

typedef struct tb_cm tb_cm_t;

/* peer_secret's answer when it cannot afford the secret now. */
#define TB_CM_SECRET_BUSY (-2)

typedef struct tb_cm_callbacks {
    void *ctx;
    /* The secret (TB_WIRE_SECRET_SIZE bytes) of the process peer_id, from
     * what the job published (or with params.pairwise the pair's): 0;
     * TB_CM_SECRET_BUSY when it cannot be worked out now (the caller is
     * refused and may try again); other non-zero when peer_id is not a
     * process of the job.  Either way its requests are refused unheard.
     * Must not create anything per identity asked for: callers choose the
     * identities. */
    int (*peer_secret)(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret);
    /* A peer asks for a connection.  Create the local side, write its blob
     * to *local and an owner pointer to *user (given back in done), return
     * 0; or return non-zero to refuse. */
    int (*accept)(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                  tb_wire_addr_t *local, void **user);
    /* The exchange for user ended: TB_CM_OK with the peer's blob (then call
     * tb_conn_connect), or an error and a sentence for the user (peer is
     * NULL).  Called exactly once per tb_cm_connect() and per accepted
     * request, unless canceled with tb_cm_cancel(). */
    void (*done)(void *ctx, void *user, int status, const tb_wire_addr_t *peer, const char *why);
} tb_cm_callbacks_t;

typedef struct tb_cm_params {
    const char *bind_ip;   /* dotted IPv4 to listen on; NULL or "" for any */
    /* The interface (a cable's) every socket is bound to, listening and
     * dialling (tb_cable_probe.h), with bind_ip as the source of dialled
     * connections; NULL or "" for none. */
    const char *bind_netdev;
    uint16_t port;         /* 0: ephemeral */
    const void *id;        /* this process's identity, 1..TB_CM_ID_MAX opaque bytes */
    size_t id_len;
    const uint8_t *secret;  /* this process's secret, TB_WIRE_SECRET_SIZE bytes */
    uint64_t timeout_ns;    /* deadline of one exchange */
    uint64_t handshake_ns;  /* deadline for a caller to prove itself (0: TB_CM_HANDSHAKE_NS) */
    unsigned max_sessions;  /* sockets open at once */
    unsigned max_per_source; /* unproven callers per source address (0: TB_CM_PER_SOURCE) */
    /* peer_secret gives the secret this process shares with the peer alone
     * (a Diffie-Hellman result, so knowing what the job published does not
     * let a third process pose as either), not the peer's own: secret is
     * then not used and may be NULL. */
    bool pairwise;
} tb_cm_params_t;

#define TB_CM_HANDSHAKE_NS 5000000000ull
#define TB_CM_PER_SOURCE 32

typedef struct tb_cm_counters {
    uint64_t requests_accepted;  /* proven requests handed to the owner or a collision */
    uint64_t refused_unauth;     /* callers that did not prove themselves */
    uint64_t refused_limit;      /* callers closed by the per-source or session limit */
    uint64_t evicted;            /* unproven callers closed to make room */
} tb_cm_counters_t;

/* The key two processes share: derived from both identities and secrets in
 * an order both sides agree on, so either end computes the same one. */
void tb_cm_pair_key(const void *id_a, size_t len_a, const uint8_t *secret_a, const void *id_b,
                    size_t len_b, const uint8_t *secret_b, uint8_t key[TB_CM_KEY_SIZE]);

/* Listen.  0 or a TB_CM_* error (logged with what to do). */
int tb_cm_create(const tb_cm_params_t *params, const tb_cm_callbacks_t *cb, tb_cm_t **out);

/* Complete every pending exchange with TB_CM_ECANCELED, close all sockets. */
void tb_cm_destroy(tb_cm_t *cm);

/* The port listened on (host byte order). */
uint16_t tb_cm_port(const tb_cm_t *cm);

/* Request a connection to the process peer_id listening at ip:port, sending
 * local.  The outcome comes through done(user).  0, or an error at once
 * (no callback then; TB_CM_EINVAL also when peer_secret does not know
 * peer_id). */
int tb_cm_connect(tb_cm_t *cm, const char *ip, uint16_t port, const void *peer_id,
                  size_t id_len, const tb_wire_addr_t *local, void *user, uint64_t now_ns);

/* Forget every exchange of user without calling done (the owner is going
 * away). */
void tb_cm_cancel(tb_cm_t *cm, void *user);

/* Accept, read, write, time out; never blocks.  Returns the number of
 * callbacks made. */
int tb_cm_progress(tb_cm_t *cm, uint64_t now_ns);

/* For an owner about to sleep: the sockets whose events ask for
 * tb_cm_progress (the listening one, then each exchange's), at most max of
 * them in out; returns how many.  *wake_ns is lowered to the earliest time
 * an exchange must be dialled again or timed out. */
unsigned tb_cm_poll_fds(const tb_cm_t *cm, struct pollfd *out, unsigned max, uint64_t *wake_ns);

const tb_cm_counters_t *tb_cm_counters(const tb_cm_t *cm);

#endif /* TB_CM_H */
