/*
 * tbrdma common layer: connection setup over a TCP side channel (see
 * tb_cm.h).
 *
 * Sessions are socket exchanges.  They are only marked finished while
 * events are handled and freed at the end of tb_cm_progress(), so a callback
 * that starts or cancels exchanges never pulls a session from under the
 * loop.
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

#define CM_MAGIC 0x4d434254u /* "TBCM" in little-endian byte order */
#define MAX_POLL 256
#define RECENT 16
/* With no exchange under way only the listening socket is polled, and only
 * this often: poll() is a system call, and the data path calls progress
 * between every two messages (a quarter of a ping-pong's CPU time under
 * emulation went to it).  A peer's request then waits up to 1 ms. */
#define IDLE_POLL_NS 1000000ull

enum { MSG_REQUEST = 1, MSG_REPLY = 2 };

/* Reply status on the wire. */
enum { R_ACCEPT = 0, R_REFUSED = 1, R_COLLISION = 2, R_BAD = 3 };

typedef struct __attribute__((packed)) cm_msg {
    uint32_t magic;
    uint8_t version;
    uint8_t type;   /* MSG_* */
    uint8_t status; /* R_* in a reply, 0 in a request */
    uint8_t id_len; /* 1..TB_CM_ID_MAX */
    uint8_t id[TB_CM_ID_MAX];
    tb_wire_addr_t addr; /* zero unless status is R_ACCEPT or type is MSG_REQUEST */
} cm_msg_t;

#define CM_MSG_SIZE (8 + TB_CM_ID_MAX + TB_WIRE_ADDR_SIZE)
_Static_assert(sizeof(cm_msg_t) == CM_MSG_SIZE, "cm message layout");

typedef enum {
    S_CONNECTING, /* outgoing: TCP connect in progress */
    S_SENDING,    /* writing out_msg */
    S_RECEIVING,  /* reading in_msg */
    S_WAIT_PEER,  /* outgoing, lost a collision: the peer's request will finish it */
    S_FINISHED,   /* to be freed */
} sess_state_t;

