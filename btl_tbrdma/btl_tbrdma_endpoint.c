/*
 * tbrdma BTL: endpoints (one per peer process reachable over a module's
 * cable) and their connections.
 *
 * Connections are made lazily on the first send: the endpoint creates its
 * reliable channel at once (sends queue in it) and asks the peer's
 * connection manager (tb_cm, a TCP port on the cable's address published in
 * the modex) for the peer's half; tb_cm settles two processes asking each
 * other at once.  A channel that fails (peer dead, cable cut) fails its
 * endpoint: pending operations complete with an error and ob1 is told,
 * naming the peer and the cable.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"
#include "tb_clock.h"

#include "opal/util/show_help.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void endpoint_construct(mca_btl_base_endpoint_t *ep)
{
    OBJ_CONSTRUCT(&ep->rma_pending, opal_list_t);
    OBJ_CONSTRUCT(&ep->rma_deferred, opal_list_t);
    OBJ_CONSTRUCT(&ep->rma_unsent, opal_list_t);
    ep->conn = NULL;
    ep->state = TBRDMA_EP_IDLE;
    ep->next_rma_id = 1;
    ep->route = 0;
    ep->route_sent = false;
    ep->routed = false;
    memset(ep->peer_engine, 0, sizeof(ep->peer_engine));
    ep->peer_pid = 0;
    ep->loop = false;
    ep->rma_split = 0;
    ep->split_said = false;
    ep->away_failed = false;
    ep->away_why[0] = '\0';
}

static void endpoint_destruct(mca_btl_base_endpoint_t *ep)
{
    OBJ_DESTRUCT(&ep->rma_pending);
    OBJ_DESTRUCT(&ep->rma_deferred);
    OBJ_DESTRUCT(&ep->rma_unsent);
}

OBJ_CLASS_INSTANCE(mca_btl_base_endpoint_t, opal_list_item_t, endpoint_construct,
                   endpoint_destruct);

uint64_t mca_btl_tbrdma_now_ns(void)
{
    return tb_now_ns();
}

static uint64_t name_key(const opal_process_name_t *name)
{
    uint64_t key;

    memcpy(&key, name, sizeof(key));
    return key;
}

static void cable_string(const mca_btl_base_endpoint_t *ep, char *buf, size_t len)
{
    char mine[INET_ADDRSTRLEN], theirs[INET_ADDRSTRLEN];

    inet_ntop(AF_INET, &ep->device->ipv4, mine, sizeof(mine));
    inet_ntop(AF_INET, &ep->peer_ipv4, theirs, sizeof(theirs));
    snprintf(buf, len, "%s (%s, %s) to %s", ep->device->name, ep->device->netdev, mine, theirs);
}

/* The peer or the cable is gone.  Everything pending on the endpoint ends
 * with an error at once (sends still queued in a channel that never
 * connected included), and ob1 learns it so the job stops with a clear
 * reason instead of hanging. */
void mca_btl_tbrdma_endpoint_fail(mca_btl_base_endpoint_t *ep, const char *why)
{
    mca_btl_tbrdma_module_t *module = ep->module;
    char cable[160], info[512];
    struct timespec now;

    if (TBRDMA_EP_FAILED == ep->state) {
        return;
    }
    if (mca_btl_tbrdma_away()) {
        mca_btl_tbrdma_held_fail(ep, why);
        return;
    }
    ep->state = TBRDMA_EP_FAILED;
    cable_string(ep, cable, sizeof(cable));
    /* Straight to the output with the time it happened (show_help's
     * aggregation may delay its message by seconds): when a peer learned. */
    clock_gettime(CLOCK_REALTIME, &now);
    BTL_TBRDMA_VERBOSE(10, "lost %s at %lld.%03ld: %s", opal_get_proc_hostname(ep->proc),
                       (long long) now.tv_sec, now.tv_nsec / 1000000, why);
    mca_btl_tbrdma_show_help(mca_btl_tbrdma_component.use_engine ? "peer failed engine"
                                                                 : "peer failed",
                             opal_process_info.nodename,
                             opal_get_proc_hostname(ep->proc), cable, why);
    if (module->cm) {
        tb_cm_cancel(module->cm, ep);
    }
    if (ep->conn) {
        tb_channel_abort(tb_conn_channel(ep->conn), TB_CHAN_ECANCELED, why);
    }
    mca_btl_tbrdma_rma_fail_pending(ep, OPAL_ERR_UNREACH);
    if (module->error_cb) {
        snprintf(info, sizeof(info), "tbrdma: lost %s over cable %s: %s",
                 opal_get_proc_hostname(ep->proc), cable, why);
        module->error_cb(&module->super, MCA_BTL_ERROR_FLAGS_FATAL, ep->proc, info);
    }
}

