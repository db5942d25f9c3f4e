/*
 * tbrdma BTL: the path through the host engine (engine/daemon/tb_engine.h).
 *
 * With more ranks on a host than the devices' queue pairs can serve one
 * connection each, the ranks leave the devices to one engine per host and
 * job, started by the first of them.  A rank then sends by copying into its
 * ring to the engine (complete at once, reported from progress as ob1
 * expects), and receives whole messages from the other ring, tagged with the
 * source rank and the engine link they came through.  Everything above the
 * endpoint (descriptors, put/get emulation and its checks at the target)
 * stays the same.
 *
 * Liveness is the engines' business: they keep the links alive whatever the
 * ranks do, and report a dead rank, engine or cable as records, which fail
 * the endpoints concerned.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include "opal/util/show_help.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tb_sha256.h"

/* The options the engine takes from this process's parameters. */
static char **engine_args(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    const tb_tunables_t *t = &c->tunables;
    char **a = calloc(40, sizeof(*a));
    int n = 0;

    if (NULL == a) {
        return NULL;
    }
#define ARG(name, fmt, value)                                   \
    do {                                                        \
        a[n++] = strdup(name);                                  \
        if (asprintf(&a[n], fmt, value) < 0) {                  \
            a[n] = NULL;                                        \
        }                                                       \
        n++;                                                    \
    } while (0)
    if (t->verbs_library[0]) {
        ARG("--verbs-library", "%s", t->verbs_library);
    }
    if (t->if_include[0]) {
        ARG("--if-include", "%s", t->if_include);
    }
    if (t->if_exclude[0]) {
        ARG("--if-exclude", "%s", t->if_exclude);
    }
    ARG("--lanes", "%d", t->lanes);
    ARG("--small-frame-size", "%u", (unsigned) t->small_frame_size);
    ARG("--bulk-frame-size", "%u", (unsigned) t->bulk_frame_size);
    ARG("--recv-depth", "%d", t->recv_depth);
    ARG("--peer-timeout-ms", "%u", (unsigned) c->engine_peer_timeout_ms);
    ARG("--rto-min-us", "%u", (unsigned) t->rto_min_us);
    ARG("--checksum", "%s", tb_checksum_mode_name(t->checksum));
    ARG("--credit-window", "%u", (unsigned) c->engine_credit_window);
    ARG("--spin-us", "%u", (unsigned) c->engine_spin_us);
    ARG("--events", "%d", c->engine_events ? 1 : 0);
    ARG("--yield", "%d", c->engine_yield ? 1 : 0);
    ARG("--verbose", "%d", c->engine_verbose);
#undef ARG
    for (int i = 0; i < n; ++i) {
        if (NULL == a[i]) {
            for (int j = 0; j < n; ++j) {
                free(a[j]);
            }
            free(a);
            return NULL;
        }
    }
    return a;
}

static void free_args(char **a)
{
    for (int i = 0; a && a[i]; ++i) {
        free(a[i]);
    }
    free(a);
}

/* The job's name for its directory on this host.  Its 32-bit jobid alone
 * can be the same for two jobs of one user (Open MPI hashes the launcher's
 * identity into it), and two jobs must never share an engine, its key and
 * its rings: the job's session directory, which the launcher makes per job
 * and host (its pid in the path), tells them apart. */
static void job_name(char *job, size_t len)
{
    const char *session = opal_process_info.job_session_dir ? opal_process_info.job_session_dir
                                                            : "";
    uint8_t h[TB_SHA256_SIZE];
    tb_sha256_t s;

    tb_sha256_init(&s);
    tb_sha256_update(&s, session, strlen(session));
    tb_sha256_final(&s, h);
    snprintf(job, len, "%08x%02x%02x%02x%02x", (unsigned) OPAL_PROC_MY_NAME.jobid, h[0], h[1],
             h[2], h[3]);
}

