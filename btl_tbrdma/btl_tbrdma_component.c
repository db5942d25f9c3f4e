/*
 * tbrdma BTL: the component — parameters, device discovery, module creation.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"
#include "btl_tbrdma_frag.h"

#include "opal/mca/base/mca_base_var.h"
#include "opal/mca/base/mca_base_var_enum.h"
#include "opal/util/argv.h"
#include "opal/util/output.h"
#include "opal/util/proc.h"
#include "opal/util/show_help.h"

#include "tb_log.h"
#include "tb_random.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tbrdma_component_register(void);
static int tbrdma_component_open(void);
static int tbrdma_component_close(void);
static mca_btl_base_module_t **tbrdma_component_init(int *num_btls, bool enable_progress_threads,
                                                     bool enable_mpi_threads);

mca_btl_tbrdma_component_t mca_btl_tbrdma_component = {
    .super =
        {
            .btl_version =
                {
                    MCA_BTL_DEFAULT_VERSION("tbrdma"),
                    .mca_open_component = tbrdma_component_open,
                    .mca_close_component = tbrdma_component_close,
                    .mca_register_component_params = tbrdma_component_register,
                },
            .btl_data =
                {
                    .param_field = MCA_BASE_METADATA_PARAM_CHECKPOINT,
                },
            .btl_init = tbrdma_component_init,
        },
};

static const mca_base_var_enum_value_t path_values[] = {
    {TBRDMA_PATH_AUTO, "auto"},
    {TBRDMA_PATH_DIRECT, "direct"},
    {TBRDMA_PATH_ENGINE, "engine"},
    {0, NULL},
};

static const mca_base_var_enum_value_t checksum_values[] = {
    {TB_CHECKSUM_FULL, "full"},
    {TB_CHECKSUM_HEADER, "header"},
    {0, NULL},
};

static void register_string(const char *name, const char *help, mca_base_var_info_lvl_t level,
                            char **storage)
{
    (void) mca_base_component_var_register(&mca_btl_tbrdma_component.super.btl_version, name, help,
                                           MCA_BASE_VAR_TYPE_STRING, NULL, 0, 0, level,
                                           MCA_BASE_VAR_SCOPE_READONLY, storage);
}

static void register_int(const char *name, const char *help, mca_base_var_info_lvl_t level,
                         int *storage)
{
    (void) mca_base_component_var_register(&mca_btl_tbrdma_component.super.btl_version, name, help,
                                           MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, level,
                                           MCA_BASE_VAR_SCOPE_READONLY, storage);
}

static void register_uint(const char *name, const char *help, mca_base_var_info_lvl_t level,
                          uint32_t *storage)
{
    (void) mca_base_component_var_register(&mca_btl_tbrdma_component.super.btl_version, name, help,
                                           MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, level,
                                           MCA_BASE_VAR_SCOPE_READONLY, storage);
}

static int tbrdma_component_register(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_module_t *m = &mca_btl_tbrdma_module_template.super;
    mca_base_var_enum_t *checksum_enum = NULL, *path_enum = NULL;
    tb_tunables_t *t = &c->tunables;

    tb_tunables_defaults(t);
    c->verbs_library = (char *) t->verbs_library;
    c->if_include = (char *) t->if_include;
    c->if_exclude = (char *) t->if_exclude;
    c->checksum = t->checksum;

    register_string("verbs_library",
                    "Verbs library loaded at run time (default: /usr/lib/librdma.dylib on "
                    "macOS, libibverbs.so.1 elsewhere)",
                    OPAL_INFO_LVL_5, &c->verbs_library);
    register_string("if_include",
                    "Comma-separated shell patterns of RDMA device names to use (e.g. "
                    "\"rdma_en*\"); mutually exclusive with btl_tbrdma_if_exclude",
                    OPAL_INFO_LVL_3, &c->if_include);
    register_string("if_exclude",
                    "Comma-separated shell patterns of RDMA device names not to use; mutually "
                    "exclusive with btl_tbrdma_if_include",
                    OPAL_INFO_LVL_3, &c->if_exclude);
    register_int("lanes",
                 "Queue pairs per connection: 2 = a small-frame lane for latency and a "
                 "bulk-frame lane for bandwidth; 1 = small frames only (saves queue pairs)",
                 OPAL_INFO_LVL_5, &t->lanes);
    register_uint("small_frame_size",
                  "Bytes per small-lane receive buffer (a multiple of 4096: Apple's RDMA "
                  "delivers a send only into a receive of the same number of 4 KiB frames)",
                  OPAL_INFO_LVL_5, &t->small_frame_size);
    register_uint("bulk_frame_size",
                  "Bytes per bulk-lane receive buffer (a multiple of 4096, at most 16773120)",
                  OPAL_INFO_LVL_5, &t->bulk_frame_size);
    register_int("recv_depth",
                 "Receives kept posted per queue pair (2-32; Apple's RDMA fails beyond ~32)",
                 OPAL_INFO_LVL_5, &t->recv_depth);
    register_int("qps_per_device",
                 "Queue pairs this process may create on one device (1-10; Apple's RDMA "
                 "allows 10 per device for all processes of a host)",
                 OPAL_INFO_LVL_5, &t->qps_per_device);
    c->free_list_num = 16;
    c->free_list_max = -1;
    c->free_list_inc = 16;
    register_int("free_list_num",
                 "Fragments allocated up front in each of the two fragment pools (eager and "
                 "max-size)",
                 OPAL_INFO_LVL_6, &c->free_list_num);
    register_int("free_list_max",
                 "Most fragments per pool (-1: no limit); at the limit, sends wait for "
                 "fragments to come back",
                 OPAL_INFO_LVL_6, &c->free_list_max);
    register_int("free_list_inc", "Fragments added to a pool each time it runs dry",
                 OPAL_INFO_LVL_6, &c->free_list_inc);
    register_uint("peer_timeout",
                  "Milliseconds without any answer after which a peer (or its cable) is "
                  "declared dead and the job is told",
                  OPAL_INFO_LVL_4, &t->peer_timeout_ms);
    register_uint("stall_timeout",
                  "Milliseconds a peer may keep answering yet acknowledge none of the data sent "
                  "to it (or answer no put/get, or not finish connecting) before it is declared "
                  "broken; at least btl_tbrdma_peer_timeout",
                  OPAL_INFO_LVL_5, &t->stall_timeout_ms);
    register_uint("rto_min",
                  "Floor, in microseconds, of the retransmit timeout of an unacknowledged "
                  "frame (the timeout follows the measured round trip and doubles on each retry)",
                  OPAL_INFO_LVL_6, &t->rto_min_us);
    c->path_param = TBRDMA_PATH_AUTO;
    if (OPAL_SUCCESS == mca_base_var_enum_create("btl_tbrdma_path", path_values, &path_enum)) {
        (void) mca_base_component_var_register(
            &c->super.btl_version, "path",
            "Who owns the queue pairs: \"direct\" (each process its own: one connection per "
            "pair of processes, which fits Apple's 10 queue pairs per device only with one or "
            "two processes per host), \"engine\" (one engine process per host and job owns the "
            "devices; the host's processes reach it through shared memory), or \"auto\" (the "
            "engine when more than two processes of the job share a host, the job spans more "
            "than two hosts, or both of its two hosts have two cables or more; one answer for "
            "the whole job)",
            MCA_BASE_VAR_TYPE_INT, path_enum, 0, 0, OPAL_INFO_LVL_3, MCA_BASE_VAR_SCOPE_READONLY,
            &c->path_param);
        OBJ_RELEASE(path_enum);
    }
    c->engine_path = TB_ENGINE_PATH;
    register_string("engine_path",
                    "The tbrdma-engine program the first process of a job on a host starts "
                    "(default: where make install put it)",
                    OPAL_INFO_LVL_5, &c->engine_path);
    c->engine_ring_size = 8 << 20;
    register_int("engine_ring_size",
                 "Bytes of shared memory in each direction between a process and its host's "
                 "engine (a power of two, 4 MiB to 256 MiB)",
                 OPAL_INFO_LVL_5, &c->engine_ring_size);
    c->engine_peer_timeout_ms = 5000;
    register_uint("engine_peer_timeout",
                  "Milliseconds without any answer after which the host engine declares the "
                  "engine across a cable (its host, or the cable) dead and the job is told; the "
                  "engines answer whatever the processes are doing",
                  OPAL_INFO_LVL_4, &c->engine_peer_timeout_ms);
    c->engine_credit_window = 4u << 20;
    register_uint("engine_credit_window",
                  "Bytes the host engine keeps in flight to one process on another host; more "
                  "waits at the sender, so a process that stops reading holds back only what is "
                  "sent to it",
                  OPAL_INFO_LVL_6, &c->engine_credit_window);
    c->engine_spin_us = 1000;
    register_uint("engine_spin",
                  "Microseconds the host engine keeps polling, yielding its CPU when it finds "
                  "nothing, after the last message it moved before it sleeps (a doorbell or a "
                  "completion event wakes it); more lowers latency, less saves CPU time",
                  OPAL_INFO_LVL_5, &c->engine_spin_us);
    c->engine_yield = 16;
    register_uint("engine_yield",
                  "On the engine path, polls that find nothing after which a process gives up "
                  "its CPU (sched_yield) at each further such poll, and the host engine at each "
                  "idle pass of its spin; 0: never.  Where every core runs a rank that spins, "
                  "the engine gets a CPU only when a rank yields one",
                  OPAL_INFO_LVL_5, &c->engine_yield);
    c->stripe_min = TBRDMA_STRIPE_MIN;
    register_uint("stripe_min",
                  "Bytes from which a put or get (ob1's rendezvous of a large message, "
                  "one-sided) is split into one part per cable that reaches its peer; smaller "
                  "ones keep one cable's latency; 0: never split",
                  OPAL_INFO_LVL_5, &c->stripe_min);
    c->engine_events = 1;
    register_int("engine_events",
                 "1 (default): the host engine sleeps on the devices' completion events where "
                 "they have them (rxe does), so an idle engine wakes every 250 ms; 0: it wakes "
                 "every millisecond when idle (what it does anyway on devices without events)",
                 OPAL_INFO_LVL_6, &c->engine_events);
    c->engine_verbose = TB_LOG_WARN;
    register_int("engine_verbose",
                 "What the host engine writes to engine.log in the job's directory: 0 errors, "
                 "1 warnings, 2 information (kept after the job, with the data it moved and "
                 "the copies per byte), 3 debugging",
                 OPAL_INFO_LVL_9, &c->engine_verbose);
    if (OPAL_SUCCESS ==
        mca_base_var_enum_create("btl_tbrdma_checksum", checksum_values, &checksum_enum)) {
        (void) mca_base_component_var_register(&c->super.btl_version, "checksum",
                                               "CRC32C coverage of each frame: \"header\" (the "
                                               "data is left to the link's own CRC) or \"full\" "
                                               "(header and data, at a CPU cost per byte)",
                                               MCA_BASE_VAR_TYPE_INT, checksum_enum, 0, 0,
                                               OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_READONLY,
                                               &c->checksum);
        OBJ_RELEASE(checksum_enum);
    }

    /* Defaults for the parameters Open MPI's BTL base registers for us. */
    m->btl_exclusivity = MCA_BTL_EXCLUSIVITY_DEFAULT;
    m->btl_latency = 4;
    m->btl_bandwidth = 9000;
    /* Put/get are emulated with the same copies as a send, so rendezvous
     * saves no copy, only the receiver's unexpected-message buffer; its extra
     * round trips made every size up to 64 KiB slower than eager on the
     * virtual cluster (4 KiB: 490 us against 210 us). */
    /* One bulk frame's payload: a larger fragment took two 64 KiB frames. */
    m->btl_eager_limit = 16 * TB_WIRE_HW_FRAME - TB_WIRE_HDR_SIZE;
    m->btl_rndv_eager_limit = m->btl_eager_limit;
    m->btl_max_send_size = 16 * TB_WIRE_HW_FRAME - TB_WIRE_HDR_SIZE;
    m->btl_rdma_pipeline_send_length = 64 * 1024;
    m->btl_rdma_pipeline_frag_size = TBRDMA_RMA_LIMIT;
    m->btl_min_rdma_pipeline_size = 256 * 1024;
    /* put, get and atomics are emulated over the channel (btl_tbrdma_rdma.c):
     * one message per operation, no bounce through ob1's send pipeline, and
     * an operation completes once the target answered, after it changed its
     * memory.  That is what osc/rdma asks of the one BTL it runs one-sided
     * MPI on directly, instead of wrapping it in active messages. */
    m->btl_flags = MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_PUT | MCA_BTL_FLAGS_GET
                   | MCA_BTL_FLAGS_ATOMIC_OPS | MCA_BTL_FLAGS_ATOMIC_FOPS
                   | TBRDMA_FLAGS_REMOTE_COMPLETION;
    /* The target runs them with its CPU's atomic instructions: atomic with
     * its host's own atomics on the same memory (GLOB). */
    m->btl_atomic_flags = MCA_BTL_ATOMIC_SUPPORTS_ADD | MCA_BTL_ATOMIC_SUPPORTS_AND
                          | MCA_BTL_ATOMIC_SUPPORTS_OR | MCA_BTL_ATOMIC_SUPPORTS_XOR
                          | MCA_BTL_ATOMIC_SUPPORTS_LAND | MCA_BTL_ATOMIC_SUPPORTS_LOR
                          | MCA_BTL_ATOMIC_SUPPORTS_LXOR | MCA_BTL_ATOMIC_SUPPORTS_SWAP
                          | MCA_BTL_ATOMIC_SUPPORTS_MIN | MCA_BTL_ATOMIC_SUPPORTS_MAX
                          | MCA_BTL_ATOMIC_SUPPORTS_32BIT | MCA_BTL_ATOMIC_SUPPORTS_CSWAP
                          | MCA_BTL_ATOMIC_SUPPORTS_GLOB;
    m->btl_registration_handle_size = sizeof(mca_btl_base_registration_handle_t);
    m->btl_put_limit = TBRDMA_RMA_LIMIT;
    m->btl_get_limit = TBRDMA_RMA_LIMIT;
    /* Emulated put/get copy from and to any local memory. */
    m->btl_put_local_registration_threshold = SIZE_MAX;
    m->btl_get_local_registration_threshold = SIZE_MAX;
    return mca_btl_base_param_register(&c->super.btl_version, m);
}

