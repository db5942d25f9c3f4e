/*
 * tbrdma common layer: connection setup over a TCP side channel (see
 * tb_cm.h; the messages are in tb_wire.h).
 *
 * Sessions are socket exchanges.  They are only marked finished while
 * events are handled and freed at the end of tb_cm_progress(), so a callback
 * that starts or cancels exchanges never pulls a session from under the
 * loop.  Each session reads exactly the message its phase expects, whole,
 * before looking at it.
 */
#include "tb_cm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_random.h"
#include "tb_sha256.h"

#define MAX_POLL 256
#define RECENT 16
/* With no exchange under way only the listening socket is polled, and only
 * this often: poll() is a system call, and the data path calls progress
 * between every two messages (a quarter of a ping-pong's CPU time under
 * emulation went to it).  A peer's request then waits up to 1 ms. */
#define IDLE_POLL_NS 1000000ull
#define WARN_INTERVAL_NS 1000000000ull
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
    tb_cm_params_t p;
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
    uint64_t last_warn_ns;
    uint64_t warn_suppressed;
    cm_recent_t recent[RECENT];
    unsigned recent_next;
    tb_cm_counters_t cnt;
};

const char *tb_cm_strerror(int status)
{
    switch (status) {
    case TB_CM_OK: return "success";
    case TB_CM_EINVAL: return "invalid argument";
    case TB_CM_EUNREACH: return "peer unreachable";
    case TB_CM_EREFUSED: return "peer refused the connection";
    case TB_CM_ETIMEDOUT: return "timed out";
    case TB_CM_EPROTO: return "malformed or incompatible message";
    case TB_CM_ECLOSED: return "peer closed the connection";
    case TB_CM_ECANCELED: return "canceled";
    case TB_CM_EWRONGPEER: return "the process answering is not the peer asked for";
    case TB_CM_ESYS: return "socket error";
    default: return "unknown error";
    }
}

/* Smaller identity wins a collision: shorter first, then bytewise. */
static int id_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    if (alen != blen) {
        return alen < blen ? -1 : 1;
    }
    return memcmp(a, b, alen);
}

void tb_cm_pair_key(const void *id_a, size_t len_a, const uint8_t *secret_a, const void *id_b,
                    size_t len_b, const uint8_t *secret_b, uint8_t key[TB_CM_KEY_SIZE])
{
    static const char label[] = "tbrdma connection key v2";
    tb_sha256_t s;
    uint8_t la, lb;

    if (id_cmp(id_a, len_a, id_b, len_b) > 0) {
        const void *t = id_a;
        const uint8_t *ts = secret_a;
        size_t tl = len_a;
        id_a = id_b, len_a = len_b, secret_a = secret_b;
        id_b = t, len_b = tl, secret_b = ts;
    }
    la = (uint8_t) len_a;
    lb = (uint8_t) len_b;
    tb_sha256_init(&s);
    tb_sha256_update(&s, label, sizeof(label));
    tb_sha256_update(&s, &la, 1);
    tb_sha256_update(&s, id_a, len_a);
    tb_sha256_update(&s, secret_a, TB_WIRE_SECRET_SIZE);
    tb_sha256_update(&s, &lb, 1);
    tb_sha256_update(&s, id_b, len_b);
    tb_sha256_update(&s, secret_b, TB_WIRE_SECRET_SIZE);
    tb_sha256_final(&s, key);
}

/* mac = HMAC(key, label || nonce_r || nonce_s || extra || msg). */
static void mac_compute(const cm_sess_t *s, const char *label, const void *extra,
                        size_t extra_len, const void *msg, size_t len, uint8_t *mac)
{
    tb_hmac_t h;

    tb_hmac_init(&h, s->key, sizeof(s->key));
    tb_hmac_update(&h, label, strlen(label) + 1);
    tb_hmac_update(&h, s->nonce_r, sizeof(s->nonce_r));
    tb_hmac_update(&h, s->nonce_s, sizeof(s->nonce_s));
    tb_hmac_update(&h, extra, extra_len);
    tb_hmac_update(&h, msg, len);
    tb_hmac_final(&h, mac);
}

static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL, 0);
    int one = 1;

    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0
        || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        return -1;
    }
#ifdef SO_NOSIGPIPE
    /* macOS has no MSG_NOSIGNAL: a peer that vanished must not kill us. */
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}