int mca_btl_tbrdma_engine_start(char *err, size_t errlen)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    const tb_wire_eattach_reply_t *info;
    tb_eclient_params_t p;
    char job[32], **args = engine_args();
    int rc;

    if (NULL == args) {
        snprintf(err, errlen, "out of memory");
        return TB_ECLIENT_ERROR;
    }
    job_name(job, sizeof(job));
    memset(&p, 0, sizeof(p));
    p.tmpdir = getenv("TMPDIR");
    p.job = job;
    p.host = opal_process_info.nodename;
    p.vpid = OPAL_PROC_MY_NAME.vpid;
    p.ring_size = (uint64_t) c->engine_ring_size;
    p.engine_path = c->engine_path;
    p.engine_args = args;
    p.timeout_ns = 30000000000ull;
    rc = tb_eclient_attach(&p, &c->engine, err, errlen);
    free_args(args);
    if (TB_ECLIENT_OK != rc) {
        return rc;
    }
    /* The engine's devices stand for this process's own. */
    info = tb_eclient_info(c->engine);
    c->devices.devices = calloc(info->ndevices, sizeof(tb_device_t));
    if (NULL == c->devices.devices) {
        snprintf(err, errlen, "out of memory");
        tb_eclient_detach(c->engine);
        c->engine = NULL;
        return TB_ECLIENT_ERROR;
    }
    c->devices.count = info->ndevices;
    for (int i = 0; i < info->ndevices; ++i) {
        tb_device_t *d = &c->devices.devices[i];
        snprintf(d->name, sizeof(d->name), "%s", info->devices[i].name);
        snprintf(d->netdev, sizeof(d->netdev), "%s", info->devices[i].netdev);
        d->usable = true;
        d->ipv4.s_addr = info->devices[i].ipv4;
        d->netmask.s_addr = info->devices[i].netmask;
        memcpy(d->gid.raw, info->devices[i].gid, sizeof(d->gid.raw));
    }
    memcpy(c->engine_id, info->engine_id, sizeof(c->engine_id));
    c->engine_pid_of_me = tb_wire_le32(info->rank_pid);
    BTL_TBRDMA_VERBOSE(10, "attached to the host engine (pid %u, %d device%s, directory %s)",
                       (unsigned) tb_wire_le32(info->engine_pid), info->ndevices,
                       info->ndevices == 1 ? "" : "s", tb_eclient_dir(c->engine));
    return TB_ECLIENT_OK;
}

uint16_t mca_btl_tbrdma_engine_port(int index)
{
    return tb_wire_le16(tb_eclient_info(mca_btl_tbrdma_component.engine)->devices[index].cm_port);
}

void mca_btl_tbrdma_engine_stop(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    tb_eclient_detach(c->engine);
    c->engine = NULL;
    mca_btl_tbrdma_route_fini();
    free(c->completions);
    c->completions = NULL;
    c->ncompletions = c->completions_cap = 0;
}

/* The engines' shared key: derived from the secret the job's first process
 * published, which only the job's processes can read.  Given as soon as the
 * modex is complete (add_procs), so an engine can prove itself to, and
 * verify, the engines that call it before its own ranks send anything. */
int mca_btl_tbrdma_engine_send_job_key(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    static const char label[] = "tbrdma engine job key";
    opal_process_name_t first = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = 0};
    tb_wire_modex_t *mx = NULL;
    uint8_t key[TB_SHA256_SIZE];
    tb_hmac_t h;
    size_t size = 0;
    int rc;

    OPAL_MODEX_RECV(rc, &c->super.btl_version, &first, (void **) &mx, &size);
    if (OPAL_SUCCESS != rc || NULL == mx || 0 != tb_modex_check(mx, size, NULL)) {
        free(mx);
        return OPAL_ERR_UNREACH;
    }
    tb_hmac_init(&h, mx->cm_secret, sizeof(mx->cm_secret));
    tb_hmac_update(&h, label, sizeof(label));
    tb_hmac_final(&h, key);
    free(mx);
    rc = tb_eclient_jobkey(c->engine, key);
    memset(key, 0, sizeof(key));
    if (0 != rc) {
        return -EAGAIN == rc ? OPAL_ERR_OUT_OF_RESOURCE : OPAL_ERR_UNREACH;
    }
    c->engine_key_sent = true;
    return OPAL_SUCCESS;
}