static void log_to_opal(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) ctx;
    if (level <= TB_LOG_WARN) {
        opal_output(0, "btl:tbrdma on %s: %s", opal_process_info.nodename, msg);
    } else {
        BTL_TBRDMA_VERBOSE(level == TB_LOG_INFO ? 20 : 50, "%s", msg);
    }
}

static int tbrdma_component_open(void)
{
    int verbosity = opal_output_get_verbosity(opal_btl_base_framework.framework_output);
    char dir[PATH_MAX], *slash;
    Dl_info self;

    tb_log_set_sink(log_to_opal, NULL,
                    verbosity >= 50 ? TB_LOG_DEBUG : (verbosity >= 20 ? TB_LOG_INFO : TB_LOG_WARN));
    /* Help text is found where it was installed, or beside the component
     * itself when it runs from a build tree. */
    (void) opal_show_help_add_dir(TB_HELP_DIR);
    if (0 != dladdr(&mca_btl_tbrdma_component, &self) && self.dli_fname) {
        snprintf(dir, sizeof(dir), "%s", self.dli_fname);
        slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            (void) opal_show_help_add_dir(dir);
        }
    }
    return OPAL_SUCCESS;
}

/* The keeper's work: the direct path's channels, while the application is
 * away from MPI.  Past its bound on held messages it takes no more until the
 * application drains them. */
