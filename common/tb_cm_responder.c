/*
 * tbrdma common layer: the connection manager's responder side: accepting
 * callers, bounding the unproven ones, and answering a proven request.
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
/* Responder side                                                      */

static cm_sess_t *pending_request_to(tb_cm_t *cm, const uint8_t *id, size_t id_len)
{
    for (cm_sess_t *s = cm->sessions; s; s = s->next) {
        if (s->outgoing && s->state != S_FINISHED && s->has_user
            && cm_id_cmp(s->peer_id, s->peer_id_len, id, id_len) == 0) {
            return s;
        }
    }
    return NULL;
}

void cm_on_hello(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_nonce_msg_t *m = &s->in.nonce;

    if (tb_wire_le32(m->hdr.magic) == TB_WIRE_CM_MAGIC && m->hdr.version != TB_WIRE_CM_VERSION) {
        cm_refuse_unproven(cm, s, "it speaks another tbrdma version: run the same tbrdma "
                               "everywhere");
        return;
    }
    if (!cm_hdr_valid(&m->hdr, TB_CM_MSG_HELLO)) {
        cm_refuse_unproven(cm, s, "not a tbrdma connection request");
        return;
    }
    memcpy(s->nonce_r, m->nonce, sizeof(s->nonce_r));
    if (tb_random_bytes(s->nonce_s, sizeof(s->nonce_s)) != 0) {
        tb_log_limited(&cm->warn_limit, cm->now, TB_LOG_WARN,
                       "connection manager: no random source for a connection challenge: %s",
                       strerror(errno));
        cm_sess_close(s);
        return;
    }
    memset(&s->out, 0, sizeof(s->out));
    cm_hdr_fill(&s->out.nonce.hdr, TB_CM_MSG_CHALLENGE);
    memcpy(s->out.nonce.nonce, s->nonce_s, sizeof(s->nonce_s));
    s->phase = P_REQUEST;
    cm_send_msg(s, sizeof(s->out.nonce));
}

static void reply(tb_cm_t *cm, cm_sess_t *s, uint8_t status, const tb_wire_addr_t *addr)
{
    tb_wire_cm_reply_t *r = &s->out.rep;

    memset(r, 0, sizeof(*r));
    cm_hdr_fill(&r->hdr, TB_CM_MSG_REPLY);
    r->status = status;
    if (addr) {
        r->addr = *addr;
    }
    cm_mac_compute(s, "TBCM reply", s->req_mac, sizeof(s->req_mac), r, offsetof(tb_wire_cm_reply_t,
                                                                             mac), r->mac);
    s->phase = P_REPLY;
    s->close_after_send = status != TB_CM_R_ACCEPT;
    cm_send_msg(s, sizeof(*r));
}

/* Whether a request is well formed and proven; its key is left in s. */
static const char *request_check(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_request_t *m = &s->in.req;
    uint8_t peer_secret[TB_WIRE_SECRET_SIZE], mac[TB_WIRE_CM_MAC];
    int known;

    if (!cm_hdr_valid(&m->hdr, TB_CM_MSG_REQUEST) || !cm_all_zero(m->reserved, sizeof(m->reserved))
        || m->id_len == 0 || m->id_len > TB_CM_ID_MAX || m->peer_id_len == 0
        || m->peer_id_len > TB_CM_ID_MAX
        || !cm_all_zero(m->id + m->id_len, TB_CM_ID_MAX - m->id_len)
        || !cm_all_zero(m->peer_id + m->peer_id_len, TB_CM_ID_MAX - m->peer_id_len)
        || !cm_blob_valid(&m->addr)) {
        return "malformed request";
    }
    if (cm_id_cmp(m->peer_id, m->peer_id_len, cm->id, cm->p.id_len) != 0) {
        return "it asked for another process";
    }
    if (cm_id_cmp(m->id, m->id_len, cm->id, cm->p.id_len) == 0) {
        return "it claimed this process's own identity";
    }
    known = cm->cb.peer_secret(cm->cb.ctx, m->id, m->id_len, peer_secret);
    if (TB_CM_SECRET_BUSY == known) {
        return "too many callers nobody named at once; a process of this job calls again";
    }
    if (0 != known) {
        return "it claimed an identity that is not a process of this job";
    }
    cm_session_key(cm, m->id, m->id_len, peer_secret, s->key);
    tb_mem_wipe(peer_secret, sizeof(peer_secret));
    cm_mac_compute(s, "TBCM request", NULL, 0, m, offsetof(tb_wire_cm_request_t, mac), mac);
    if (!tb_mem_equal_ct(mac, m->mac, sizeof(mac))) {
        return "it could not prove the identity it claimed";
    }
    return NULL;
}

void cm_on_request(tb_cm_t *cm, cm_sess_t *s)
{
    const tb_wire_cm_request_t *m = &s->in.req;
    const char *bad = request_check(cm, s);
    cm_sess_t *mine;

    if (bad) {
        cm_refuse_unproven(cm, s, bad);
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
            && cm_id_cmp(r->id, r->id_len, m->id, m->id_len) == 0) {
            reply(cm, s, TB_CM_R_COLLISION, NULL);
            return;
        }
    }
    mine = pending_request_to(cm, m->id, m->id_len);
    if (mine) {
        if (cm_id_cmp(cm->id, cm->p.id_len, m->id, m->id_len) < 0) {
            /* We win: our own request stands, the peer answers it. */
            reply(cm, s, TB_CM_R_COLLISION, NULL);
            return;
        }
        /* We lose: this request becomes the exchange of our pending one,
         * answered with the blob we were sending. */
        s->user = mine->user;
        s->has_user = 1;
        mine->has_user = 0;
        cm_sess_close(mine);
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
    tb_log_limited(&cm->warn_limit, cm->now, TB_LOG_WARN,
                   "connection manager: closed a silent connection from %s to make room",
                   victim->where);
    cm_sess_close(victim);
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

void cm_accept_new(tb_cm_t *cm)
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
            tb_log_limited(&cm->warn_limit, cm->now, TB_LOG_WARN,
                           "connection manager: refused a connection from %s: too many "
                           "unfinished ones",
                           ip);
            close(fd);
            continue;
        }
        if (cm_set_nonblocking(fd) != 0
            || !(s = cm_sess_new(cm, fd, 0, cm->now + cm->p.handshake_ns))) {
            close(fd);
            continue;
        }
        s->src_ip = sin.sin_addr.s_addr;
        snprintf(s->where, sizeof(s->where), "%s:%u", ip, (unsigned) ntohs(sin.sin_port));
        s->phase = P_HELLO;
        cm_expect_msg(s, sizeof(s->in.nonce));
    }
}