static int blob_valid(const tb_wire_addr_t *a)
{
    return tb_wire_le32(a->magic) == TB_WIRE_ADDR_MAGIC
           && tb_crc32c(0, a, TB_WIRE_ADDR_SIZE - 4) == tb_wire_le32(a->crc);
}

static void hdr_fill(tb_wire_cm_hdr_t *h, uint8_t type)
{
    h->magic = tb_wire_le32(TB_WIRE_CM_MAGIC);
    h->version = TB_WIRE_CM_VERSION;
    h->type = type;
    h->reserved = 0;
}

static int hdr_valid(const tb_wire_cm_hdr_t *h, uint8_t type)
{
    return tb_wire_le32(h->magic) == TB_WIRE_CM_MAGIC && h->version == TB_WIRE_CM_VERSION
           && h->type == type && h->reserved == 0;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i]) {
            return 0;
        }
    }
    return 1;
}

/* Refusals come from the network at whatever rate a caller likes: one line
 * a second, with a count of the rest. */
__attribute__((format(printf, 2, 3))) static void warn_limited(tb_cm_t *cm, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    if (cm->last_warn_ns != 0 && cm->now - cm->last_warn_ns < WARN_INTERVAL_NS) {
        cm->warn_suppressed++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (cm->warn_suppressed) {
        TB_WARN("connection manager: %s (and %llu similar events not reported)", msg,
                (unsigned long long) cm->warn_suppressed);
    } else {
        TB_WARN("connection manager: %s", msg);
    }
    cm->last_warn_ns = cm->now ? cm->now : 1;
    cm->warn_suppressed = 0;
}

static cm_sess_t *sess_new(tb_cm_t *cm, int fd, int outgoing, uint64_t deadline)
{
    cm_sess_t *s = calloc(1, sizeof(*s));

    if (!s) {
        return NULL;
    }
    s->fd = fd;
    s->outgoing = outgoing;
    s->deadline = deadline;
    s->next = cm->sessions;
    cm->sessions = s;
    cm->nsessions++;
    return s;
}

static void sess_close(cm_sess_t *s)
{
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    s->state = S_FINISHED;
}

/* End the exchange, telling the owner if one is waiting. */
__attribute__((format(printf, 4, 5))) static void sess_finish(tb_cm_t *cm, cm_sess_t *s,
                                                              int status, const char *fmt, ...)
{
    char why[256] = "";
    void *user = s->user;
    int notify = s->has_user;

    sess_close(s);
    s->has_user = 0;
    if (!notify) {
        return;
    }
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
    }
    cm->ncallbacks++;
    cm->cb.done(cm->cb.ctx, user, status, status == TB_CM_OK ? &s->peer : NULL, why);
}

/* A caller that did not prove itself: logged, closed, told nothing. */
static void refuse_unproven(tb_cm_t *cm, cm_sess_t *s, const char *why)
{
    cm->cnt.refused_unauth++;
    warn_limited(cm, "refused an unauthenticated connection request from %s: %s", s->where, why);
    sess_close(s);
}

static void send_msg(cm_sess_t *s, size_t len)
{
    s->out_len = len;
    s->out_off = 0;
    s->state = S_SENDING;
}

static void expect_msg(cm_sess_t *s, size_t len)
{
    s->in_len = len;
    s->in_off = 0;
    s->state = S_RECEIVING;
}

/* ------------------------------------------------------------------ */
/* Socket I/O                                                          */

/* Write what the socket takes.  1 when all is out, 0 to wait, -1 on error. */
static int sess_write(cm_sess_t *s)
{
#ifdef MSG_NOSIGNAL
    const int flags = MSG_NOSIGNAL;
#else
    const int flags = 0;
#endif
    while (s->out_off < s->out_len) {
        ssize_t n = send(s->fd, (const uint8_t *) &s->out + s->out_off, s->out_len - s->out_off,
                         flags);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        s->out_off += (size_t) n;
    }
    return 1;
}

/* Read what has arrived of the expected message.  1 when it is all in, 0 to
 * wait, -1 on error or end of stream (errno 0 then). */