static void keeper_work(void *ctx, uint64_t now)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    (void) ctx;
    if (mca_btl_tbrdma_held_full()) {
        if (!c->held_full_said) {
            c->held_full_said = true;
            opal_output(0, "btl:tbrdma on %s: peers sent %zu MiB while this process was away "
                        "from MPI; no more is taken until it calls MPI again, and peers may "
                        "time out meanwhile",
                        opal_process_info.nodename, c->held_bytes >> 20);
        }
        return;
    }
    for (int i = 0; i < c->num_modules; ++i) {
        mca_btl_tbrdma_module_keep(c->modules[i], now);
    }
}

/* Stop the keeper (before any module goes away); what it still holds is for
 * an application that no longer listens. */
void mca_btl_tbrdma_keeper_stop(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tb_keeper_t *k = c->keeper;

    if (NULL == k) {
        return;
    }
    BTL_TBRDMA_VERBOSE(20, "the keeper ran %llu times while this process was away from MPI",
                       (unsigned long long) tb_keeper_runs(k));
    /* Its work reads c->keeper: gone only once the thread is. */
    tb_keeper_destroy(k);
    c->keeper = NULL;
    mca_btl_tbrdma_held_clear();
}

static int tbrdma_component_close(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    mca_btl_tbrdma_keeper_stop();

    if (c->started) {
        mca_btl_tbrdma_frag_lists_fini();
        tb_rma_table_fini(&c->rma);
        OBJ_DESTRUCT(&c->get_replies);
        OBJ_DESTRUCT(&c->lock);
        c->started = false;
    }
    free(c->modules);
    c->modules = NULL;
    c->num_modules = 0;
    mca_btl_tbrdma_cable_forget();
    if (c->engine) {
        mca_btl_tbrdma_engine_stop();
    }
    tb_device_list_close(&c->devices);
    tb_log_set_sink(NULL, NULL, TB_LOG_WARN);
    return OPAL_SUCCESS;
}

