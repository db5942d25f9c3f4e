/*
 * tbrdma host engine, daemon: the engine's devices, and how its channels to
 * other engines are set up: a connection manager on each cable's address,
 * dialing (again, while the other engine may not be ready) and accepting,
 * with a key only the two engines can compute (tb_eng_cm_peer_secret).
 */
#include "tb_engine_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_log.h"
#include "tb_namefilter.h"
#include "tb_sha256.h"
#include "tb_x25519.h"

/* ---- devices ------------------------------------------------------------- */

static int cm_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                     tb_wire_addr_t *local, void **user);
static void cm_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer,
                    const char *why);

int tb_eng_devices_open(tb_engine_t *e, char *why, size_t whylen)
{
    const tb_tunables_t *t = &e->p.tunables;
    tb_namefilter_t filter;

    if (0 != tb_namefilter_parse(&filter, t->if_include, t->if_exclude, why, whylen)) {
        return -1;
    }
    if (0 != tb_device_list_open(&e->devlist, t->verbs_library, &filter, why, whylen)) {
        return -1;
    }
    e->devlist_open = true;
    for (int i = 0; i < e->devlist.count && e->ndev < TB_WIRE_ENGINE_MAX_DEVICES; ++i) {
        tb_device_t *dev = &e->devlist.devices[i];
        eng_dev_t *d = &e->devs[e->ndev];
        tb_cm_callbacks_t cb = {.ctx = d,
                                .peer_secret = tb_eng_cm_peer_secret,
                                .accept = cm_accept,
                                .done = cm_done};
        tb_domain_params_t dp;
        tb_cm_params_t cp;
        char ip[INET_ADDRSTRLEN];

        if (!dev->usable) {
            continue;
        }
        tb_domain_params_default(&dp);
        dp.qp_budget = TB_APPLE_MAX_QP;
        dp.events = e->p.events;
        if (0 != tb_domain_create(&e->devlist.verbs, dev, &dp, &d->dom)) {
            TB_WARN("not using %s: it cannot be opened for traffic (details above)", dev->name);
            continue;
        }
        inet_ntop(AF_INET, &dev->ipv4, ip, sizeof(ip));
        memset(&cp, 0, sizeof(cp));
        cp.bind_ip = ip;
        cp.bind_netdev = dev->netdev;
        cp.id = e->id;
        cp.id_len = sizeof(e->id);
        cp.pairwise = true; /* tb_eng_cm_peer_secret */
        cp.timeout_ns = (uint64_t) t->peer_timeout_ms * 1000000u;
        cp.max_sessions = 256;
        if (TB_CM_OK != tb_cm_create(&cp, &cb, &d->cm)) {
            TB_WARN("not using %s: cannot listen for connections on %s", dev->name, ip);
            tb_domain_destroy(d->dom);
            d->dom = NULL;
            continue;
        }
        d->e = e;
        d->idx = e->ndev;
        d->dev = dev;
        d->port = tb_cm_port(d->cm);
        e->ndev++;
    }
    if (0 == e->ndev) {
        snprintf(why, whylen,
                 0 == e->devlist.count
                     ? "no RDMA device%s (on a Mac: macOS 26.2 or later, RDMA enabled with "
                       "'rdma_ctl enable' in Recovery, and a Thunderbolt 5 cable)"
                     : "no RDMA device is usable%s; run with --mca btl_base_verbose 20 to see why",
                 filter.count ? " passes btl_tbrdma_if_include/if_exclude" : "");
        return -1;
    }
    return 0;
}

void tb_eng_cms_close(tb_engine_t *e)
{
    for (unsigned d = 0; d < e->ndev; ++d) {
        tb_cm_destroy(e->devs[d].cm);
        e->devs[d].cm = NULL;
    }
}

void tb_eng_devices_close(tb_engine_t *e)
{
    tb_eng_cms_close(e);
    for (unsigned d = 0; d < e->ndev; ++d) {
        tb_domain_destroy(e->devs[d].dom);
    }
    e->ndev = 0;
    if (e->devlist_open) {
        tb_device_list_close(&e->devlist);
        e->devlist_open = false;
    }
}