/* While the keeper runs, what would reach ob1 or osc is held for the
 * application's thread; a peer's put, get or atomic is served at once. */
static void chan_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    if (mca_btl_tbrdma_away() && !tb_rma_is_request(tag)) {
        mca_btl_tbrdma_held_recv(ctx, tag, data, len);
        return;
    }
    mca_btl_tbrdma_deliver(ctx, tag, data, len);
}

static void *chan_recv_place(void *ctx, uint8_t tag, size_t len, const void *head,
                             size_t head_len, size_t *skip)
{
    if (mca_btl_tbrdma_away()) {
        return NULL; /* assembled by the channel, then held whole */
    }
    return mca_btl_tbrdma_rma_place(ctx, tag, len, head, head_len, skip);
}

static void chan_recv_placed(void *ctx, uint8_t tag, const void *head, size_t skip, size_t len)
{
    if (mca_btl_tbrdma_away()) {
        mca_btl_tbrdma_held_placed(ctx, tag, head, skip, len);
        return;
    }
    mca_btl_tbrdma_rma_placed(ctx, tag, head, skip, len);
}

static void chan_send_done(void *ctx, void *cookie, int status)
{
    mca_btl_tbrdma_cookie_t *c = cookie;

    /* A reply's end concerns nobody but this component. */
    if (mca_btl_tbrdma_away() && TBRDMA_COOKIE_REPLY != c->kind) {
        mca_btl_tbrdma_held_send_done(ctx, c, status);
        return;
    }
    mca_btl_tbrdma_send_done(ctx, cookie, status);
}

static void chan_error(void *ctx, int status, const char *why)
{
    mca_btl_tbrdma_endpoint_fail(ctx, why);
}

