/*
 * tbrdma BTL: one module per RDMA device (cable).
 *
 * The send path: ob1's descriptors are fragments (btl_tbrdma_frag.h) handed
 * to the endpoint's reliable channel, which completes them once their bytes
 * are in its send slots (it resends from there until the peer acknowledges).
 * Received messages come back whole and in order and go straight to ob1's
 * callback from the channel's receive buffer.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"
#include "btl_tbrdma_frag.h"

#include "opal/class/opal_bitmap.h"
#include "opal/util/argv.h"
#include "opal/datatype/opal_convertor.h"
#include "opal/util/show_help.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

static uint64_t name_key(const opal_process_name_t *name)
{
    uint64_t key;

    memcpy(&key, name, sizeof(key));
    return key;
}

mca_btl_base_endpoint_t *mca_btl_tbrdma_module_find_endpoint(mca_btl_tbrdma_module_t *module,
                                                             const opal_process_name_t *name)
{
    void *ep = NULL;

    if (OPAL_SUCCESS !=
        opal_hash_table_get_value_uint64(&module->endpoint_by_name, name_key(name), &ep)) {
        return NULL;
    }
    return ep;
}

/* A peer no cable reaches, on a host a route through other hosts reaches:
 * the engines relay (btl_tbrdma_route.c). */
static mca_btl_base_endpoint_t *routed_endpoint(mca_btl_tbrdma_module_t *module, opal_proc_t *proc,
                                                const tb_wire_modex_t *mx)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_endpoint_t *ep;
    unsigned hops;
    int dev;

    if (0 != mca_btl_tbrdma_route_find(mx->engine_id, &dev, &hops)) {
        return NULL;
    }
    ep = mca_btl_tbrdma_endpoint_create(module, &c->devices.devices[dev], proc, mx,
                                        &mx->devices[0]);
    if (NULL == ep) {
        return NULL;
    }
    ep->routed = true;
    BTL_TBRDMA_VERBOSE(20, "host module on %s reaches %s through the host engines, relayed: "
                       "%u hops, the first over %s",
                       opal_process_info.nodename, opal_get_proc_hostname(proc), hops,
                       c->devices.devices[dev].name);
    return ep;
}

mca_btl_base_endpoint_t *mca_btl_tbrdma_module_endpoint_for(mca_btl_tbrdma_module_t *module,
                                                            opal_proc_t *proc)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_endpoint_t *ep;
    tb_wire_modex_t *mx = NULL;
    tb_device_t *device = module->device;
    const char *why = NULL;
    size_t size = 0;
    int rc, dev = -1;

    ep = mca_btl_tbrdma_module_find_endpoint(module, &proc->proc_name);
    if (NULL != ep) {
        return ep;
    }
    OPAL_MODEX_RECV(rc, &c->super.btl_version, &proc->proc_name, (void **) &mx, &size);
    if (OPAL_SUCCESS != rc || NULL == mx) {
        return NULL;
    }
    if (0 == tb_modex_check(mx, size, &why)) {
        if ((TB_MODEX_PATH_ENGINE == mx->path) != c->use_engine) {
            /* One side owns its queue pairs, the other's host engine does:
             * they cannot meet. */
            BTL_TBRDMA_VERBOSE(10, "%s: %s uses %s, this process %s: leaving it to other "
                               "transports (set btl_tbrdma_path alike on every host)",
                               module->device->name, opal_get_proc_hostname(proc),
                               mx->path ? "its host's engine" : "its own queue pairs",
                               c->use_engine ? "its host's engine" : "its own queue pairs");
            free(mx);
            return NULL;
        }
        dev = mca_btl_tbrdma_cable_find(module, proc, mx, &device);
    } else {
        opal_output(0, "btl:tbrdma on %s: ignoring the tbrdma entry of %s: %s",
                    opal_process_info.nodename, opal_get_proc_hostname(proc), why);
    }
    if (dev < 0 && NULL == why && module->host && c->use_engine
        && !OPAL_PROC_ON_LOCAL_NODE(proc->proc_flags) && mx->ndevices > 0) {
        ep = routed_endpoint(module, proc, mx);
        if (ep) {
            free(mx);
            return ep;
        }
    }
    if (dev < 0) {
        free(mx);
        BTL_TBRDMA_VERBOSE(20, "%s: no cable from %s to %s",
                           module->host ? "host module" : module->device->name,
                           opal_process_info.nodename, opal_get_proc_hostname(proc));
        return NULL;
    }
    ep = mca_btl_tbrdma_endpoint_create(module, device, proc, mx, &mx->devices[dev]);
    if (ep && OPAL_PROC_ON_LOCAL_NODE(proc->proc_flags)) {
        BTL_TBRDMA_VERBOSE(20, "%s%s: rank %u of this host, from ring to ring in the engine",
                           module->host ? "host module, " : "", device->name,
                           (unsigned) proc->proc_name.vpid);
    } else if (ep) {
        char ip[INET_ADDRSTRLEN];

        inet_ntop(AF_INET, &mx->devices[dev].ipv4, ip, sizeof(ip));
        BTL_TBRDMA_VERBOSE(20, "%s%s on %s reaches %s at %s through %s",
                           module->host ? "host module, " : "", device->name,
                           opal_process_info.nodename, opal_get_proc_hostname(proc), ip,
                           c->use_engine ? "the host engine" : "its own queue pairs");
    }
    free(mx);
    return ep;
}