/* Tell the engine where the endpoint's peer is, once. */
static int ensure_route(mca_btl_base_endpoint_t *ep)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tb_wire_eroute_t rt;
    int rc;

    if (ep->route_sent) {
        return OPAL_SUCCESS;
    }
    if (!c->engine_key_sent) {
        rc = mca_btl_tbrdma_engine_send_job_key();
        if (OPAL_SUCCESS != rc) {
            if (OPAL_ERR_UNREACH == rc) {
                mca_btl_tbrdma_endpoint_fail(ep, "the job's first process published no tbrdma "
                                                 "entry, from which the engines' key comes");
            }
            return rc;
        }
    }
    if (ep->routed && !c->hosts_sent) {
        rc = mca_btl_tbrdma_route_init();
        if (OPAL_SUCCESS != rc) {
            return rc;
        }
    }
    memset(&rt, 0, sizeof(rt));
    rt.dev = (uint8_t) (ep->device - c->devices.devices);
    rt.flags = ep->module->host ? TB_EROUTE_F_HOST : 0;
    if (ep->routed) {
        rt.flags |= TB_EROUTE_F_ROUTED;
    } else {
        rt.ipv4 = ep->peer_ipv4.s_addr;
        rt.cm_port = tb_wire_le16(ep->peer_cm_port);
        memcpy(rt.gid, ep->peer_gid, sizeof(rt.gid));
    }
    memcpy(rt.engine_id, ep->peer_engine, sizeof(rt.engine_id));
    rc = tb_eclient_route(c->engine, ep->route, &rt);
    if (0 != rc) {
        return -EAGAIN == rc ? OPAL_ERR_OUT_OF_RESOURCE : OPAL_ERR_UNREACH;
    }
    ep->route_sent = true;
    ep->state = TBRDMA_EP_CONNECTED;
    return OPAL_SUCCESS;
}

static int push_completion(mca_btl_base_endpoint_t *ep, void *cookie)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    if (c->ncompletions == c->completions_cap) {
        size_t cap = c->completions_cap ? 2 * c->completions_cap : 64;
        void *q = realloc(c->completions, cap * sizeof(*c->completions));
        if (NULL == q) {
            return OPAL_ERR_OUT_OF_RESOURCE;
        }
        c->completions = q;
        c->completions_cap = cap;
    }
    c->completions[c->ncompletions].ep = ep;
    c->completions[c->ncompletions].cookie = cookie;
    c->ncompletions++;
    return OPAL_SUCCESS;
}

int mca_btl_tbrdma_engine_send(mca_btl_base_endpoint_t *ep, uint8_t tag, const struct iovec *iov,
                               int iovcnt, void *cookie)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    int rc;

    rc = ensure_route(ep);
    if (OPAL_SUCCESS != rc) {
        return rc;
    }
    /* Room for the completion first: once in the ring, the send is done. */
    rc = push_completion(ep, cookie);
    if (OPAL_SUCCESS != rc) {
        return rc;
    }
    rc = tb_eclient_sendv(c->engine, ep->route, ep->name.vpid, ep->peer_pid, tag, iov, iovcnt);
    if (0 != rc) {
        c->ncompletions--;
    }
    switch (rc) {
    case 0:
        return OPAL_SUCCESS;
    case -EAGAIN:
        return OPAL_ERR_OUT_OF_RESOURCE;
    case -EMSGSIZE:
        return OPAL_ERR_BAD_PARAM;
    default:
        return OPAL_ERR_UNREACH;
    }
}

void *mca_btl_tbrdma_engine_send_begin(mca_btl_base_endpoint_t *ep, uint8_t tag, size_t len)
{
    if (OPAL_SUCCESS != ensure_route(ep)) {
        return NULL;
    }
    return tb_eclient_send_begin(mca_btl_tbrdma_component.engine, ep->route, ep->name.vpid,
                                 ep->peer_pid, tag, len);
}