static int tbrdma_component_progress(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    uint64_t now = mca_btl_tbrdma_now_ns();
    bool yield = false;
    int i, n = 0;

    mca_btl_tbrdma_lock();
    if (c->keeper) {
        tb_keeper_touch(c->keeper, now);
        if (c->held_first || c->held_sends_first || c->away_failures) {
            n += mca_btl_tbrdma_held_replay();
        }
    }
    n += mca_btl_tbrdma_loop_progress();
    if (c->engine) {
        n += mca_btl_tbrdma_engine_progress(now);
    }
    for (i = 0; i < c->num_modules; ++i) {
        n += mca_btl_tbrdma_module_progress(c->modules[i], now);
    }
    /* Every byte to another host waits for the engine, a process that needs
     * a CPU: on a host where a rank spins on every core it gets one only
     * when a rank gives its own up.  After a short spin (a message may be
     * about to arrive), a process with nothing to do yields at each poll. */
    if (c->engine && c->engine_yield) {
        c->idle_polls = n ? 0 : c->idle_polls + 1;
        yield = c->idle_polls > c->engine_yield;
    }
    mca_btl_tbrdma_unlock();
    if (yield) {
        sched_yield();
    }
    return n;
}

static mca_btl_tbrdma_module_t *new_module(tb_device_t *device, int index)
{
    mca_btl_tbrdma_module_t *module = malloc(sizeof(*module));

    if (NULL == module) {
        return NULL;
    }
    *module = mca_btl_tbrdma_module_template;
    module->device = device;
    module->index = index;
    if (mca_btl_tbrdma_component.use_engine) {
        module->super.btl_put_limit = TBRDMA_ENGINE_RMA_LIMIT;
        module->super.btl_get_limit = TBRDMA_ENGINE_RMA_LIMIT;
        module->super.btl_rdma_pipeline_frag_size = TBRDMA_ENGINE_RMA_LIMIT;
    }
    return module;
}