/* The direct path reaches only the hosts its cables touch, the engines
 * those a chain of cables through the job's hosts reaches.  Once every
 * module has seen the processes, this host's first process names each host
 * tbrdma cannot reach when nothing else will reach it either, and what the
 * user can do, rather than leaving them Open MPI's "unable to reach each
 * other". */
static void report_uncabled(struct opal_proc_t **procs, size_t nprocs)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    char **told = NULL;

    if (opal_process_info.my_local_rank > 0 || !mca_btl_tbrdma_only_network()) {
        return;
    }
    for (size_t i = 0; i < nprocs; ++i) {
        const char *host = opal_get_proc_hostname(procs[i]);
        bool reached = false;
        if (OPAL_PROC_ON_LOCAL_NODE(procs[i]->proc_flags) || NULL == host) {
            continue;
        }
        for (int k = 0; k < c->num_modules && !reached; ++k) {
            reached =
                NULL != mca_btl_tbrdma_module_find_endpoint(c->modules[k], &procs[i]->proc_name);
        }
        for (int k = 0; !reached && told && told[k]; ++k) {
            reached = 0 == strcmp(told[k], host); /* already named */
        }
        if (!reached) {
            (void) opal_argv_append_nosize(&told, host);
        }
    }
    for (int k = 0; told && told[k]; ++k) {
        mca_btl_tbrdma_show_help(
            "no cable to host", opal_process_info.nodename, told[k],
            TBRDMA_PATH_DIRECT == c->path_param
                ? "btl_tbrdma_path is direct: each process's own queue pairs reach only\n"
                  "the hosts a cable joins.  The host engines (btl_tbrdma_path auto or\n"
                  "engine) also relay through the job's hosts between them."
                : "The host engines relay only through hosts that run a process of this\n"
                  "job: include a host between them (one rank there is enough), or run\n"
                  "on hosts a cable joins ('tbrdma_devinfo' on each host shows its\n"
                  "cables).");
    }
    opal_argv_free(told);
}