/* Create the endpoint's connection (QPs, registered slots, channel). */
static int endpoint_make_conn(mca_btl_base_endpoint_t *ep)
{
    tb_channel_callbacks_t cb = {
        .ctx = ep,
        .recv = chan_recv,
        .recv_place = chan_recv_place,
        .recv_placed = chan_recv_placed,
        .send_done = chan_send_done,
        .error = chan_error,
    };
    tb_channel_params_t params;
    char cable[160];
    int rc;

    tb_tunables_channel_params(&mca_btl_tbrdma_component.tunables, &params);
    /* What this side agreed to receive bounds what a peer can make it
     * allocate for one message. */
    params.max_msg_size = TBRDMA_MAX_MSG;
    rc = tb_conn_create(ep->module->domain, &params, &cb, &ep->conn);
    if (0 != rc) {
        cable_string(ep, cable, sizeof(cable));
        mca_btl_tbrdma_show_help("connection failed", opal_process_info.nodename,
                                 opal_get_proc_hostname(ep->proc), cable,
                                 -EBUSY == rc ? "the device's queue-pair budget is used up "
                                                "(btl_tbrdma_qps_per_device, btl_tbrdma_lanes)"
                                              : strerror(-rc));
        ep->conn = NULL;
        ep->state = TBRDMA_EP_FAILED;
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    ep->state = TBRDMA_EP_CONNECTING;
    return OPAL_SUCCESS;
}

static int endpoint_start_connect(mca_btl_base_endpoint_t *ep)
{
    tb_wire_addr_t local;
    char ip[INET_ADDRSTRLEN];
    int rc;

    rc = endpoint_make_conn(ep);
    if (OPAL_SUCCESS != rc) {
        return rc;
    }
    tb_conn_local_addr(ep->conn, &local);
    inet_ntop(AF_INET, &ep->peer_ipv4, ip, sizeof(ip));
    rc = tb_cm_connect(ep->module->cm, ip, ep->peer_cm_port, &ep->name, sizeof(ep->name), &local,
                       ep, mca_btl_tbrdma_now_ns());
    if (TB_CM_OK != rc) {
        mca_btl_tbrdma_endpoint_fail(ep, tb_cm_strerror(rc));
        return OPAL_ERR_UNREACH;
    }
    BTL_TBRDMA_VERBOSE(20, "connecting to %s at %s:%u over %s", opal_get_proc_hostname(ep->proc),
                       ip, (unsigned) ep->peer_cm_port, ep->module->device->name);
    return OPAL_SUCCESS;
}

int mca_btl_tbrdma_endpoint_send(mca_btl_base_endpoint_t *endpoint, uint8_t tag,
                                 const struct iovec *iov, int iovcnt, void *cookie)
{
    int rc;

    if (TBRDMA_EP_FAILED == endpoint->state) {
        return OPAL_ERR_UNREACH;
    }
    if (endpoint->loop) {
        return mca_btl_tbrdma_loop_send(endpoint, tag, iov, iovcnt, cookie);
    }
    if (mca_btl_tbrdma_component.use_engine) {
        return mca_btl_tbrdma_engine_send(endpoint, tag, iov, iovcnt, cookie);
    }
    if (NULL == endpoint->conn) {
        rc = endpoint_start_connect(endpoint);
        if (OPAL_SUCCESS != rc) {
            return rc;
        }
    }
    rc = tb_channel_sendv(tb_conn_channel(endpoint->conn), tag, iov, iovcnt, cookie);
    switch (rc) {
    case TB_CHAN_OK:
        return OPAL_SUCCESS;
    case TB_CHAN_ENOMEM:
    case TB_CHAN_EAGAIN: /* the peer is not keeping up: ob1 retries later */
        return OPAL_ERR_OUT_OF_RESOURCE;
    case TB_CHAN_EMSGSIZE:
    case TB_CHAN_EINVAL:
        return OPAL_ERR_BAD_PARAM;
    default:
        return OPAL_ERR_UNREACH;
    }
}

mca_btl_base_endpoint_t *mca_btl_tbrdma_endpoint_create(mca_btl_tbrdma_module_t *module,
                                                        tb_device_t *device, opal_proc_t *proc,
                                                        const tb_wire_modex_t *peer_mx,
                                                        const tb_wire_modex_dev_t *peer_dev)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_endpoint_t *ep;

    if (c->use_engine && c->next_route >= TBRDMA_ENGINE_MAX_ROUTES) {
        opal_output(0, "btl:tbrdma on %s: more than %d peers through the engine; %s is left to "
                    "other transports", opal_process_info.nodename, TBRDMA_ENGINE_MAX_ROUTES,
                    opal_get_proc_hostname(proc));
        return NULL;
    }
    ep = OBJ_NEW(mca_btl_base_endpoint_t);
    if (NULL == ep) {
        return NULL;
    }
    if (c->use_engine) {
        ep->route = (uint16_t) c->next_route++;
        memcpy(ep->peer_engine, peer_mx->engine_id, sizeof(ep->peer_engine));
        ep->peer_pid = tb_wire_le32(peer_mx->pid);
    }
    ep->module = module;
    ep->device = device;
    ep->proc = proc;
    ep->name = proc->proc_name;
    ep->peer_ipv4.s_addr = peer_dev->ipv4;
    ep->peer_cm_port = tb_wire_le16(peer_dev->cm_port);
    memcpy(ep->peer_gid, peer_dev->gid, sizeof(ep->peer_gid));
    opal_list_append(&module->endpoints, &ep->super);
    opal_hash_table_set_value_uint64(&module->endpoint_by_name, name_key(&ep->name), ep);
    return ep;
}

void mca_btl_tbrdma_endpoint_release(mca_btl_base_endpoint_t *ep)
{
    mca_btl_tbrdma_module_t *module = ep->module;

    if (module->cm) {
        tb_cm_cancel(module->cm, ep);
    }
    if (ep->conn) {
        const tb_channel_counters_t *k = tb_channel_counters(tb_conn_channel(ep->conn));
        /* What the link carried, for tuning and for a profile's per-message counts. */
        BTL_TBRDMA_VERBOSE(20,
                           "%s to %s: %llu messages sent, %llu received; frames %llu sent "
                           "(%llu data, %llu control, %llu retransmitted), %llu received; "
                           "%llu credit stalls, %llu timeouts, %llu bad checksums",
                           module->device->name, OPAL_NAME_PRINT(ep->name),
                           (unsigned long long) k->msgs_sent, (unsigned long long) k->msgs_received,
                           (unsigned long long) k->frames_sent,
                           (unsigned long long) k->data_frames_sent,
                           (unsigned long long) k->ctrl_frames_sent,
                           (unsigned long long) k->retransmits,
                           (unsigned long long) k->frames_received,
                           (unsigned long long) k->credit_stalls, (unsigned long long) k->timeouts,
                           (unsigned long long) k->bad_checksum);
        tb_conn_destroy(ep->conn);
        ep->conn = NULL;
    }
    mca_btl_tbrdma_held_forget(ep);
    if (ep->loop) {
        mca_btl_tbrdma_loop_forget(ep);
    } else if (mca_btl_tbrdma_component.engine) {
        mca_btl_tbrdma_engine_forget(ep);
    }
    mca_btl_tbrdma_rma_fail_pending(ep, OPAL_ERR_UNREACH);
    mca_btl_tbrdma_rma_forget_replies(ep);
    opal_hash_table_remove_value_uint64(&module->endpoint_by_name, name_key(&ep->name));
    opal_list_remove_item(&module->endpoints, &ep->super);
    OBJ_RELEASE(ep);
}