static int sess_read(cm_sess_t *s)
{
    while (s->in_off < s->in_len) {
        ssize_t n = recv(s->fd, (uint8_t *) &s->in + s->in_off, s->in_len - s->in_off, 0);
        if (n == 0) {
            errno = 0;
            return -1;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        s->in_off += (size_t) n;
    }
    return 1;
}

/* ------------------------------------------------------------------ */
/* Responder side                                                      */

static cm_sess_t *pending_request_to(tb_cm_t *cm, const uint8_t *id, size_t id_len)
{
    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (s->outgoing && s->state != S_FINISHED && s->has_user
            && id_cmp(s->peer_id, s->peer_id_len, id, id_len) == 0) {
            return s;
        }
    }
    return NULL;
}

static void on_hello(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_nonce_msg_t *m = &s->in.nonce;

    if (tb_wire_le32(m->hdr.magic) == TB_WIRE_CM_MAGIC && m->hdr.version != TB_WIRE_CM_VERSION) {
        refuse_unproven(cm, s, "it speaks another tbrdma version: run the same tbrdma "
                               "everywhere");
        return;
    }
    if (!hdr_valid(&m->hdr, TB_CM_MSG_HELLO)) {
        refuse_unproven(cm, s, "not a tbrdma connection request");
        return;
    }
    memcpy(s->nonce_r, m->nonce, sizeof(s->nonce_r));
    if (tb_random_bytes(s->nonce_s, sizeof(s->nonce_s)) != 0) {
        warn_limited(cm, "no random source for a connection challenge: %s", strerror(errno));
        sess_close(s);
        return;
    }
    memset(&s->out, 0, sizeof(s->out));
    hdr_fill(&s->out.nonce.hdr, TB_CM_MSG_CHALLENGE);
    memcpy(s->out.nonce.nonce, s->nonce_s, sizeof(s->nonce_s));
    s->phase = P_REQUEST;
    send_msg(s, sizeof(s->out.nonce));
}

static void reply(tb_cm_t *cm, cm_sess_t *s, uint8_t status, const tb_wire_addr_t *addr)
{
    tb_wire_cm_reply_t *r = &s->out.rep;

    memset(r, 0, sizeof(*r));
    hdr_fill(&r->hdr, TB_CM_MSG_REPLY);
    r->status = status;
    if (addr) {
        r->addr = *addr;
    }
    mac_compute(s, "TBCM reply", s->req_mac, sizeof(s->req_mac), r, offsetof(tb_wire_cm_reply_t,
                                                                             mac), r->mac);
    s->phase = P_REPLY;
    s->close_after_send = status != TB_CM_R_ACCEPT;
    send_msg(s, sizeof(*r));
}

/* Whether a request is well formed and proven; its key is left in s. */
static const char *request_check(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_request_t *m = &s->in.req;
    uint8_t peer_secret[TB_WIRE_SECRET_SIZE], mac[TB_WIRE_CM_MAC];
    int known;

    if (!hdr_valid(&m->hdr, TB_CM_MSG_REQUEST) || !all_zero(m->reserved, sizeof(m->reserved))
        || m->id_len == 0 || m->id_len > TB_CM_ID_MAX || m->peer_id_len == 0
        || m->peer_id_len > TB_CM_ID_MAX || !all_zero(m->id + m->id_len, TB_CM_ID_MAX - m->id_len)
        || !all_zero(m->peer_id + m->peer_id_len, TB_CM_ID_MAX - m->peer_id_len)
        || !blob_valid(&m->addr)) {
        return "malformed request";
    }
    if (id_cmp(m->peer_id, m->peer_id_len, cm->id, cm->p.id_len) != 0) {
        return "it asked for another process";
    }
    if (id_cmp(m->id, m->id_len, cm->id, cm->p.id_len) == 0) {
        return "it claimed this process's own identity";
    }
    known = cm->cb.peer_secret(cm->cb.ctx, m->id, m->id_len, peer_secret) == 0;
    if (!known) {
        return "it claimed an identity that is not a process of this job";
    }
    tb_cm_pair_key(cm->id, cm->p.id_len, cm->secret, m->id, m->id_len, peer_secret, s->key);
    memset(peer_secret, 0, sizeof(peer_secret));
    mac_compute(s, "TBCM request", NULL, 0, m, offsetof(tb_wire_cm_request_t, mac), mac);
    if (!tb_mem_equal_ct(mac, m->mac, sizeof(mac))) {
        return "it could not prove the identity it claimed";
    }
    return NULL;
}