static int tbrdma_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                            struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers,
                            opal_bitmap_t *reachable)
{
    mca_btl_tbrdma_module_t *module = (mca_btl_tbrdma_module_t *) btl;
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    int local_procs = (int) opal_process_info.num_local_peers + 1;
    size_t i, nreach;

    mca_btl_tbrdma_lock();
    if (c->use_engine && !c->engine_key_sent) {
        (void) mca_btl_tbrdma_engine_send_job_key();
    }
    if (c->use_engine) {
        (void) mca_btl_tbrdma_route_init();
    }
    mca_btl_tbrdma_cable_probe_procs(procs, nprocs);
    for (i = 0; i < nprocs; ++i) {
        peers[i] = NULL;
        /* This process and this host's other ranks, for osc/rdma, which
         * wants one module reaching every process: through the engine, the
         * host module does (its ring to ring path), else every cable's
         * module reaches this process. */
        if (procs[i] == opal_proc_local_get()) {
            if (module->host || !c->use_engine) {
                peers[i] = mca_btl_tbrdma_loop_endpoint(module, procs[i]);
            }
            continue;
        }
        if (OPAL_PROC_ON_LOCAL_NODE(procs[i]->proc_flags) && !module->host) {
            continue;
        }
        peers[i] = mca_btl_tbrdma_module_endpoint_for(module, procs[i]);
    }

    /* Every process of this host may connect to every peer across this
     * cable, each connection taking one queue pair per lane from the
     * device's limit (shared by the whole host). */
    nreach = opal_list_get_size(&module->endpoints) - (NULL != module->self);
    if (!c->use_engine && (size_t) local_procs * nreach * (size_t) c->tunables.lanes >
        (size_t) c->tunables.qps_per_device) {
        mca_btl_tbrdma_show_help("queue pair budget", opal_process_info.nodename,
                                 module->device->name, local_procs, (int) nreach, c->tunables.lanes,
                                 local_procs * (int) nreach * c->tunables.lanes,
                                 c->tunables.qps_per_device);
        for (i = 0; i < nprocs; ++i) {
            peers[i] = NULL;
        }
        mca_btl_tbrdma_unlock();
        return OPAL_SUCCESS;
    }
    for (i = 0; i < nprocs; ++i) {
        if (peers[i] && reachable) {
            opal_bitmap_set_bit(reachable, (int) i);
        }
    }
    if (0 == ++c->add_procs_calls % (unsigned) c->num_modules) {
        report_uncabled(procs, nprocs);
    }
    mca_btl_tbrdma_unlock();
    return OPAL_SUCCESS;
}

static int tbrdma_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                            struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers)
{
    size_t i;

    mca_btl_tbrdma_lock();
    for (i = 0; i < nprocs; ++i) {
        if (peers[i]) {
            mca_btl_tbrdma_endpoint_release(peers[i]);
        }
    }
    mca_btl_tbrdma_unlock();
    return OPAL_SUCCESS;
}

static int tbrdma_register_error(struct mca_btl_base_module_t *btl,
                                 mca_btl_base_module_error_cb_fn_t cbfunc)
{
    ((mca_btl_tbrdma_module_t *) btl)->error_cb = cbfunc;
    return OPAL_SUCCESS;
}

static mca_btl_base_descriptor_t *tbrdma_alloc(struct mca_btl_base_module_t *btl,
                                               struct mca_btl_base_endpoint_t *endpoint,
                                               uint8_t order, size_t size, uint32_t flags)
{
    mca_btl_tbrdma_frag_t *frag = mca_btl_tbrdma_frag_alloc(endpoint, size);

    if (NULL == frag) {
        return NULL;
    }
    frag->base.des_flags = flags;
    return &frag->base;
}

static int tbrdma_free(struct mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des)
{
    mca_btl_tbrdma_frag_return((mca_btl_tbrdma_frag_t *) des);
    return OPAL_SUCCESS;
}