/* Through the engine, the module that reaches every peer over whichever
 * cable leads to it (btl_tbrdma.h).  One below the cables' exclusivity: Open
 * MPI's bml then gives it to ob1 for no peer a cable's module reaches, and
 * lists it for RDMA only (it has put, get and fetching atomics), where
 * osc/rdma looks and finds it the only module reaching every rank (the
 * cables' modules do not reach their own host). */
static int add_host_module(char *err, size_t errlen)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_tbrdma_module_t *module = new_module(c->modules[0]->device, -1);

    if (NULL == module) {
        snprintf(err, errlen, "out of memory creating the host module");
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    module->host = true;
    if (module->super.btl_exclusivity > 0) {
        module->super.btl_exclusivity--;
    }
    if (OPAL_SUCCESS != mca_btl_tbrdma_module_start(module, err, errlen)) {
        free(module);
        return OPAL_ERROR;
    }
    c->modules[c->num_modules++] = module;
    c->host_module = module;
    BTL_TBRDMA_VERBOSE(10, "host module, reaching every peer over the cable that leads to it");
    return OPAL_SUCCESS;
}

/* Tell every peer where this process's cables end and where to ask for a
 * connection (tb_wire.h, modex). */
static int publish_modex(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    size_t size = tb_modex_size((unsigned) c->num_modules);
    tb_wire_modex_t *mx = calloc(1, size);
    int i, rc;

    if (NULL == mx) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    mx->magic = tb_wire_le32(TB_WIRE_MODEX_MAGIC);
    mx->version = TB_WIRE_MODEX_VERSION;
    mx->ndevices = (uint8_t) c->num_modules;
    mx->path = c->use_engine ? TB_MODEX_PATH_ENGINE : TB_MODEX_PATH_DIRECT;
    memcpy(mx->cm_secret, c->cm_secret, sizeof(mx->cm_secret));
    if (c->use_engine) {
        memcpy(mx->engine_id, c->engine_id, sizeof(mx->engine_id));
        mx->pid = tb_wire_le32(c->engine_pid_of_me);
    }
    for (i = 0; i < c->num_modules; ++i) {
        const tb_device_t *dev = c->modules[i]->device;
        mx->devices[i].ipv4 = dev->ipv4.s_addr;
        mx->devices[i].netmask = dev->netmask.s_addr;
        memcpy(mx->devices[i].gid, dev->gid.raw, sizeof(mx->devices[i].gid));
        mx->devices[i].cm_port = tb_wire_le16(c->modules[i]->cm_port);
    }
    OPAL_MODEX_SEND(rc, TBRDMA_MODEX_SCOPE, &c->super.btl_version, mx, size);
    free(mx);
    return rc;
}