static void on_request(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_request_t *m = &s->in.req;
    const char *bad = request_check(cm, s);
    cm_sess_t *mine;

    if (bad) {
        refuse_unproven(cm, s, bad);
        return;
    }
    s->proven = 1;
    s->deadline = cm->now + cm->p.timeout_ns;
    cm->cnt.requests_accepted++;
    memcpy(s->req_mac, m->mac, sizeof(s->req_mac));
    memcpy(s->peer_id, m->id, m->id_len);
    s->peer_id_len = m->id_len;
    s->peer = m->addr;
    for (unsigned i = 0; i < RECENT; i++) {
        const cm_recent_t *r = &cm->recent[i];
        if (r->id_len && r->epoch == m->addr.epoch
            && id_cmp(r->id, r->id_len, m->id, m->id_len) == 0) {
            reply(cm, s, TB_CM_R_COLLISION, NULL);
            return;
        }
    }
    mine = pending_request_to(cm, m->id, m->id_len);
    if (mine) {
        if (id_cmp(cm->id, cm->p.id_len, m->id, m->id_len) < 0) {
            /* We win: our own request stands, the peer answers it. */
            reply(cm, s, TB_CM_R_COLLISION, NULL);
            return;
        }
        /* We lose: this request becomes the exchange of our pending one,
         * answered with the blob we were sending. */
        s->user = mine->user;
        s->has_user = 1;
        mine->has_user = 0;
        sess_close(mine);
        reply(cm, s, TB_CM_R_ACCEPT, &mine->local);
        return;
    }
    {
        tb_wire_addr_t local;
        void *user = NULL;
        cm->ncallbacks++;
        if (cm->cb.accept(cm->cb.ctx, m->id, m->id_len, &m->addr, &local, &user) != 0) {
            reply(cm, s, TB_CM_R_REFUSED, NULL);
            return;
        }
        s->user = user;
        s->has_user = 1;
        reply(cm, s, TB_CM_R_ACCEPT, &local);
    }
}

/* Make room for a new caller: close the oldest exchange nobody proved,
 * from source ip only unless ip is 0.  A flood then pushes out its own
 * callers, while a real peer proves itself within a round trip. */
static int evict_unproven(tb_cm_t *cm, uint32_t ip)
{
    cm_sess_t *victim = NULL;

    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (!s->outgoing && !s->proven && s->state != S_FINISHED && (ip == 0 || s->src_ip == ip)
            && (!victim || (int64_t) (s->deadline - victim->deadline) < 0)) {
            victim = s;
        }
    }
    if (!victim) {
        return 0;
    }
    cm->cnt.evicted++;
    warn_limited(cm, "closed a silent connection from %s to make room", victim->where);
    sess_close(victim);
    return 1;
}

static unsigned unproven_from(const tb_cm_t *cm, uint32_t ip)
{
    unsigned n = 0;

    for (const cm_sess_t *s = cm->sessions; s; s = s->next) {
        n += !s->outgoing && !s->proven && s->state != S_FINISHED && s->src_ip == ip;
    }
    return n;
}

static unsigned live_sessions(const tb_cm_t *cm)
{
    unsigned n = 0;

    for (const cm_sess_t *s = cm->sessions; s; s = s->next) {
        n += s->state != S_FINISHED;
    }
    return n;
}

static void accept_new(tb_cm_t *cm)
{
    for (;;) {
        struct sockaddr_in sin;
        socklen_t slen = sizeof(sin);
        char ip[INET_ADDRSTRLEN] = "?";
        cm_sess_t *s;
        int fd = accept(cm->lfd, (struct sockaddr *) &sin, &slen);

        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR
                && errno != ECONNABORTED) {
                TB_WARN("connection manager: accept failed: %s", strerror(errno));
            }
            return;
        }
        inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip));
        if (unproven_from(cm, sin.sin_addr.s_addr) >= cm->p.max_per_source) {
            evict_unproven(cm, sin.sin_addr.s_addr);
        }
        if (live_sessions(cm) >= cm->p.max_sessions && !evict_unproven(cm, 0)) {
            cm->cnt.refused_limit++;
            warn_limited(cm, "refused a connection from %s: too many unfinished ones", ip);
            close(fd);
            continue;
        }
        if (set_nonblocking(fd) != 0 || !(s = sess_new(cm, fd, 0, cm->now + cm->p.handshake_ns))) {
            close(fd);
            continue;
        }
        s->src_ip = sin.sin_addr.s_addr;
        snprintf(s->where, sizeof(s->where), "%s:%u", ip, (unsigned) ntohs(sin.sin_port));
        s->phase = P_HELLO;
        expect_msg(s, sizeof(s->in.nonce));
    }
}