static mca_btl_base_descriptor_t *tbrdma_prepare_src(struct mca_btl_base_module_t *btl,
                                                     struct mca_btl_base_endpoint_t *endpoint,
                                                     struct opal_convertor_t *convertor,
                                                     uint8_t order, size_t reserve, size_t *size,
                                                     uint32_t flags)
{
    size_t max = mca_btl_tbrdma_component.max_frag_size;
    mca_btl_tbrdma_frag_t *frag;
    uint32_t iov_count = 1;
    struct iovec iov;
    size_t packed;

    if (reserve >= max) {
        return NULL;
    }
    if (*size > max - reserve) {
        *size = max - reserve;
    }
    frag = mca_btl_tbrdma_frag_alloc(endpoint, reserve + *size);
    if (NULL == frag) {
        return NULL;
    }
    iov.iov_base = (char *) frag->segment.seg_addr.pval + reserve;
    iov.iov_len = *size;
    packed = *size;
    if (opal_convertor_pack(convertor, &iov, &iov_count, &packed) < 0) {
        mca_btl_tbrdma_frag_return(frag);
        return NULL;
    }
    *size = packed;
    frag->segment.seg_len = reserve + packed;
    frag->base.des_flags = flags;
    return &frag->base;
}

static int send_frag(struct mca_btl_base_endpoint_t *endpoint, mca_btl_tbrdma_frag_t *frag,
                     mca_btl_base_tag_t tag)
{
    struct iovec iov;

    iov.iov_base = frag->segment.seg_addr.pval;
    iov.iov_len = frag->segment.seg_len;
    return mca_btl_tbrdma_endpoint_send(endpoint, tag, &iov, 1, &frag->cookie);
}

static int tbrdma_send(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                       mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag)
{
    int rc;

    mca_btl_tbrdma_lock();
    rc = send_frag(endpoint, (mca_btl_tbrdma_frag_t *) des, tag);
    mca_btl_tbrdma_unlock();
    return rc;
}

/* ob1's header and payload_size bytes of data, one after the other at dst.
 * OPAL_SUCCESS, or OPAL_ERROR when the convertor packs less. */
static int pack_message(unsigned char *dst, const void *header, size_t header_size,
                        struct opal_convertor_t *convertor, size_t payload_size)
{
    uint32_t iov_count = 1;
    struct iovec iov = {.iov_base = dst + header_size, .iov_len = payload_size};
    size_t packed = payload_size;

    memcpy(dst, header, header_size);
    if (payload_size && (opal_convertor_pack(convertor, &iov, &iov_count, &packed) < 0 ||
                         packed != payload_size)) {
        return OPAL_ERROR;
    }
    return OPAL_SUCCESS;
}

/* Pack ob1's header and data straight into a send slot and post it, when
 * the channel can take the message at once: no descriptor, no copy through
 * it, complete on return.  OPAL_ERR_OUT_OF_RESOURCE when it cannot. */
static int sendi_direct(struct mca_btl_base_endpoint_t *endpoint,
                        struct opal_convertor_t *convertor, void *header, size_t header_size,
                        size_t payload_size, mca_btl_base_tag_t tag)
{
    tb_channel_t *ch = tb_conn_channel(endpoint->conn);
    unsigned char *slot;
    int rc = OPAL_ERR_OUT_OF_RESOURCE;

    mca_btl_tbrdma_lock();
    slot = tb_channel_send_begin(ch, tag, header_size + payload_size);
    if (NULL != slot) {
        rc = pack_message(slot, header, header_size, convertor, payload_size);
        if (OPAL_SUCCESS == rc) {
            rc = TB_CHAN_OK == tb_channel_send_commit(ch) ? OPAL_SUCCESS : OPAL_ERR_UNREACH;
        } else {
            tb_channel_send_cancel(ch);
        }
    }
    mca_btl_tbrdma_unlock();
    return rc;
}

/* The same through the host engine: straight into the ring. */
static int sendi_engine(struct mca_btl_base_endpoint_t *endpoint,
                        struct opal_convertor_t *convertor, void *header, size_t header_size,
                        size_t payload_size, mca_btl_base_tag_t tag)
{
    unsigned char *slot;
    int rc = OPAL_ERR_OUT_OF_RESOURCE;

    mca_btl_tbrdma_lock();
    slot = mca_btl_tbrdma_engine_send_begin(endpoint, tag, header_size + payload_size);
    if (NULL != slot) {
        rc = pack_message(slot, header, header_size, convertor, payload_size);
        if (OPAL_SUCCESS == rc) {
            mca_btl_tbrdma_engine_send_commit();
        } else {
            mca_btl_tbrdma_engine_send_cancel();
        }
    }
    mca_btl_tbrdma_unlock();
    return rc;
}

