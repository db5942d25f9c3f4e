/*
 * tbrdma common layer: the connection manager's requester side: dialling a
 * peer, proving ourselves, and checking its reply.
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

#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_random.h"
#include "tb_sha256.h"


/* ------------------------------------------------------------------ */
/* Requester side                                                      */

void cm_on_challenge(tb_cm_t *cm, cm_sess_t *s)
{
    tb_wire_cm_request_t *r = &s->out.req;

    if (!cm_hdr_valid(&s->in.nonce.hdr, TB_CM_MSG_CHALLENGE)) {
        cm_sess_finish(cm, s, TB_CM_EPROTO,
                    "malformed answer from %s: is a tbrdma process of the same version "
                    "listening there?", s->where);
        return;
    }
    memcpy(s->nonce_s, s->in.nonce.nonce, sizeof(s->nonce_s));
    memset(r, 0, sizeof(*r));
    cm_hdr_fill(&r->hdr, TB_CM_MSG_REQUEST);
    r->id_len = (uint8_t) cm->p.id_len;
    r->peer_id_len = (uint8_t) s->peer_id_len;
    memcpy(r->id, cm->id, cm->p.id_len);
    memcpy(r->peer_id, s->peer_id, s->peer_id_len);
    r->addr = s->local;
    cm_mac_compute(s, "TBCM request", NULL, 0, r, offsetof(tb_wire_cm_request_t, mac), r->mac);
    memcpy(s->req_mac, r->mac, sizeof(s->req_mac));
    s->phase = P_REQUEST;
    cm_send_msg(s, sizeof(*r));
}

void cm_on_reply(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_reply_t *m = &s->in.rep;
    uint8_t mac[TB_WIRE_CM_MAC];

    if (!cm_hdr_valid(&m->hdr, TB_CM_MSG_REPLY) || !cm_all_zero(m->reserved, sizeof(m->reserved))
        || m->status > TB_CM_R_COLLISION) {
        cm_sess_finish(cm, s, TB_CM_EPROTO,
                    "malformed answer from %s: run the same tbrdma version everywhere",
                    s->where);
        return;
    }
    cm_mac_compute(s, "TBCM reply", s->req_mac, sizeof(s->req_mac), m,
                offsetof(tb_wire_cm_reply_t, mac), mac);
    if (!tb_mem_equal_ct(mac, m->mac, sizeof(mac))) {
        cm_sess_finish(cm, s, TB_CM_EWRONGPEER,
                    "the process at %s could not prove it is the peer asked for (it restarted, "
                    "belongs to another job, or the address is stale)", s->where);
        return;
    }
    switch (m->status) {
    case TB_CM_R_ACCEPT: {
        cm_recent_t *r;
        if (!cm_blob_valid(&m->addr)) {
            cm_sess_finish(cm, s, TB_CM_EPROTO, "the process at %s sent a corrupt address",
                        s->where);
            return;
        }
        r = &cm->recent[cm->recent_next++ % RECENT];
        memcpy(r->id, s->peer_id, s->peer_id_len);
        r->id_len = s->peer_id_len;
        r->epoch = m->addr.epoch;
        s->peer = m->addr;
        cm_sess_finish(cm, s, TB_CM_OK, NULL);
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
        cm_sess_finish(cm, s, TB_CM_EREFUSED, "the process at %s refused the connection",
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
    cm_hdr_fill(&s->out.nonce.hdr, TB_CM_MSG_HELLO);
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
        || id_len == 0 || id_len > TB_CM_ID_MAX || !local || !cm_blob_valid(local)) {
        TB_ERROR("connection manager: bad connect request (address '%s', port %u, identity "
                 "of %zu bytes)", ip ? ip : "(null)", (unsigned) port, id_len);
        return TB_CM_EINVAL;
    }
    if (cm->cb.peer_secret(cm->cb.ctx, peer_id, id_len, peer_secret) != 0) {
        TB_ERROR("connection manager: no published secret for the peer at %s:%u: is it a "
                 "process of this job?", ip, (unsigned) port);
        return TB_CM_EINVAL;
    }
    fd = cm_socket_out(cm);
    if (fd < 0) {
        TB_ERROR("connection manager: socket setup%s%s failed: %s", cm->netdev[0] ? " on " : "",
                 cm->netdev, strerror(errno));
        return TB_CM_ESYS;
    }
    s = cm_sess_new(cm, fd, 1, now_ns + cm->p.timeout_ns);
    if (!s) {
        close(fd);
        return TB_CM_ESYS;
    }
    snprintf(s->where, sizeof(s->where), "%s:%u", ip, (unsigned) port);
    memcpy(s->peer_id, peer_id, id_len);
    s->peer_id_len = id_len;
    cm_session_key(cm, peer_id, id_len, peer_secret, s->key);
    tb_mem_wipe(peer_secret, sizeof(peer_secret));
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
int cm_retry_later(tb_cm_t *cm, cm_sess_t *s)
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

void cm_redial(tb_cm_t *cm, cm_sess_t *s)
{
    s->fd = cm_socket_out(cm);
    if (s->fd < 0) {
        cm_sess_finish(cm, s, TB_CM_ESYS, "socket setup failed: %s", strerror(errno));
        return;
    }
    if (dial(s) != 0) {
        cm_sess_finish(cm, s, TB_CM_ESYS, "no random source: %s", strerror(errno));
    }
}