/* ------------------------------------------------------------------ */
/* Requester side                                                      */

static void on_challenge(tb_cm_t *cm, cm_sess_t *s)
{
    tb_wire_cm_request_t *r = &s->out.req;

    if (!hdr_valid(&s->in.nonce.hdr, TB_CM_MSG_CHALLENGE)) {
        sess_finish(cm, s, TB_CM_EPROTO,
                    "malformed answer from %s: is a tbrdma process of the same version "
                    "listening there?", s->where);
        return;
    }
    memcpy(s->nonce_s, s->in.nonce.nonce, sizeof(s->nonce_s));
    memset(r, 0, sizeof(*r));
    hdr_fill(&r->hdr, TB_CM_MSG_REQUEST);
    r->id_len = (uint8_t) cm->p.id_len;
    r->peer_id_len = (uint8_t) s->peer_id_len;
    memcpy(r->id, cm->id, cm->p.id_len);
    memcpy(r->peer_id, s->peer_id, s->peer_id_len);
    r->addr = s->local;
    mac_compute(s, "TBCM request", NULL, 0, r, offsetof(tb_wire_cm_request_t, mac), r->mac);
    memcpy(s->req_mac, r->mac, sizeof(s->req_mac));
    s->phase = P_REQUEST;
    send_msg(s, sizeof(*r));
}

static void on_reply(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_reply_t *m = &s->in.rep;
    uint8_t mac[TB_WIRE_CM_MAC];

    if (!hdr_valid(&m->hdr, TB_CM_MSG_REPLY) || !all_zero(m->reserved, sizeof(m->reserved))
        || m->status > TB_CM_R_COLLISION) {
        sess_finish(cm, s, TB_CM_EPROTO,
                    "malformed answer from %s: run the same tbrdma version everywhere",
                    s->where);
        return;
    }
    mac_compute(s, "TBCM reply", s->req_mac, sizeof(s->req_mac), m,
                offsetof(tb_wire_cm_reply_t, mac), mac);
    if (!tb_mem_equal_ct(mac, m->mac, sizeof(mac))) {
        sess_finish(cm, s, TB_CM_EWRONGPEER,
                    "the process at %s could not prove it is the peer asked for (it restarted, "
                    "belongs to another job, or the address is stale)", s->where);
        return;
    }
    switch (m->status) {
    case TB_CM_R_ACCEPT: {
        cm_recent_t *r;
        if (!blob_valid(&m->addr)) {
            sess_finish(cm, s, TB_CM_EPROTO, "the process at %s sent a corrupt address",
                        s->where);
            return;
        }
        r = &cm->recent[cm->recent_next++ % RECENT];
        memcpy(r->id, s->peer_id, s->peer_id_len);
        r->id_len = s->peer_id_len;
        r->epoch = m->addr.epoch;
        s->peer = m->addr;
        sess_finish(cm, s, TB_CM_OK, NULL);
        return;
    }
    case TB_CM_R_COLLISION:
        /* The peer is connecting to us at the same time and wins: its request
         * will arrive and complete this exchange (on_request). */
        close(s->fd);
        s->fd = -1;
        s->state = S_WAIT_PEER;
        return;
    default:
        sess_finish(cm, s, TB_CM_EREFUSED, "the process at %s refused the connection",
                    s->where);
        return;
    }
}

/* Start the TCP connection on s->fd with a HELLO under a fresh nonce.  0, or
 * the errno of a failure before connecting (no random source). */
static int dial(cm_sess_t *s)
{
    s->phase = P_HELLO;
    s->out_len = sizeof(s->out.nonce);
    s->out_off = 0;
    s->state = S_CONNECTING;
    if (tb_random_bytes(s->nonce_r, sizeof(s->nonce_r)) != 0) {
        return errno;
    }
    memset(&s->out, 0, sizeof(s->out));
    hdr_fill(&s->out.nonce.hdr, TB_CM_MSG_HELLO);
    memcpy(s->out.nonce.nonce, s->nonce_r, sizeof(s->nonce_r));
    if (connect(s->fd, (struct sockaddr *) &s->dest, sizeof(s->dest)) == 0) {
        s->state = S_SENDING;
    } else if (errno != EINPROGRESS && errno != EINTR) {
        s->conn_err = errno;
    }
    return 0;
}