/* Frames, descriptors and the exposed-memory table, once devices exist. */
static int start_component(char *err, size_t errlen)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_module_t *m = &mca_btl_tbrdma_module_template.super;
    size_t one_frame = c->tunables.small_frame_size - TB_WIRE_HDR_SIZE;

    /* Two pools: fragments for what fits one small frame, and max-size ones
     * for the rest, so that a storm of small sends does not hold 64 KiB each. */
    c->eager_frag_size = m->btl_eager_limit < one_frame ? m->btl_eager_limit : one_frame;
    c->max_frag_size = m->btl_max_send_size;
    OBJ_CONSTRUCT(&c->lock, opal_recursive_mutex_t);
    OBJ_CONSTRUCT(&c->get_replies, opal_list_t);
    if (0 != tb_random_bytes(c->cm_secret, sizeof(c->cm_secret))) {
        snprintf(err, errlen, "the system has no random source for tbrdma's connection secret "
                 "(getentropy: %s)", strerror(errno));
        goto lock;
    }
    if (0 != tb_rma_table_init(&c->rma, 0)) {
        snprintf(err, errlen, "out of memory, or no random source for registration keys");
        goto lock;
    }
    c->job_size = tbrdma_compat_job_size();
    if (0 == c->job_size) {
        BTL_TBRDMA_VERBOSE(10, "the job's size is unknown: connection requests are checked "
                           "against the job's identity only");
    }
    if (OPAL_SUCCESS != mca_btl_tbrdma_frag_lists_init()) {
        snprintf(err, errlen, "cannot allocate send descriptors");
        goto rma;
    }
    c->started = true;
    return OPAL_SUCCESS;

rma:
    tb_rma_table_fini(&c->rma);
lock:
    OBJ_DESTRUCT(&c->get_replies);
    OBJ_DESTRUCT(&c->lock);
    return OPAL_ERROR;
}

void mca_btl_tbrdma_show_help(const char *topic, ...)
{
    va_list ap;
    char *text;

    va_start(ap, topic);
    text = opal_show_help_vstring(BTL_TBRDMA_HELP_FILE, topic, true, ap);
    va_end(ap);
    if (text) {
        fputs(text, stderr);
        fflush(stderr);
        free(text);
    }
}

/* True when the user listed tbrdma by name and no other network BTL beside
 * it: then a missing device means the job cannot communicate, and the user
 * deserves to know why rather than only Open MPI's generic "unreachable". */
bool mca_btl_tbrdma_only_network(void)
{
    static const char *const local_only[] = {"tbrdma", "self", "sm", "vader", NULL};
    const char **value = NULL;
    char **names;
    bool named = false, others = false;
    int index, i, j;

    index = mca_base_var_find("opal", "btl", NULL, NULL);
    if (index < 0 || OPAL_SUCCESS != mca_base_var_get_value(index, &value, NULL, NULL) ||
        NULL == value || NULL == *value || '^' == (*value)[0]) {
        return false;
    }
    names = opal_argv_split(*value, ',');
    for (i = 0; names && names[i]; ++i) {
        bool local = false;
        for (j = 0; local_only[j]; ++j) {
            local = local || 0 == strcmp(names[i], local_only[j]);
        }
        named = named || 0 == strcmp(names[i], "tbrdma");
        others = others || !local;
    }
    opal_argv_free(names);
    return named && !others;
}