static int tbrdma_sendi(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                        struct opal_convertor_t *convertor, void *header, size_t header_size,
                        size_t payload_size, uint8_t order, uint32_t flags, mca_btl_base_tag_t tag,
                        mca_btl_base_descriptor_t **descriptor)
{
    mca_btl_tbrdma_frag_t *frag;
    size_t total = header_size + payload_size;
    int rc;

    if (descriptor) {
        *descriptor = NULL;
    }
    if (total > btl->btl_eager_limit || TBRDMA_EP_FAILED == endpoint->state) {
        return TBRDMA_EP_FAILED == endpoint->state ? OPAL_ERR_UNREACH : OPAL_ERR_OUT_OF_RESOURCE;
    }
    /* To this process itself there is no slot to pack into: the fragment
     * below is the copy. */
    if (!endpoint->loop && mca_btl_tbrdma_component.use_engine) {
        rc = sendi_engine(endpoint, convertor, header, header_size, payload_size, tag);
        if (OPAL_ERR_OUT_OF_RESOURCE != rc) {
            return rc;
        }
    } else if (!endpoint->loop && TBRDMA_EP_CONNECTED == endpoint->state) {
        rc = sendi_direct(endpoint, convertor, header, header_size, payload_size, tag);
        if (OPAL_ERR_OUT_OF_RESOURCE != rc) {
            return rc;
        }
    }
    frag = mca_btl_tbrdma_frag_alloc(endpoint, total);
    if (NULL == frag) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (OPAL_SUCCESS != pack_message(frag->segment.seg_addr.pval, header, header_size, convertor,
                                     payload_size)) {
        mca_btl_tbrdma_frag_return(frag);
        return OPAL_ERROR;
    }
    frag->base.des_flags = MCA_BTL_DES_FLAGS_BTL_OWNERSHIP | flags;
    mca_btl_tbrdma_lock();
    rc = send_frag(endpoint, frag, tag);
    mca_btl_tbrdma_unlock();
    if (OPAL_SUCCESS != rc) {
        mca_btl_tbrdma_frag_return(frag);
    }
    return rc;
}

/* put/get complete through callbacks: wait until none is outstanding. */
static int tbrdma_flush(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint)
{
    mca_btl_tbrdma_module_t *module = (mca_btl_tbrdma_module_t *) btl;
    mca_btl_base_endpoint_t *ep;
    bool busy = true;

    while (busy) {
        busy = false;
        mca_btl_tbrdma_lock();
        OPAL_LIST_FOREACH (ep, &module->endpoints, mca_btl_base_endpoint_t) {
            if ((NULL == endpoint || ep == endpoint)
                && (!opal_list_is_empty(&ep->rma_pending) || 0 != ep->rma_split)) {
                busy = true;
            }
        }
        mca_btl_tbrdma_unlock();
        if (busy) {
            opal_progress();
        }
    }
    return OPAL_SUCCESS;
}

void mca_btl_tbrdma_deliver(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *data,
                            size_t len)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_segment_t segment;

    if (tag < TB_TAG_FIRST_USER) {
        mca_btl_tbrdma_rma_deliver(endpoint, tag, data, len);
        return;
    }
    /* A tag nothing registered (or beyond Open MPI's table) would be
     * dispatched through a NULL pointer: the peer is broken or hostile. */
    if (tag >= MCA_BTL_TAG_MAX || NULL == mca_btl_base_active_message_trigger[tag].cbfunc) {
        uint64_t now = mca_btl_tbrdma_now_ns();
        if (now - c->last_drop_warn_ns >= 1000000000ull) {
            c->last_drop_warn_ns = now;
            opal_output(0, "btl:tbrdma on %s: dropped a %zu-byte message with tag %u from %s: "
                        "nothing on this process handles that tag (a peer of another Open MPI "
                        "or tbrdma version?)",
                        opal_process_info.nodename, len, (unsigned) tag,
                        opal_get_proc_hostname(endpoint->proc));
        }
        return;
    }
    segment.seg_addr.pval = (void *) data;
    segment.seg_len = len;
    tbrdma_compat_deliver(&endpoint->module->super, endpoint, tag, &segment);
}

