/*
 * tbrdma common layer: the connection manager's internals, shared by
 * tb_cm.c (sessions, socket I/O, progress, life cycle), tb_cm_responder.c
 * (answering a peer's request) and tb_cm_requester.c (asking a peer).
 */
#ifndef TB_CM_INT_H
#define TB_CM_INT_H

#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "tb_cm.h"
#include "tb_log.h"
#include "tb_wire.h"

#define MAX_POLL 256
#define RECENT 16
/* With no exchange under way only the listening socket is polled, and only
 * this often: poll() is a system call, and the data path calls progress
 * between every two messages (a quarter of a ping-pong's CPU time under
 * emulation went to it).  A peer's request then waits up to 1 ms. */
#define IDLE_POLL_NS 1000000ull
/* A responder under a flood of unproven callers may close ours to make room
 * (or time it out): dial again after this, doubling, until the deadline. */
#define RETRY_FIRST_NS 10000000ull
#define RETRY_MAX 6

typedef enum {
    S_CONNECTING, /* outgoing: TCP connect in progress */
    S_SENDING,    /* writing out */
    S_RECEIVING,  /* reading in */
    S_WAIT_PEER,  /* outgoing, lost a collision: the peer's request will finish it */
    S_RETRY,      /* outgoing: the responder closed before answering; dial again */
    S_FINISHED,   /* to be freed */
} sess_state_t;

/* Which message a session exchanges next. */
typedef enum {
    P_HELLO,   /* outgoing: send HELLO, read CHALLENGE; incoming: read HELLO */
    P_REQUEST, /* outgoing: send REQUEST, read REPLY; incoming: read REQUEST */
    P_REPLY,   /* incoming: send REPLY, then done */
} sess_phase_t;

typedef union cm_buf {
    tb_wire_cm_hdr_t hdr;
    tb_wire_cm_nonce_msg_t nonce;
    tb_wire_cm_request_t req;
    tb_wire_cm_reply_t rep;
} cm_buf_t;

typedef struct cm_sess {
    struct cm_sess *next;
    int fd;
    int outgoing;
    sess_state_t state;
    sess_phase_t phase;
    int proven;     /* incoming: the request carried a valid mac */
    int has_user;   /* done(user) is owed */
    void *user;
    int close_after_send; /* incoming refusal or collision: no callback after the write */
    int conn_err;         /* outgoing: connect() failed at once with this errno */
    uint64_t deadline;
    uint64_t retry_at;    /* S_RETRY: when to dial again */
    uint64_t retry_ivl;
    unsigned retries;
    struct sockaddr_in dest; /* outgoing: the responder */
    uint32_t src_ip; /* incoming: the caller's address (network byte order) */
    uint8_t peer_id[TB_CM_ID_MAX];
    size_t peer_id_len;
    uint8_t key[TB_CM_KEY_SIZE];
    uint8_t nonce_r[TB_WIRE_CM_NONCE];
    uint8_t nonce_s[TB_WIRE_CM_NONCE];
    uint8_t req_mac[TB_WIRE_CM_MAC];
    tb_wire_addr_t local; /* outgoing: our blob (also answers a lost collision) */
    tb_wire_addr_t peer;  /* the other side's blob, reported in done */
    cm_buf_t out;
    size_t out_len, out_off;
    cm_buf_t in;
    size_t in_len, in_off;
    char where[32]; /* ip:port of the other end, for messages */
} cm_sess_t;

/* A request of ours the peer answered.  After a collision the loser's own
 * request may still reach the winner once the exchange is complete; its
 * blob (same identity, same epoch) marks it as that leftover. */
typedef struct cm_recent {
    uint8_t id[TB_CM_ID_MAX];
    size_t id_len;
    uint64_t epoch;
} cm_recent_t;

struct tb_cm {
    tb_cm_params_t p; /* bind_ip and bind_netdev not kept: netdev, src */
    char netdev[IF_NAMESIZE]; /* "" if the sockets are bound to no interface */
    struct in_addr src;       /* with netdev: the source of dialled connections */
    uint8_t id[TB_CM_ID_MAX];
    uint8_t secret[TB_WIRE_SECRET_SIZE];
    tb_cm_callbacks_t cb;
    int lfd;
    uint16_t port;
    cm_sess_t *sessions;
    unsigned nsessions;
    int ncallbacks;
    uint64_t now;
    uint64_t last_poll_ns;
    tb_log_limit_t warn_limit; /* refusals, which callers cause at will */
    cm_recent_t recent[RECENT];
    unsigned recent_next;
    tb_cm_counters_t cnt;
};

/* tb_cm.c: keys, messages, sessions. */
int cm_id_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);
/* The key of an exchange with peer_id, from what peer_secret gave for it. */
void cm_session_key(const tb_cm_t *cm, const void *peer_id, size_t id_len,
                    const uint8_t *peer_secret, uint8_t key[TB_CM_KEY_SIZE]);
void cm_mac_compute(const cm_sess_t *s, const char *label, const void *extra, size_t extra_len,
                    const void *msg, size_t len, uint8_t *mac);
int cm_set_nonblocking(int fd);
/* A non-blocking socket for dialling, bound to the interface and source;
 * -1 with errno set. */
int cm_socket_out(const tb_cm_t *cm);
int cm_blob_valid(const tb_wire_addr_t *a);
void cm_hdr_fill(tb_wire_cm_hdr_t *h, uint8_t type);
int cm_hdr_valid(const tb_wire_cm_hdr_t *h, uint8_t type);
int cm_all_zero(const uint8_t *p, size_t n);
cm_sess_t *cm_sess_new(tb_cm_t *cm, int fd, int outgoing, uint64_t deadline);
void cm_sess_close(cm_sess_t *s);
/* End the exchange, telling the owner if one is waiting. */
__attribute__((format(printf, 4, 5))) void cm_sess_finish(tb_cm_t *cm, cm_sess_t *s, int status,
                                                          const char *fmt, ...);
void cm_refuse_unproven(tb_cm_t *cm, cm_sess_t *s, const char *why);
void cm_send_msg(cm_sess_t *s, size_t len);
void cm_expect_msg(cm_sess_t *s, size_t len);

/* tb_cm_responder.c */
void cm_on_hello(tb_cm_t *cm, cm_sess_t *s);
void cm_on_request(tb_cm_t *cm, cm_sess_t *s);
void cm_accept_new(tb_cm_t *cm);

/* tb_cm_requester.c */
void cm_on_challenge(tb_cm_t *cm, cm_sess_t *s);
void cm_on_reply(tb_cm_t *cm, cm_sess_t *s);
int cm_retry_later(tb_cm_t *cm, cm_sess_t *s);
void cm_redial(tb_cm_t *cm, cm_sess_t *s);

#endif /* TB_CM_INT_H */