/* Host-wide conditions are reported once per host, by its first process:
 * one message is clearer than one per rank, and Open MPI 4.x can lose help
 * messages that many ranks send at once (open-mpi/ompi#8356). */
static bool reports_for_host(void)
{
    return opal_process_info.my_local_rank <= 0;
}

static void report_no_device(const char *why)
{
    BTL_TBRDMA_VERBOSE(1, "disqualifying myself on %s: %s", opal_process_info.nodename, why);
    if (reports_for_host() && mca_btl_tbrdma_only_network()) {
        mca_btl_tbrdma_show_help("no usable device", opal_process_info.nodename, why);
    }
}

static int load_tunables(char *err, size_t errlen)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_module_t *m = &mca_btl_tbrdma_module_template.super;
    tb_tunables_t *t = &c->tunables;

    t->verbs_library = c->verbs_library ? c->verbs_library : "";
    t->if_include = c->if_include ? c->if_include : "";
    t->if_exclude = c->if_exclude ? c->if_exclude : "";
    t->checksum = c->checksum;
    if (0 != tb_tunables_validate(t, "btl_tbrdma_", err, errlen)) {
        return -1;
    }
    if (c->free_list_num < 1 || c->free_list_inc < 1 ||
        (-1 != c->free_list_max && c->free_list_max < c->free_list_num)) {
        snprintf(err, errlen,
                 "btl_tbrdma_free_list_num = %d and btl_tbrdma_free_list_inc = %d must be at "
                 "least 1, and btl_tbrdma_free_list_max = %d either -1 (no limit) or at least "
                 "free_list_num",
                 c->free_list_num, c->free_list_inc, c->free_list_max);
        return -1;
    }
    if (m->btl_max_send_size > TBRDMA_MAX_MSG) {
        snprintf(err, errlen, "btl_tbrdma_max_send_size = %zu exceeds the largest message a "
                 "peer accepts (%u)", m->btl_max_send_size, (unsigned) TBRDMA_MAX_MSG);
        return -1;
    }
    if (m->btl_eager_limit > m->btl_max_send_size) {
        snprintf(err, errlen,
                 "btl_tbrdma_eager_limit = %zu must not exceed btl_tbrdma_max_send_size = %zu",
                 m->btl_eager_limit, m->btl_max_send_size);
        return -1;
    }
    return 0;
}