void mca_btl_tbrdma_engine_send_commit(void)
{
    tb_eclient_send_commit(mca_btl_tbrdma_component.engine);
}

void mca_btl_tbrdma_engine_send_cancel(void)
{
    tb_eclient_send_cancel(mca_btl_tbrdma_component.engine);
}

/* ---- from the engine ---------------------------------------------------- */

/* The engine behind link: a peer engine, or this host's own for its
 * local links (TB_ELINK_LOCAL + device).  Without TB_ELINK_HOST. */
static const uint8_t *engine_of_link(uint16_t link)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    return link >= TB_ELINK_LOCAL ? c->engine_id : c->links[link].engine_id;
}

/* The cable's module of link, or with host the host module (there is one
 * whenever the engine is used). */
static mca_btl_tbrdma_module_t *module_of_link(uint16_t link, bool host)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    int dev;

    if (link >= TB_ELINK_LOCAL) {
        dev = link - TB_ELINK_LOCAL;
    } else if (link >= TBRDMA_ENGINE_MAX_LINKS || !c->links[link].known) {
        return NULL;
    } else {
        dev = c->links[link].dev;
    }
    if (host) {
        return c->host_module;
    }
    for (int i = 0; i < c->num_modules; ++i) {
        if (!c->modules[i]->host && c->modules[i]->index == dev) {
            return c->modules[i];
        }
    }
    return NULL;
}

/* The endpoint of rank vpid behind link on module: the existing one, or
 * one made from its modex entry; its entry must name the engine of that
 * link. */
static mca_btl_base_endpoint_t *endpoint_of(mca_btl_tbrdma_module_t *module, uint16_t link,
                                            uint32_t vpid)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    opal_process_name_t name = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = vpid};
    mca_btl_base_endpoint_t *ep;
    opal_proc_t *proc;

    if (NULL == module || (0 != c->job_size && vpid >= c->job_size)) {
        return NULL;
    }
    ep = mca_btl_tbrdma_module_find_endpoint(module, &name);
    if (NULL == ep) {
        proc = opal_proc_for_name(name);
        ep = proc ? mca_btl_tbrdma_module_endpoint_for(module, proc) : NULL;
    }
    if (NULL == ep || 0 != memcmp(ep->peer_engine, engine_of_link(link),
                                  sizeof(ep->peer_engine))) {
        return NULL;
    }
    return ep;
}

static void on_recv(void *ctx, uint16_t link, uint32_t src, uint32_t src_pid, uint8_t tag,
                    const void *data, size_t len)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    bool host = 0 != (link & TB_ELINK_HOST);
    mca_btl_base_endpoint_t *ep;

    link &= (uint16_t) ~TB_ELINK_HOST;
    ep = endpoint_of(module_of_link(link, host), link, src);

    (void) ctx;
    if (NULL == ep || ep->peer_pid != src_pid) {
        uint64_t now = mca_btl_tbrdma_now_ns();
        if (now - c->last_drop_warn_ns >= 1000000000ull) {
            c->last_drop_warn_ns = now;
            opal_output(0, "btl:tbrdma on %s: dropped a message claiming to come from rank %u: %s",
                        opal_process_info.nodename, (unsigned) src,
                        NULL == ep ? "that rank is not behind the engine it came through"
                                   : "it came from another process than the one the job "
                                     "published for that rank");
        }
        return;
    }
    if (TBRDMA_EP_FAILED == ep->state) {
        return;
    }
    mca_btl_tbrdma_deliver(ep, tag, data, len);
}

static void on_peer(void *ctx, uint16_t link, const tb_wire_epeer_t *info)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    (void) ctx;
    if (link >= TBRDMA_ENGINE_MAX_LINKS) {
        return;
    }
    c->links[link].known = true;
    c->links[link].dev = info->dev;
    memcpy(c->links[link].engine_id, info->engine_id, sizeof(c->links[link].engine_id));
}

/* Rank vpid behind link died: its endpoints on the link's cable and on the
 * host module. */