int tb_cm_connect(tb_cm_t *cm, const char *ip, uint16_t port, const void *peer_id,
                  size_t id_len, const tb_wire_addr_t *local, void *user, uint64_t now_ns)
{
    uint8_t peer_secret[TB_WIRE_SECRET_SIZE];
    struct sockaddr_in sin;
    cm_sess_t *s;
    int fd, rc;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    if (!ip || inet_pton(AF_INET, ip, &sin.sin_addr) != 1 || port == 0 || !peer_id
        || id_len == 0 || id_len > TB_CM_ID_MAX || !local || !blob_valid(local)) {
        TB_ERROR("connection manager: bad connect request (address '%s', port %u, identity "
                 "of %zu bytes)", ip ? ip : "(null)", (unsigned) port, id_len);
        return TB_CM_EINVAL;
    }
    if (cm->cb.peer_secret(cm->cb.ctx, peer_id, id_len, peer_secret) != 0) {
        TB_ERROR("connection manager: no published secret for the peer at %s:%u: is it a "
                 "process of this job?", ip, (unsigned) port);
        return TB_CM_EINVAL;
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || set_nonblocking(fd) != 0) {
        TB_ERROR("connection manager: socket setup failed: %s", strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return TB_CM_ESYS;
    }
    s = sess_new(cm, fd, 1, now_ns + cm->p.timeout_ns);
    if (!s) {
        close(fd);
        return TB_CM_ESYS;
    }
    snprintf(s->where, sizeof(s->where), "%s:%u", ip, (unsigned) port);
    memcpy(s->peer_id, peer_id, id_len);
    s->peer_id_len = id_len;
    tb_cm_pair_key(cm->id, cm->p.id_len, cm->secret, peer_id, id_len, peer_secret, s->key);
    memset(peer_secret, 0, sizeof(peer_secret));
    s->local = *local;
    s->user = user;
    s->has_user = 1;
    s->dest = sin;
    s->retry_ivl = RETRY_FIRST_NS;
    rc = dial(s);
    if (rc != 0) {
        s->conn_err = rc; /* reported through done, like a late failure */
    }
    return TB_CM_OK;
}

/* The responder closed an unanswered exchange (it may have made room for
 * others): dial again later if the deadline allows. */
static int retry_later(tb_cm_t *cm, cm_sess_t *s)
{
    if (!s->outgoing || s->retries >= RETRY_MAX
        || (int64_t) (cm->now + s->retry_ivl - s->deadline) >= 0) {
        return 0;
    }
    s->retries++;
    close(s->fd);
    s->fd = -1;
    s->retry_at = cm->now + s->retry_ivl;
    s->retry_ivl *= 2;
    s->state = S_RETRY;
    return 1;
}

static void redial(tb_cm_t *cm, cm_sess_t *s)
{
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (s->fd < 0 || set_nonblocking(s->fd) != 0) {
        sess_finish(cm, s, TB_CM_ESYS, "socket setup failed: %s", strerror(errno));
        return;
    }
    if (dial(s) != 0) {
        sess_finish(cm, s, TB_CM_ESYS, "no random source: %s", strerror(errno));
    }
}

/* ------------------------------------------------------------------ */
/* Progress                                                            */

/* A whole message is in: act on it by side and phase. */
static void sess_message(tb_cm_t *cm, cm_sess_t *s)
{
    if (s->outgoing) {
        if (s->phase == P_HELLO) {
            on_challenge(cm, s);
        } else {
            on_reply(cm, s);
        }
    } else if (s->phase == P_HELLO) {
        on_hello(cm, s);
    } else {
        on_request(cm, s);
    }
}

/* The message just written is out: what follows it. */
static void sess_sent(tb_cm_t *cm, cm_sess_t *s)
{
    if (s->outgoing) {
        expect_msg(s, s->phase == P_HELLO ? sizeof(s->in.nonce) : sizeof(s->in.rep));
    } else if (s->phase == P_REQUEST) {
        expect_msg(s, sizeof(s->in.req)); /* the challenge is out */
    } else if (s->close_after_send) {
        sess_close(s);
    } else {
        sess_finish(cm, s, TB_CM_OK, NULL);
    }
}

static void sess_event(tb_cm_t *cm, cm_sess_t *s, short revents)
{
    int rc;

    if (s->state == S_CONNECTING) {
        int err = s->conn_err;
        socklen_t len = sizeof(err);
        if (err == 0 && getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
        }
        if (err != 0) {
            sess_finish(cm, s, TB_CM_EUNREACH,
                        "cannot reach %s: %s (is the peer process running, and is the "
                        "address that of a cable to it?)", s->where, strerror(err));
            return;
        }
        if (!(revents & POLLOUT)) {
            return;
        }
        s->state = S_SENDING;
    }
    /* One event may carry several steps: a message read may be answered at
     * once, and the answer may go out at once. */
    while (s->state == S_SENDING || s->state == S_RECEIVING) {
        if (s->state == S_SENDING) {
            rc = sess_write(s);
            if (rc < 0 && retry_later(cm, s)) {
                return;
            }
            if (rc < 0) {
                sess_finish(cm, s, TB_CM_ECLOSED, "writing to %s failed: %s", s->where,
                            strerror(errno));
                return;
            }
            if (rc == 0) {
                return;
            }
            sess_sent(cm, s);
            continue;
        }
        rc = sess_read(s);
        if (rc < 0 && retry_later(cm, s)) {
            return;
        }
        if (rc < 0) {
            if (s->outgoing) {
                sess_finish(cm, s, TB_CM_ECLOSED,
                            "%s closed the connection before answering%s%s (a process of "
                            "another job or tbrdma version, or one that refused to talk)",
                            s->where, errno ? ": " : "", errno ? strerror(errno) : "");
            } else {
                sess_close(s); /* a requester that gave up: nobody to tell */
            }
            return;
        }
        if (rc == 0) {
            return;
        }
        sess_message(cm, s);
    }
}

int tb_cm_progress(tb_cm_t *cm, uint64_t now_ns)
{
    struct pollfd pfd[MAX_POLL];
    cm_sess_t *who[MAX_POLL];
    nfds_t n = 0;

    cm->ncallbacks = 0;
    if (NULL == cm->sessions && now_ns - cm->last_poll_ns < IDLE_POLL_NS) {
        return 0;
    }
    cm->now = now_ns;
    cm->last_poll_ns = now_ns;
    pfd[n].fd = cm->lfd;
    pfd[n].events = POLLIN;
    who[n++] = NULL;
    for (cm_sess_t *s = cm->sessions; s && n < MAX_POLL; s = s->next) {
        if (s->fd < 0) {
            continue;
        }
        pfd[n].fd = s->fd;
        pfd[n].events = s->state == S_RECEIVING ? POLLIN : POLLOUT;
        who[n++] = s;
    }
    if (poll(pfd, n, 0) > 0) {
        for (nfds_t i = 1; i < n; i++) {
            if (pfd[i].revents && who[i]->state != S_FINISHED && who[i]->fd == pfd[i].fd) {
                sess_event(cm, who[i], pfd[i].revents);
            }
        }
        if (pfd[0].revents & POLLIN) {
            accept_new(cm);
        }
    }
    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (s->state == S_RETRY && (int64_t) (now_ns - s->retry_at) >= 0
            && (int64_t) (now_ns - s->deadline) < 0) {
            redial(cm, s);
        }
        if (s->state == S_FINISHED || (int64_t) (now_ns - s->deadline) < 0) {
            continue;
        }
        if (!s->outgoing && !s->proven) {
            refuse_unproven(cm, s, "it did not complete the handshake in time");
        } else {
            sess_finish(cm, s, TB_CM_ETIMEDOUT,
                        "no complete answer from %s within %llu ms: is the peer alive and "
                        "listening?",
                        s->where, (unsigned long long) (cm->p.timeout_ns / 1000000));
        }
    }
    for (cm_sess_t **pp = &cm->sessions; *pp;) {
        cm_sess_t *s = *pp;
        if (s->state == S_FINISHED) {
            *pp = s->next;
            cm->nsessions--;
            free(s);
        } else {
            pp = &s->next;
        }
    }
    return cm->ncallbacks;
}

