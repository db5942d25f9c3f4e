/*
 * tbrdma common layer: connection setup over a TCP side channel (see
 * tb_cm.h; the messages are in tb_wire.h): sessions, socket I/O, progress
 * and life cycle.  Each side of an exchange has its own file:
 * tb_cm_responder.c and tb_cm_requester.c.
 *
 * Sessions are socket exchanges.  They are only marked finished while
 * events are handled and freed at the end of tb_cm_progress(), so a callback
 * that starts or cancels exchanges never pulls a session from under the
 * loop.  Each session reads exactly the message its phase expects, whole,
 * before looking at it.
 */
#include "tb_cm_int.h"

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

#include "tb_cable_probe.h"
#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_random.h"
#include "tb_sha256.h"


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
int cm_id_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
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

    if (cm_id_cmp(id_a, len_a, id_b, len_b) > 0) {
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
void cm_mac_compute(const cm_sess_t *s, const char *label, const void *extra,
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

int cm_socket_out(const tb_cm_t *cm)
{
    int fd = tb_sock_dial_from(cm->netdev, cm->src.s_addr), err;

    if (fd >= 0 && cm_set_nonblocking(fd) != 0) {
        err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

int cm_set_nonblocking(int fd)
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

int cm_blob_valid(const tb_wire_addr_t *a)
{
    return tb_wire_le32(a->magic) == TB_WIRE_ADDR_MAGIC
           && tb_crc32c(0, a, TB_WIRE_ADDR_SIZE - 4) == tb_wire_le32(a->crc);
}

void cm_hdr_fill(tb_wire_cm_hdr_t *h, uint8_t type)
{
    h->magic = tb_wire_le32(TB_WIRE_CM_MAGIC);
    h->version = TB_WIRE_CM_VERSION;
    h->type = type;
    h->reserved = 0;
}

int cm_hdr_valid(const tb_wire_cm_hdr_t *h, uint8_t type)
{
    return tb_wire_le32(h->magic) == TB_WIRE_CM_MAGIC && h->version == TB_WIRE_CM_VERSION
           && h->type == type && h->reserved == 0;
}

int cm_all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i]) {
            return 0;
        }
    }
    return 1;
}

cm_sess_t *cm_sess_new(tb_cm_t *cm, int fd, int outgoing, uint64_t deadline)
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

void cm_sess_close(cm_sess_t *s)
{
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    s->state = S_FINISHED;
}