void mca_btl_tbrdma_send_done(mca_btl_base_endpoint_t *endpoint, void *cookie, int status)
{
    mca_btl_tbrdma_cookie_t *c = cookie;
    int rc = TB_CHAN_OK == status ? OPAL_SUCCESS : OPAL_ERR_UNREACH;

    if (TBRDMA_COOKIE_FRAG == c->kind) {
        mca_btl_tbrdma_frag_complete(
            (mca_btl_tbrdma_frag_t *) ((char *) c - offsetof(mca_btl_tbrdma_frag_t, cookie)), rc);
    } else {
        mca_btl_tbrdma_rma_send_done(endpoint, cookie, rc);
    }
}

/* A send completes once its data is in the channel's send slots, so frames
 * may still await their ack (or a resend) when the job finalizes: keep them
 * going for a moment, as long as a live peer may still need them. */
static void drain(mca_btl_tbrdma_module_t *module)
{
    uint64_t now = mca_btl_tbrdma_now_ns(), end = now + 1000000000ull;
    bool busy = true;

    while (busy && now < end) {
        mca_btl_base_endpoint_t *ep;
        busy = false;
        OPAL_LIST_FOREACH (ep, &module->endpoints, mca_btl_base_endpoint_t) {
            if (ep->conn && TBRDMA_EP_FAILED != ep->state
                && 0 == tb_channel_status(tb_conn_channel(ep->conn))
                && 0 != tb_channel_unacked(tb_conn_channel(ep->conn))) {
                busy = true;
            }
        }
        if (busy) {
            (void) mca_btl_tbrdma_module_progress(module, now);
            now = mca_btl_tbrdma_now_ns();
        }
    }
}

static int tbrdma_finalize(struct mca_btl_base_module_t *btl)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_tbrdma_module_t *module = (mca_btl_tbrdma_module_t *) btl;
    int i;

    /* Before any module goes: the keeper progresses them all. */
    mca_btl_tbrdma_keeper_stop();
    mca_btl_tbrdma_lock();
    if (!c->use_engine) {
        drain(module);
    }
    mca_btl_tbrdma_module_stop(module);
    if (c->host_module == module) {
        c->host_module = NULL;
    }
    for (i = 0; i < c->num_modules; ++i) {
        if (c->modules[i] == module) {
            c->modules[i] = c->modules[--c->num_modules];
            break;
        }
    }
    mca_btl_tbrdma_unlock();
    free(module);
    return OPAL_SUCCESS;
}

mca_btl_tbrdma_module_t mca_btl_tbrdma_module_template = {
    .super =
        {
            .btl_component = &mca_btl_tbrdma_component.super,
            .btl_add_procs = tbrdma_add_procs,
            .btl_del_procs = tbrdma_del_procs,
            .btl_finalize = tbrdma_finalize,
            .btl_alloc = tbrdma_alloc,
            .btl_free = tbrdma_free,
            .btl_prepare_src = tbrdma_prepare_src,
            .btl_send = tbrdma_send,
            .btl_sendi = tbrdma_sendi,
            .btl_put = mca_btl_tbrdma_put,
            .btl_get = mca_btl_tbrdma_get,
            .btl_atomic_op = mca_btl_tbrdma_atomic_op,
            .btl_atomic_fop = mca_btl_tbrdma_atomic_fop,
            .btl_atomic_cswap = mca_btl_tbrdma_atomic_cswap,
            .btl_register_mem = mca_btl_tbrdma_register_mem,
            .btl_deregister_mem = mca_btl_tbrdma_deregister_mem,
            .btl_register_error = tbrdma_register_error,
            .btl_flush = tbrdma_flush,
        },
};