/* The secret a process of this job published.  Identities come from the
 * network: one outside the job is refused before anything is looked up or
 * created for it (a flood of made-up names must not grow the proc table). */
static int cm_peer_secret(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    opal_process_name_t name;
    tb_wire_modex_t *mx = NULL;
    size_t size = 0;
    int rc;

    (void) ctx;
    if (sizeof(name) != id_len) {
        return -1;
    }
    memcpy(&name, peer_id, sizeof(name));
    if (name.jobid != OPAL_PROC_MY_NAME.jobid || (0 != c->job_size && name.vpid >= c->job_size)) {
        return -1;
    }
    OPAL_MODEX_RECV(rc, &c->super.btl_version, &name, (void **) &mx, &size);
    if (OPAL_SUCCESS != rc || NULL == mx) {
        return -1;
    }
    rc = tb_modex_check(mx, size, NULL);
    if (0 == rc) {
        memcpy(secret, mx->cm_secret, TB_WIRE_SECRET_SIZE);
    }
    free(mx);
    return rc;
}

/* The peer's blob names the device its modex entry published for this
 * cable, or it is not the peer's. */
static bool blob_matches_modex(const mca_btl_base_endpoint_t *ep, const tb_wire_addr_t *peer)
{
    return 0 == memcmp(peer->gid, ep->peer_gid, sizeof(ep->peer_gid));
}

/* A peer of the job (the connection manager checked) asks for a connection
 * over this module's cable. */
static int cm_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                     tb_wire_addr_t *local, void **user)
{
    mca_btl_tbrdma_module_t *module = ctx;
    mca_btl_base_endpoint_t *ep;
    opal_process_name_t name;
    opal_proc_t *proc;

    if (sizeof(name) != id_len) {
        return -1;
    }
    memcpy(&name, peer_id, sizeof(name));
    /* ob1 may add a peer only when it first sends to it, so a peer can
     * reach this process before that: its endpoint is made here. */
    proc = opal_proc_for_name(name);
    ep = proc ? mca_btl_tbrdma_module_endpoint_for(module, proc) : NULL;
    if (NULL == ep) {
        BTL_TBRDMA_VERBOSE(10, "%s: refused a connection from %s: not a peer over this cable",
                           module->device->name, OPAL_NAME_PRINT(name));
        return -1;
    }
    if (!blob_matches_modex(ep, peer)) {
        opal_output(0, "btl:tbrdma on %s: refused a connection from %s over %s: its queue-pair "
                    "address is not on the device it published",
                    opal_process_info.nodename, OPAL_NAME_PRINT(name), module->device->name);
        return -1;
    }
    if (NULL != ep->conn || TBRDMA_EP_FAILED == ep->state
        || OPAL_SUCCESS != endpoint_make_conn(ep)) {
        return -1;
    }
    tb_conn_local_addr(ep->conn, local);
    *user = ep;
    return 0;
}

static void cm_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer, const char *why)
{
    mca_btl_base_endpoint_t *ep = user;
    int rc;

    if (TB_CM_OK != status) {
        mca_btl_tbrdma_endpoint_fail(ep, why);
        return;
    }
    if (!blob_matches_modex(ep, peer)) {
        mca_btl_tbrdma_endpoint_fail(ep, "the peer's queue-pair address is not on the device it "
                                         "published");
        return;
    }
    rc = tb_conn_connect(ep->conn, peer, mca_btl_tbrdma_now_ns());
    if (TB_CHAN_OK != rc) {
        mca_btl_tbrdma_endpoint_fail(ep, tb_channel_strerror(rc));
        return;
    }
    ep->state = TBRDMA_EP_CONNECTED;
    BTL_TBRDMA_VERBOSE(20, "connected to %s over %s", opal_get_proc_hostname(ep->proc),
                       ep->module->device->name);
}