/* End the exchange, telling the owner if one is waiting. */
__attribute__((format(printf, 4, 5))) void cm_sess_finish(tb_cm_t *cm, cm_sess_t *s, int status,
                                                          const char *fmt, ...)
{
    char why[256] = "";
    void *user = s->user;
    int notify = s->has_user;

    cm_sess_close(s);
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

/* A session's key and what it read die with it. */
static void cm_sess_free(cm_sess_t *s)
{
    tb_mem_wipe(s, sizeof(*s));
    free(s);
}

/* A caller that did not prove itself: logged, closed, told nothing. */
void cm_refuse_unproven(tb_cm_t *cm, cm_sess_t *s, const char *why)
{
    cm->cnt.refused_unauth++;
    tb_log_limited(&cm->warn_limit, cm->now, TB_LOG_WARN,
                   "connection manager: refused an unauthenticated connection request from %s: %s",
                   s->where, why);
    cm_sess_close(s);
}

void cm_send_msg(cm_sess_t *s, size_t len)
{
    s->out_len = len;
    s->out_off = 0;
    s->state = S_SENDING;
}

void cm_expect_msg(cm_sess_t *s, size_t len)
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
/* Progress                                                            */

/* A whole message is in: act on it by side and phase. */
static void sess_message(tb_cm_t *cm, cm_sess_t *s)
{
    if (s->outgoing) {
        if (s->phase == P_HELLO) {
            cm_on_challenge(cm, s);
        } else {
            cm_on_reply(cm, s);
        }
    } else if (s->phase == P_HELLO) {
        cm_on_hello(cm, s);
    } else {
        cm_on_request(cm, s);
    }
}

/* The message just written is out: what follows it. */
static void sess_sent(tb_cm_t *cm, cm_sess_t *s)
{
    if (s->outgoing) {
        cm_expect_msg(s, s->phase == P_HELLO ? sizeof(s->in.nonce) : sizeof(s->in.rep));
    } else if (s->phase == P_REQUEST) {
        cm_expect_msg(s, sizeof(s->in.req)); /* the challenge is out */
    } else if (s->close_after_send) {
        cm_sess_close(s);
    } else {
        cm_sess_finish(cm, s, TB_CM_OK, NULL);
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
            cm_sess_finish(cm, s, TB_CM_EUNREACH,
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
            if (rc < 0 && cm_retry_later(cm, s)) {
                return;
            }
            if (rc < 0) {
                cm_sess_finish(cm, s, TB_CM_ECLOSED, "writing to %s failed: %s", s->where,
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
        if (rc < 0 && cm_retry_later(cm, s)) {
            return;
        }
        if (rc < 0) {
            if (s->outgoing) {
                cm_sess_finish(cm, s, TB_CM_ECLOSED,
                            "%s closed the connection before answering%s%s (a process of "
                            "another job or tbrdma version, or one that refused to talk)",
                            s->where, errno ? ": " : "", errno ? strerror(errno) : "");
            } else {
                cm_sess_close(s); /* a requester that gave up: nobody to tell */
            }
            return;
        }
        if (rc == 0) {
            return;
        }
        sess_message(cm, s);
    }
}

/* What an exchange's socket waits for. */
static short sess_poll_events(const cm_sess_t *s)
{
    return S_RECEIVING == s->state ? POLLIN : POLLOUT;
}

unsigned tb_cm_poll_fds(const tb_cm_t *cm, struct pollfd *out, unsigned max, uint64_t *wake_ns)
{
    unsigned n = 0;

    if (n < max && cm->lfd >= 0) {
        out[n].fd = cm->lfd;
        out[n].events = POLLIN;
        out[n++].revents = 0;
    }
    for (const cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (S_FINISHED == s->state) {
            continue;
        }
        if (s->deadline < *wake_ns) {
            *wake_ns = s->deadline;
        }
        if (S_RETRY == s->state && s->retry_at < *wake_ns) {
            *wake_ns = s->retry_at;
        }
        if (s->fd >= 0 && n < max) {
            out[n].fd = s->fd;
            out[n].events = sess_poll_events(s);
            out[n++].revents = 0;
        }
    }
    return n;
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
        pfd[n].events = sess_poll_events(s);
        who[n++] = s;
    }
    if (poll(pfd, n, 0) > 0) {
        for (nfds_t i = 1; i < n; i++) {
            if (pfd[i].revents && who[i]->state != S_FINISHED && who[i]->fd == pfd[i].fd) {
                sess_event(cm, who[i], pfd[i].revents);
            }
        }
        if (pfd[0].revents & POLLIN) {
            cm_accept_new(cm);
        }
    }
    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (s->state == S_RETRY && (int64_t) (now_ns - s->retry_at) >= 0
            && (int64_t) (now_ns - s->deadline) < 0) {
            cm_redial(cm, s);
        }
        if (s->state == S_FINISHED || (int64_t) (now_ns - s->deadline) < 0) {
            continue;
        }
        if (!s->outgoing && !s->proven) {
            cm_refuse_unproven(cm, s, "it did not complete the handshake in time");
        } else {
            cm_sess_finish(cm, s, TB_CM_ETIMEDOUT,
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
            cm_sess_free(s);
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
            cm_sess_close(s);
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

void cm_session_key(const tb_cm_t *cm, const void *peer_id, size_t id_len,
                    const uint8_t *peer_secret, uint8_t key[TB_CM_KEY_SIZE])
{
    /* A pairwise secret stands in both places: each end holds it for both. */
    const uint8_t *own = cm->p.pairwise ? peer_secret : cm->secret;

    tb_cm_pair_key(cm->id, cm->p.id_len, own, peer_id, id_len, peer_secret, key);
}

int tb_cm_create(const tb_cm_params_t *params, const tb_cm_callbacks_t *cb, tb_cm_t **out)
{
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    const char *what;
    tb_cm_t *cm;
    int one = 1;

    if (!params->id || params->id_len == 0 || params->id_len > TB_CM_ID_MAX
        || (!params->secret && !params->pairwise) || !cb || !cb->accept || !cb->done
        || !cb->peer_secret || params->timeout_ns == 0 || params->max_sessions == 0) {
        TB_ERROR("connection manager: an identity of 1..%d bytes, a secret (unless pairwise), "
                 "peer_secret, accept and done callbacks, a timeout and a session limit are "
                 "required",
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
    /* The caller's buffers need not outlive the call. */
    cm->p.secret = NULL;
    cm->p.bind_ip = NULL;
    cm->p.bind_netdev = NULL;
    cm->src = sin.sin_addr;
    if (params->bind_netdev && params->bind_netdev[0]) {
        if (strlen(params->bind_netdev) >= sizeof(cm->netdev)) {
            TB_ERROR("connection manager: '%s' is not an interface name", params->bind_netdev);
            tb_mem_wipe(cm, sizeof(*cm));
            free(cm);
            return TB_CM_EINVAL;
        }
        strcpy(cm->netdev, params->bind_netdev);
    }
    if (params->secret) {
        memcpy(cm->secret, params->secret, sizeof(cm->secret));
    }
    memcpy(cm->id, params->id, params->id_len);
    cm->cb = *cb;
    what = "socket";
    cm->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (cm->lfd < 0) {
        goto fail;
    }
    setsockopt(cm->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    what = "fcntl";
    if (cm_set_nonblocking(cm->lfd) != 0) {
        goto fail;
    }
    what = "binding to its interface";
    if (cm->netdev[0] && (errno = -tb_sock_bind_netdev(cm->lfd, cm->netdev)) != 0) {
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
    TB_ERROR("connection manager: %s on %s:%u%s%s failed: %s%s", what,
             params->bind_ip && params->bind_ip[0] ? params->bind_ip : "0.0.0.0",
             (unsigned) params->port, cm->netdev[0] ? " of " : "", cm->netdev, strerror(errno),
             errno == EADDRINUSE ? " (choose another port, or 0 for any free one)"
             : errno == EPERM ? " (binding a socket to an interface needs Linux 5.7 or later, "
                                "or CAP_NET_RAW)"
             : errno == EADDRNOTAVAIL ? " (the address is on no interface of this host)"
                                      : "");
    if (cm->lfd >= 0) {
        close(cm->lfd);
    }
    tb_mem_wipe(cm, sizeof(*cm));
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
        cm_sess_finish(cm, s, TB_CM_ECANCELED, "connection manager shut down");
        cm->sessions = s->next;
        cm_sess_free(s);
    }
    close(cm->lfd);
    tb_mem_wipe(cm, sizeof(*cm));
    free(cm);
}