typedef struct cm_sess {
    struct cm_sess *next;
    int fd;
    int outgoing;
    sess_state_t state;
    int has_user;   /* done(user) is owed */
    void *user;
    int close_after_send; /* incoming refusal: no callback after the write */
    int conn_err;         /* outgoing: connect() failed at once with this errno */
    uint64_t deadline;
    uint8_t peer_id[TB_CM_ID_MAX];
    size_t peer_id_len;
    tb_wire_addr_t local; /* outgoing: our blob (also answers a lost collision) */
    tb_wire_addr_t peer;  /* incoming: the requester's blob, reported after the reply */
    cm_msg_t out;
    size_t out_off;
    cm_msg_t in;
    size_t in_off;
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
    tb_cm_callbacks_t cb;
    int lfd;
    uint16_t port;
    cm_sess_t *sessions;
    unsigned nsessions;
    int ncallbacks;
    uint64_t last_poll_ns;
    cm_recent_t recent[RECENT];
    unsigned recent_next;
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
    case TB_CM_EWRONGPEER: return "another process answered";
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

static void msg_fill(tb_cm_t *cm, cm_msg_t *m, uint8_t type, uint8_t status,
                     const tb_wire_addr_t *addr)
{
    memset(m, 0, sizeof(*m));
    m->magic = tb_wire_le32(CM_MAGIC);
    m->version = TB_CM_VERSION;
    m->type = type;
    m->status = status;
    m->id_len = (uint8_t) cm->p.id_len;
    memcpy(m->id, cm->id, cm->p.id_len);
    if (addr) {
        m->addr = *addr;
    }
}

/* A received message is usable only if every field checks out: it comes
 * from the network and is never trusted. */
static int msg_valid(const cm_msg_t *m, uint8_t type)
{
    if (tb_wire_le32(m->magic) != CM_MAGIC || m->version != TB_CM_VERSION || m->type != type
        || m->id_len == 0 || m->id_len > TB_CM_ID_MAX) {
        return 0;
    }
    for (size_t i = m->id_len; i < TB_CM_ID_MAX; i++) {
        if (m->id[i] != 0) {
            return 0;
        }
    }
    if (type == MSG_REQUEST) {
        return m->status == 0 && blob_valid(&m->addr);
    }
    return m->status <= R_BAD && (m->status != R_ACCEPT || blob_valid(&m->addr));
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
    while (s->out_off < CM_MSG_SIZE) {
        ssize_t n = send(s->fd, (const uint8_t *) &s->out + s->out_off, CM_MSG_SIZE - s->out_off,
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

/* Read what has arrived.  1 when the whole message is in, 0 to wait, -1 on
 * error or end of stream (errno 0 then). */
static int sess_read(cm_sess_t *s)
{
    while (s->in_off < CM_MSG_SIZE) {
        ssize_t n = recv(s->fd, (uint8_t *) &s->in + s->in_off, CM_MSG_SIZE - s->in_off, 0);
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

static void reply(tb_cm_t *cm, cm_sess_t *s, uint8_t status, const tb_wire_addr_t *addr)
{
    msg_fill(cm, &s->out, MSG_REPLY, status, addr);
    s->out_off = 0;
    s->state = S_SENDING;
    s->close_after_send = status != R_ACCEPT;
}

static void on_request(tb_cm_t *cm, cm_sess_t *s)
{
    const cm_msg_t *m = &s->in;
    cm_sess_t *mine;

    if (!msg_valid(m, MSG_REQUEST)
        || id_cmp(m->id, m->id_len, cm->id, cm->p.id_len) == 0) {
        TB_WARN("connection manager: malformed connection request from %s refused", s->where);
        reply(cm, s, R_BAD, NULL);
        return;
    }
    memcpy(s->peer_id, m->id, m->id_len);
    s->peer_id_len = m->id_len;
    s->peer = m->addr;
    for (unsigned i = 0; i < RECENT; i++) {
        const cm_recent_t *r = &cm->recent[i];
        if (r->id_len && r->epoch == m->addr.epoch
            && id_cmp(r->id, r->id_len, m->id, m->id_len) == 0) {
            reply(cm, s, R_COLLISION, NULL);
            return;
        }
    }
    mine = pending_request_to(cm, m->id, m->id_len);
    if (mine) {
        if (id_cmp(cm->id, cm->p.id_len, m->id, m->id_len) < 0) {
            /* We win: our own request stands, the peer answers it. */
            reply(cm, s, R_COLLISION, NULL);
            return;
        }
        /* We lose: this request becomes the exchange of our pending one,
         * answered with the blob we were sending. */
        s->user = mine->user;
        s->has_user = 1;
        mine->has_user = 0;
        sess_close(mine);
        reply(cm, s, R_ACCEPT, &mine->local);
        return;
    }
    {
        tb_wire_addr_t local;
        void *user = NULL;
        cm->ncallbacks++;
        if (cm->cb.accept(cm->cb.ctx, m->id, m->id_len, &m->addr, &local, &user) != 0) {
            reply(cm, s, R_REFUSED, NULL);
            return;
        }
        s->user = user;
        s->has_user = 1;
        reply(cm, s, R_ACCEPT, &local);
    }
}

static void accept_new(tb_cm_t *cm, uint64_t now)
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
        if (cm->nsessions >= cm->p.max_sessions || set_nonblocking(fd) != 0
            || !(s = sess_new(cm, fd, 0, now + cm->p.timeout_ns))) {
            close(fd);
            continue;
        }
        inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip));
        snprintf(s->where, sizeof(s->where), "%s:%u", ip, (unsigned) ntohs(sin.sin_port));
        s->state = S_RECEIVING;
    }
}

/* ------------------------------------------------------------------ */
/* Requester side                                                      */

static void on_reply(tb_cm_t *cm, cm_sess_t *s)
{
    const cm_msg_t *m = &s->in;

    if (!msg_valid(m, MSG_REPLY)) {
        sess_finish(cm, s, TB_CM_EPROTO,
                    "malformed answer from %s: is a tbrdma process of the same version "
                    "listening there?", s->where);
        return;
    }
    if (id_cmp(m->id, m->id_len, s->peer_id, s->peer_id_len) != 0) {
        sess_finish(cm, s, TB_CM_EWRONGPEER,
                    "%s is another process than the one asked for (it restarted, or the "
                    "address is stale)", s->where);
        return;
    }
    switch (m->status) {
    case R_ACCEPT: {
        cm_recent_t *r = &cm->recent[cm->recent_next++ % RECENT];
        memcpy(r->id, m->id, m->id_len);
        r->id_len = m->id_len;
        r->epoch = m->addr.epoch;
        s->peer = m->addr;
        sess_finish(cm, s, TB_CM_OK, NULL);
        return;
    }
    case R_COLLISION:
        /* The peer is connecting to us at the same time and wins: its request
         * will arrive and complete this exchange (on_request). */
        close(s->fd);
        s->fd = -1;
        s->state = S_WAIT_PEER;
        return;
    case R_REFUSED:
        sess_finish(cm, s, TB_CM_EREFUSED, "the process at %s refused the connection",
                    s->where);
        return;
    default:
        sess_finish(cm, s, TB_CM_EPROTO,
                    "the process at %s rejected our request as malformed: run the same "
                    "tbrdma version everywhere", s->where);
        return;
    }
}

int tb_cm_connect(tb_cm_t *cm, const char *ip, uint16_t port, const void *peer_id,
                  size_t id_len, const tb_wire_addr_t *local, void *user, uint64_t now_ns)
{
    struct sockaddr_in sin;
    cm_sess_t *s;
    int fd;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    if (!ip || inet_pton(AF_INET, ip, &sin.sin_addr) != 1 || port == 0 || !peer_id
        || id_len == 0 || id_len > TB_CM_ID_MAX || !local || !blob_valid(local)) {
        TB_ERROR("connection manager: bad connect request (address '%s', port %u, identity "
                 "of %zu bytes)", ip ? ip : "(null)", (unsigned) port, id_len);
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
    s->local = *local;
    s->user = user;
    s->has_user = 1;
    msg_fill(cm, &s->out, MSG_REQUEST, 0, local);
    s->state = S_CONNECTING;
    if (connect(fd, (struct sockaddr *) &sin, sizeof(sin)) == 0) {
        s->state = S_SENDING;
    } else if (errno != EINPROGRESS && errno != EINTR) {
        /* Reported through done at the next progress, like a late failure. */
        s->conn_err = errno;
    }
    return TB_CM_OK;
}

/* ------------------------------------------------------------------ */
/* Progress                                                            */

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
    if (s->state == S_SENDING) {
        rc = sess_write(s);
        if (rc < 0) {
            sess_finish(cm, s, TB_CM_ECLOSED, "writing to %s failed: %s", s->where,
                        strerror(errno));
            return;
        }
        if (rc == 0) {
            return;
        }
        if (s->outgoing) {
            s->state = S_RECEIVING;
            s->in_off = 0;
        } else if (s->close_after_send) {
            sess_close(s);
            return;
        } else {
            sess_finish(cm, s, TB_CM_OK, NULL);
            return;
        }
    }
    if (s->state == S_RECEIVING) {
        rc = sess_read(s);
        if (rc < 0) {
            if (s->outgoing) {
                sess_finish(cm, s, TB_CM_ECLOSED, "%s closed the connection before answering%s%s",
                            s->where, errno ? ": " : "", errno ? strerror(errno) : "");
            } else {
                sess_close(s); /* a requester that gave up: nobody to tell */
            }
            return;
        }
        if (rc == 1) {
            if (s->outgoing) {
                on_reply(cm, s);
            } else {
                on_request(cm, s);
                if (s->state == S_SENDING) {
                    sess_event(cm, s, POLLOUT);
                }
            }
        }
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
            accept_new(cm, now_ns);
        }
    }
    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (s->state != S_FINISHED && (int64_t) (now_ns - s->deadline) >= 0) {
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

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */

uint16_t tb_cm_port(const tb_cm_t *cm)
{
    return cm->port;
}

int tb_cm_create(const tb_cm_params_t *params, const tb_cm_callbacks_t *cb, tb_cm_t **out)
{
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    const char *what;
    tb_cm_t *cm;
    int one = 1;

    if (!params->id || params->id_len == 0 || params->id_len > TB_CM_ID_MAX || !cb
        || !cb->accept || !cb->done || params->timeout_ns == 0 || params->max_sessions == 0) {
        TB_ERROR("connection manager: an identity of 1..%d bytes, accept and done callbacks, "
                 "a timeout and a session limit are required", TB_CM_ID_MAX);
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
    free(cm);
}