int tb_eng_devices_progress(tb_engine_t *e, uint64_t now)
{
    int n = 0;

    for (unsigned d = 0; d < e->ndev; ++d) {
        int m = tb_domain_progress(e->devs[d].dom, now);
        n += (e->devs[d].cm ? tb_cm_progress(e->devs[d].cm, now) : 0) + (m > 0 ? m : 0);
    }
    return n;
}


/* ---- dialing and accepting ----------------------------------------------- */

int tb_eng_peer_call(eng_peer_t *p, uint64_t now)
{
    tb_wire_addr_t local;
    char ip[INET_ADDRSTRLEN];
    struct in_addr a = {.s_addr = p->ipv4};

    tb_conn_local_addr(p->conn, &local);
    inet_ntop(AF_INET, &a, ip, sizeof(ip));
    return tb_cm_connect(p->e->devs[p->dev].cm, ip, p->port, p->id, sizeof(p->id), &local, p,
                         now);
}

void tb_eng_peer_dial(eng_peer_t *p)
{
    tb_engine_t *e = p->e;
    int rc;

    if (ENG_PEER_IDLE != p->state || !p->known) {
        return;
    }
    p->redial_at = 0;
    if (!e->have_key) {
        p->want_dial = true;
        return;
    }
    p->want_dial = false;
    if (0 != tb_eng_peer_make_conn(p)) {
        return;
    }
    rc = tb_eng_peer_call(p, tb_now_ns());
    if (TB_CM_OK != rc) {
        tb_eng_peer_fail(p, TB_CHAN_ELINK, tb_cm_strerror(rc));
    }
}

void tb_eng_peers_dial_waiting(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->npeers; ++i) {
        if (e->peers[i]->want_dial) {
            tb_eng_peer_dial(e->peers[i]);
        }
    }
}

/* A Diffie-Hellman for a caller no rank of this host named yet: at most
 * ENG_DH_BURST at once and one more every ENG_DH_EVERY_NS.  One costs most
 * of a millisecond and comes before the caller proves anything, so made-up
 * identities get a few percent of the loop at most.  A real engine refused
 * for it calls again (ENG_DIAL_TRIES), and is called once a rank here names
 * one of its ranks: a flood can delay a setup, not make up an engine. */
bool tb_eng_dh_allowed(tb_engine_t *e, uint64_t now)
{
    uint64_t earned = now > e->dh_refill_ns ? (now - e->dh_refill_ns) / ENG_DH_EVERY_NS : 0;

    if (e->dh_tokens + earned >= ENG_DH_BURST) {
        e->dh_tokens = ENG_DH_BURST;
        e->dh_refill_ns = now;
    } else if (earned) {
        e->dh_tokens += (unsigned) earned;
        e->dh_refill_ns += earned * ENG_DH_EVERY_NS; /* the part interval stays earned */
    }
    if (0 == e->dh_tokens) {
        return false;
    }
    e->dh_tokens--;
    return true;
}

/* The pair secret already worked out with engine id, over any cable, and
 * whether a rank of this host named it (over any cable): the secret is the
 * engines', not the cable's. */
static const uint8_t *pair_secret_known(tb_engine_t *e, const uint8_t *id, bool *named)
{
    const uint8_t *found = NULL;

    *named = false;
    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        if (0 == memcmp(p->id, id, sizeof(p->id))) {
            *named = true;
            if (p->have_pair) {
                found = p->pair_secret;
            }
        }
    }
    return found;
}

/* What this engine shares with engine peer_id alone: their Diffie-Hellman
 * secret (the engine id is its public key), bound to this job by its key.
 * Knowing the job's key or anything the job published is not enough to
 * pose as an engine; a member of the job once could, with the key alone.
 * Computed once per engine this host's ranks named. */