void tb_cm_cancel(tb_cm_t *cm, void *user)
{
    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (s->has_user && s->user == user) {
            s->has_user = 0;
            sess_close(s);
        }
    }
}

const tb_cm_counters_t *tb_cm_counters(const tb_cm_t *cm)
{
    return &cm->cnt;
}

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */

uint16_t tb_cm_port(const tb_cm_t *cm)
{
    return cm->port;
}

void tb_cm_set_secret(tb_cm_t *cm, const uint8_t *secret)
{
    memcpy(cm->secret, secret, TB_WIRE_SECRET_SIZE);
}

int tb_cm_create(const tb_cm_params_t *params, const tb_cm_callbacks_t *cb, tb_cm_t **out)
{
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    const char *what;
    tb_cm_t *cm;
    int one = 1;

    if (!params->id || params->id_len == 0 || params->id_len > TB_CM_ID_MAX || !params->secret
        || !cb || !cb->accept || !cb->done || !cb->peer_secret || params->timeout_ns == 0
        || params->max_sessions == 0) {
        TB_ERROR("connection manager: an identity of 1..%d bytes, a secret, peer_secret, "
                 "accept and done callbacks, a timeout and a session limit are required",
                 TB_CM_ID_MAX);
        return TB_CM_EINVAL;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(params->port);
    sin.sin_addr.s_addr = htonl(INADDR_ANY);
    if (params->bind_ip && params->bind_ip[0]
        && inet_pton(AF_INET, params->bind_ip, &sin.sin_addr) != 1) {
        TB_ERROR("connection manager: '%s' is not an IPv4 address", params->bind_ip);
        return TB_CM_EINVAL;
    }
    cm = calloc(1, sizeof(*cm));
    if (!cm) {
        return TB_CM_ESYS;
    }
    cm->p = *params;
    if (cm->p.handshake_ns == 0) {
        cm->p.handshake_ns = TB_CM_HANDSHAKE_NS;
    }
    if (cm->p.handshake_ns > cm->p.timeout_ns) {
        cm->p.handshake_ns = cm->p.timeout_ns;
    }
    if (cm->p.max_per_source == 0) {
        cm->p.max_per_source = TB_CM_PER_SOURCE;
    }
    cm->p.secret = NULL; /* the caller's buffer need not outlive the call */
    memcpy(cm->secret, params->secret, sizeof(cm->secret));
    memcpy(cm->id, params->id, params->id_len);
    cm->cb = *cb;
    what = "socket";
    cm->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (cm->lfd < 0) {
        goto fail;
    }
    setsockopt(cm->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    what = "fcntl";
    if (set_nonblocking(cm->lfd) != 0) {
        goto fail;
    }
    what = "bind";
    if (bind(cm->lfd, (struct sockaddr *) &sin, sizeof(sin)) != 0) {
        goto fail;
    }
    what = "listen";
    if (listen(cm->lfd, 64) != 0) {
        goto fail;
    }
    what = "getsockname";
    if (getsockname(cm->lfd, (struct sockaddr *) &sin, &slen) != 0) {
        goto fail;
    }
    cm->port = ntohs(sin.sin_port);
    *out = cm;
    return TB_CM_OK;

fail:
    TB_ERROR("connection manager: %s on %s:%u failed: %s%s", what,
             params->bind_ip && params->bind_ip[0] ? params->bind_ip : "0.0.0.0",
             (unsigned) params->port, strerror(errno),
             errno == EADDRINUSE ? " (choose another port, or 0 for any free one)"
             : errno == EADDRNOTAVAIL ? " (the address is on no interface of this host)"
                                      : "");
    if (cm->lfd >= 0) {
        close(cm->lfd);
    }
    memset(cm->secret, 0, sizeof(cm->secret));
    free(cm);
    return TB_CM_ESYS;
}

void tb_cm_destroy(tb_cm_t *cm)
{
    if (!cm) {
        return;
    }
    while (cm->sessions) {
        cm_sess_t *s = cm->sessions;
        sess_finish(cm, s, TB_CM_ECANCELED, "connection manager shut down");
        cm->sessions = s->next;
        free(s);
    }
    close(cm->lfd);
    memset(cm->secret, 0, sizeof(cm->secret));
    free(cm);
}