static void on_gone(void *ctx, uint16_t link, uint32_t vpid, uint32_t pid, const char *why)
{
    opal_process_name_t name = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = vpid};

    (void) ctx;
    BTL_TBRDMA_VERBOSE(20, "the host engine reports rank %u gone (link %u): %s", (unsigned) vpid,
                       (unsigned) link, why);
    for (int host = 0; host < 2; ++host) {
        mca_btl_tbrdma_module_t *module = module_of_link(link, host);
        mca_btl_base_endpoint_t *ep;
        if (NULL == module) {
            continue;
        }
        ep = mca_btl_tbrdma_module_find_endpoint(module, &name);
        /* A process that attached in the rank's name dies as itself. */
        if (ep && ep->peer_pid == pid
            && 0 == memcmp(ep->peer_engine, engine_of_link(link), sizeof(ep->peer_engine))) {
            mca_btl_tbrdma_endpoint_fail(ep, why);
        }
    }
}

/* Every endpoint over device dev behind the engine engine_id, or every
 * endpoint behind any engine (NULL, -1). */
static void fail_endpoints(const uint8_t *engine_id, int dev, bool quietly, const char *why)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    for (int i = 0; i < c->num_modules; ++i) {
        mca_btl_tbrdma_module_t *module = c->modules[i];
        mca_btl_base_endpoint_t *ep, *next;
        OPAL_LIST_FOREACH_SAFE (ep, next, &module->endpoints, mca_btl_base_endpoint_t) {
            if (ep->loop || (dev >= 0 && ep->device != &c->devices.devices[dev])
                || (engine_id
                    && 0 != memcmp(ep->peer_engine, engine_id, sizeof(ep->peer_engine)))) {
                continue;
            }
            if (quietly) {
                /* Its ranks all finalized: nothing more can come or go. */
                ep->state = TBRDMA_EP_FAILED;
                mca_btl_tbrdma_rma_fail_pending(ep, OPAL_ERR_UNREACH);
            } else {
                mca_btl_tbrdma_endpoint_fail(ep, why);
            }
        }
    }
}

static void on_down(void *ctx, uint16_t link, bool closed, const char *why)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    (void) ctx;
    if (link < TBRDMA_ENGINE_MAX_LINKS && c->links[link].known) {
        fail_endpoints(c->links[link].engine_id, c->links[link].dev, closed, why);
    }
}

static void on_engine_lost(void *ctx, const char *why)
{
    (void) ctx;
    fail_endpoints(NULL, -1, false, why);
}

static const tb_eclient_handlers_t handlers = {
    .recv = on_recv,
    .peer = on_peer,
    .gone = on_gone,
    .down = on_down,
    .engine_lost = on_engine_lost,
};

void mca_btl_tbrdma_engine_forget(mca_btl_base_endpoint_t *ep)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    size_t i = 0;

    /* Its sends end as they would in a channel that goes away. */
    while (i < c->ncompletions) {
        if (c->completions[i].ep == ep) {
            void *cookie = c->completions[i].cookie;
            memmove(&c->completions[i], &c->completions[i + 1],
                    (c->ncompletions - i - 1) * sizeof(c->completions[0]));
            c->ncompletions--;
            mca_btl_tbrdma_send_done(ep, cookie, TB_CHAN_ECANCELED);
            i = 0;
            continue;
        }
        ++i;
    }
}

int mca_btl_tbrdma_engine_progress(uint64_t now)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    size_t i, n = c->ncompletions;
    int m;

    /* Completions first, taken as a batch: the callbacks may send again. */
    if (n) {
        struct tbrdma_completion batch[64];
        size_t k = n < 64 ? n : 64;
        memcpy(batch, c->completions, k * sizeof(batch[0]));
        memmove(c->completions, c->completions + k, (n - k) * sizeof(batch[0]));
        c->ncompletions -= k;
        for (i = 0; i < k; ++i) {
            mca_btl_tbrdma_send_done(batch[i].ep, batch[i].cookie, TB_CHAN_OK);
        }
    }
    m = tb_eclient_progress(c->engine, &handlers, NULL, now, 64);
    return (int) (n < 64 ? n : 64) + m;
}