int tb_eng_cm_peer_secret(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret)
{
    static const char label[] = "tbrdma engine pair key";
    eng_dev_t *d = ctx;
    tb_engine_t *e = d->e;
    const uint8_t *known;
    uint8_t z[TB_X25519_SIZE];
    tb_hmac_t h;
    bool named;

    if (TB_WIRE_ENGINE_ID_SIZE != id_len || !e->have_key) {
        return -1;
    }
    known = pair_secret_known(e, peer_id, &named);
    if (known) {
        memcpy(secret, known, TB_WIRE_SECRET_SIZE);
        return 0;
    }
    if (!named && !tb_eng_dh_allowed(e, tb_now_ns())) {
        return TB_CM_SECRET_BUSY;
    }
    if (0 != tb_x25519_shared(z, e->id_priv, peer_id)) {
        return -1;
    }
    tb_hmac_init(&h, e->job_key, sizeof(e->job_key));
    tb_hmac_update(&h, label, sizeof(label));
    tb_hmac_update(&h, z, sizeof(z));
    tb_hmac_final(&h, secret);
    tb_mem_wipe(z, sizeof(z));
    tb_mem_wipe(&h, sizeof(h));
    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        if (0 == memcmp(p->id, peer_id, sizeof(p->id))) {
            memcpy(p->pair_secret, secret, TB_WIRE_SECRET_SIZE);
            p->have_pair = true;
        }
    }
    return 0;
}

static int cm_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                     tb_wire_addr_t *local, void **user)
{
    eng_dev_t *d = ctx;
    eng_peer_t *p;

    if (TB_WIRE_ENGINE_ID_SIZE != id_len) {
        return -1;
    }
    p = tb_eng_peer_for(d->e, d->idx, peer_id, true);
    if (NULL == p || (p->known && 0 != memcmp(peer->gid, p->gid, sizeof(p->gid)))) {
        return -1;
    }
    /* A peer not set up yet, or one whose failed cable is tried again. */
    if (ENG_PEER_IDLE == p->state ? 0 != tb_eng_peer_make_conn(p) : !tb_eng_back_accept(p)) {
        return -1;
    }
    tb_conn_local_addr(p->conn, local);
    *user = p;
    return 0;
}

static void cm_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer,
                    const char *why)
{
    eng_peer_t *p = user;
    int rc;

    (void) ctx;
    if (tb_eng_back_setup_done(p, status, peer, why)) {
        return;
    }
    if (TB_CM_OK != status) {
        if (p->dial_tries < ENG_DIAL_TRIES && ENG_PEER_CONNECTING == p->state) {
            /* Not set up yet, not failed: start over in a moment (or when
             * the other engine calls). */
            uint64_t wait = 50000000ull * (p->dial_tries + 1);
            TB_INFO("connection setup to engine %02x%02x%02x%02x failed (%s); trying again",
                    p->id[0], p->id[1], p->id[2], p->id[3], why);
            p->dial_tries++;
            tb_eng_peer_drop_conn(p);
            p->state = ENG_PEER_IDLE;
            p->redial_at = tb_now_ns() + (wait < 500000000ull ? wait : 500000000ull);
            return;
        }
        tb_eng_peer_fail(p, TB_CHAN_ELINK, why);
        return;
    }
    if (p->known && 0 != memcmp(peer->gid, p->gid, sizeof(p->gid))) {
        tb_eng_peer_fail(p, TB_CHAN_EPROTO, "its queue-pair address is not on the device it published");
        return;
    }
    rc = tb_conn_connect(p->conn, peer, tb_now_ns());
    if (TB_CHAN_OK != rc) {
        tb_eng_peer_fail(p, rc, tb_channel_strerror(rc));
        return;
    }
    p->state = ENG_PEER_CONNECTED;
    p->credit_changed = true;
    p->ret_pending = true;
    TB_INFO("connected to engine %02x%02x%02x%02x over %s", p->id[0], p->id[1], p->id[2],
            p->id[3], p->e->devs[p->dev].dev->name);
}