static mca_btl_base_module_t **tbrdma_component_init(int *num_btls, bool enable_progress_threads,
                                                     bool enable_mpi_threads)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_module_t **result;
    tb_namefilter_t filter;
    char err[512];
    int i, usable;

    *num_btls = 0;
    if (0 != load_tunables(err, sizeof(err))) {
        if (TBRDMA_PATH_AUTO == c->path_param) {
            mca_btl_tbrdma_path_auto_none();
        }
        if (reports_for_host()) {
            mca_btl_tbrdma_show_help("invalid parameter", opal_process_info.nodename, err);
        }
        return NULL;
    }
    c->use_engine = TBRDMA_PATH_ENGINE == c->path_param
                    || (TBRDMA_PATH_AUTO == c->path_param && mca_btl_tbrdma_path_auto_engine());
    if (c->use_engine) {
        int rc = mca_btl_tbrdma_engine_start(err, sizeof(err));
        if (TB_ECLIENT_NODEV == rc) {
            report_no_device(err);
            return NULL;
        }
        if (TB_ECLIENT_OK != rc) {
            mca_btl_tbrdma_show_help("engine failed", opal_process_info.nodename, err);
            return NULL;
        }
        usable = c->devices.count;
    } else {
        (void) tb_namefilter_parse(&filter, c->tunables.if_include, c->tunables.if_exclude, err,
                                   sizeof(err));
        if (0 != tb_device_list_open(&c->devices, c->tunables.verbs_library, &filter, err,
                                     sizeof(err))) {
            report_no_device(err);
            return NULL;
        }
        usable = tb_device_list_usable_count(&c->devices);
        if (0 == usable) {
            snprintf(err, sizeof(err),
                     0 == c->devices.count
                         ? "no RDMA device%s (on a Mac: macOS 26.2 or later, RDMA enabled with "
                           "'rdma_ctl enable' in Recovery, and a Thunderbolt 5 cable)"
                         : "no RDMA device is usable%s; run with --mca btl_base_verbose 20 to "
                           "see why",
                     filter.count ? " passes btl_tbrdma_if_include/if_exclude" : "");
            report_no_device(err);
            goto close;
        }
    }

    if (OPAL_SUCCESS != start_component(err, sizeof(err))) {
        opal_output(0, "btl:tbrdma on %s: %s", opal_process_info.nodename, err);
        goto close;
    }
    /* One more for the host module. */
    c->modules = calloc((size_t) usable + 1, sizeof(*c->modules));
    if (NULL == c->modules) {
        opal_output(0, "btl:tbrdma: out of memory creating %d modules", usable);
        goto close;
    }
    for (i = 0; i < c->devices.count; ++i) {
        mca_btl_tbrdma_module_t *module;

        if (!c->devices.devices[i].usable) {
            continue;
        }
        /* Through the engine, the index is the engine's device number. */
        module = new_module(&c->devices.devices[i], c->use_engine ? i : c->num_modules);
        if (NULL == module) {
            opal_output(0, "btl:tbrdma: out of memory creating the module of %s",
                        c->devices.devices[i].name);
            goto free_modules;
        }
        if (OPAL_SUCCESS != mca_btl_tbrdma_module_start(module, err, sizeof(err))) {
            opal_output(0, "btl:tbrdma on %s: not using %s: %s", opal_process_info.nodename,
                        module->device->name, err);
            free(module);
            continue;
        }
        c->modules[c->num_modules++] = module;
        BTL_TBRDMA_VERBOSE(10, "module for device %s (interface %s)", module->device->name,
                           module->device->netdev);
    }
    if (0 == c->num_modules) {
        report_no_device("no RDMA device could be opened for traffic (see above)");
        goto free_modules;
    }
    if (OPAL_SUCCESS != publish_modex()) {
        opal_output(0, "btl:tbrdma on %s: cannot publish its addresses (modex)",
                    opal_process_info.nodename);
        goto free_modules;
    }
    if (c->use_engine && OPAL_SUCCESS != add_host_module(err, sizeof(err))) {
        opal_output(0, "btl:tbrdma on %s: %s", opal_process_info.nodename, err);
        goto free_modules;
    }
    if (!c->use_engine) {
        int rc = tb_keeper_create(TBRDMA_KEEPER_PERIOD_NS, keeper_work, NULL, 0, &c->keeper);
        if (0 != rc) {
            opal_output(0, "btl:tbrdma on %s: no keeper thread (%s): a peer that stays away "
                        "from MPI longer than btl_tbrdma_peer_timeout will be declared dead",
                        opal_process_info.nodename, strerror(-rc));
        } else {
            BTL_TBRDMA_VERBOSE(20, "keeper thread started (%s)",
                               tb_keeper_fenced(c->keeper) ? "fenced entries"
                                                           : "membarrier, no fence on entry");
        }
    }
    c->super.btl_progress = tbrdma_component_progress;
    /* Open MPI frees the array it is given; the component keeps its own. */
    result = malloc((size_t) c->num_modules * sizeof(*result));
    if (NULL == result) {
        goto free_modules;
    }
    for (i = 0; i < c->num_modules; ++i) {
        result[i] = &c->modules[i]->super;
    }
    *num_btls = c->num_modules;
    return result;

free_modules:
    mca_btl_tbrdma_keeper_stop();
    for (i = 0; i < c->num_modules; ++i) {
        mca_btl_tbrdma_module_stop(c->modules[i]);
        free(c->modules[i]);
    }
    free(c->modules);
    c->modules = NULL;
    c->num_modules = 0;
    c->host_module = NULL;
close:
    if (c->engine) {
        mca_btl_tbrdma_engine_stop();
    }
    tb_device_list_close(&c->devices);
    return NULL;
}