int mca_btl_tbrdma_module_start(mca_btl_tbrdma_module_t *module, char *err, size_t errlen)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tb_cm_callbacks_t cb = {
        .ctx = module, .peer_secret = cm_peer_secret, .accept = cm_accept, .done = cm_done};
    opal_process_name_t *me = &opal_proc_local_get()->proc_name;
    tb_domain_params_t dp;
    tb_cm_params_t cp;
    char ip[INET_ADDRSTRLEN];
    int rc;

    OBJ_CONSTRUCT(&module->endpoints, opal_list_t);
    OBJ_CONSTRUCT(&module->endpoint_by_name, opal_hash_table_t);
    rc = opal_hash_table_init(&module->endpoint_by_name, 64);
    if (OPAL_SUCCESS != rc) {
        snprintf(err, errlen, "out of memory");
        goto destruct;
    }
    if (c->use_engine) {
        /* The engine owns the device and listens for connections. */
        module->domain = NULL;
        module->cm = NULL;
        module->cm_port = module->host ? 0 : mca_btl_tbrdma_engine_port(module->index);
        return OPAL_SUCCESS;
    }
    tb_domain_params_default(&dp);
    dp.qp_budget = c->tunables.qps_per_device;
    rc = tb_domain_create(&c->devices.verbs, module->device, &dp, &module->domain);
    if (0 != rc) {
        snprintf(err, errlen, "cannot open %s for traffic: %s (details above)",
                 module->device->name, strerror(-rc));
        goto destruct;
    }
    inet_ntop(AF_INET, &module->device->ipv4, ip, sizeof(ip));
    memset(&cp, 0, sizeof(cp));
    cp.bind_ip = ip;
    cp.bind_netdev = module->device->netdev;
    cp.id = me;
    cp.id_len = sizeof(*me);
    cp.secret = c->cm_secret;
    /* TCP's own resends of a lost SYN take seconds on a lossy cable. */
    cp.timeout_ns = tb_tunables_stall_timeout_ns(&c->tunables);
    cp.max_sessions = 256;
    rc = tb_cm_create(&cp, &cb, &module->cm);
    if (TB_CM_OK != rc) {
        snprintf(err, errlen, "cannot listen for connections on %s (%s): %s", ip,
                 module->device->name, tb_cm_strerror(rc));
        goto domain;
    }
    module->cm_port = tb_cm_port(module->cm);
    return OPAL_SUCCESS;

domain:
    tb_domain_destroy(module->domain);
    module->domain = NULL;
destruct:
    OBJ_DESTRUCT(&module->endpoint_by_name);
    OBJ_DESTRUCT(&module->endpoints);
    return OPAL_ERROR;
}

void mca_btl_tbrdma_module_stop(mca_btl_tbrdma_module_t *module)
{
    mca_btl_base_endpoint_t *ep, *next;

    OPAL_LIST_FOREACH_SAFE (ep, next, &module->endpoints, mca_btl_base_endpoint_t) {
        mca_btl_tbrdma_endpoint_release(ep);
    }
    if (module->cm) {
        tb_cm_destroy(module->cm);
    }
    if (module->domain) {
        tb_domain_destroy(module->domain);
    }
    OBJ_DESTRUCT(&module->endpoint_by_name);
    OBJ_DESTRUCT(&module->endpoints);
}

/* Put/get housekeeping, every 100 ms: replies that waited for the channel,
 * and answers that never come (a peer that drops them would keep a flush
 * waiting forever). */
static void rma_progress(mca_btl_tbrdma_module_t *module, uint64_t now, bool owner)
{
    mca_btl_base_endpoint_t *ep, *next;

    /* Requests waiting for room go out as soon as there is some (the
     * application's own: they wait for it while it is away). */
    if (owner && mca_btl_tbrdma_component.rma_unsent) {
        OPAL_LIST_FOREACH (ep, &module->endpoints, mca_btl_base_endpoint_t) {
            mca_btl_tbrdma_rma_post_unsent(ep);
        }
    }
    if (now - module->last_rma_check_ns < 100000000ull) {
        return;
    }
    module->last_rma_check_ns = now;
    OPAL_LIST_FOREACH_SAFE (ep, next, &module->endpoints, mca_btl_base_endpoint_t) {
        const char *why = mca_btl_tbrdma_rma_progress(ep, now);
        if (NULL != why) {
            mca_btl_tbrdma_endpoint_fail(ep, why);
        }
    }
}

/* owner: the application's own progress, else the keeper's (see rma_progress). */
static int module_progress(mca_btl_tbrdma_module_t *module, uint64_t now, bool owner)
{
    int n, m;

    if (NULL == module->domain) {
        rma_progress(module, now, owner);
        return 0;
    }
    n = tb_cm_progress(module->cm, now);
    m = tb_domain_progress(module->domain, now);
    rma_progress(module, now, owner);
    return n + (m > 0 ? m : 0);
}

int mca_btl_tbrdma_module_progress(mca_btl_tbrdma_module_t *module, uint64_t now)
{
    return module_progress(module, now, true);
}

void mca_btl_tbrdma_module_keep(mca_btl_tbrdma_module_t *module, uint64_t now)
{
    (void) module_progress(module, now, false);
}
