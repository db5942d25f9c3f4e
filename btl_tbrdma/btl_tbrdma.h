/*
 * tbrdma BTL: RDMA over Thunderbolt for Open MPI.
 *
 * One module per usable RDMA device (one per Thunderbolt cable), so ob1
 * stripes large messages across cables by itself.  The transport proper
 * (devices, framing, reliability, connection setup) is in common/, free of
 * Open MPI, and the host engine's client in engine/client/; this component
 * adapts them: descriptors, the modex, reachability, and put/get emulated
 * over the channel (Apple's RDMA has only SEND).
 */
#ifndef BTL_TBRDMA_H
#define BTL_TBRDMA_H

#include "btl_tbrdma_compat.h"

#include "opal/class/opal_free_list.h"
#include "opal/class/opal_hash_table.h"
#include "opal/class/opal_list.h"
#include "opal/mca/btl/base/base.h"
#include "opal/util/proc.h"

#include "tb_channel.h"
#include "tb_device.h"
#include "tb_rma.h"
#include "tb_cm.h"
#include "tb_modex.h"
#include "tb_domain.h"
#include "tb_eclient.h"
#include "tb_keeper.h"
#include "tb_tunables.h"

BEGIN_C_DECLS

/* What a channel completion cookie points at. */
typedef enum {
    TBRDMA_COOKIE_FRAG = 1,  /* a send descriptor (btl_tbrdma_frag.h) */
    TBRDMA_COOKIE_RMA = 2,   /* a put or get this process started */
    TBRDMA_COOKIE_REPLY = 3, /* a reply to a peer's put or get */
} mca_btl_tbrdma_cookie_kind_t;

typedef struct mca_btl_tbrdma_cookie_t {
    int kind;
    /* A completion the keeper held back (btl_tbrdma_held.c). */
    struct mca_btl_tbrdma_cookie_t *held_next;
    struct mca_btl_base_endpoint_t *held_ep;
    int held_status;
} mca_btl_tbrdma_cookie_t;

typedef struct mca_btl_tbrdma_module_t mca_btl_tbrdma_module_t;

/* A registration as the peer sees it: what it names in a put or get. */
struct mca_btl_base_registration_handle_t {
    uint64_t key;
    uint64_t base;
    uint64_t len;
};

typedef enum {
    TBRDMA_EP_IDLE = 0,   /* no connection yet (made on first use) */
    TBRDMA_EP_CONNECTING, /* connection requested; sends queue in the channel */
    TBRDMA_EP_CONNECTED,
    TBRDMA_EP_FAILED, /* the peer or the cable is gone; sends fail */
} mca_btl_tbrdma_ep_state_t;

struct mca_btl_base_endpoint_t {
    opal_list_item_t super;
    mca_btl_tbrdma_module_t *module;
    opal_proc_t *proc;
    opal_process_name_t name;
    tb_device_t *device;      /* this end of the cable: the module's, or for the host
                               * module the one that reaches the peer */
    struct in_addr peer_ipv4; /* the far end of that cable */
    uint16_t peer_cm_port;
    uint8_t peer_gid[16]; /* its device's gid, from its modex entry: its blob must match */
    mca_btl_tbrdma_ep_state_t state;
    tb_conn_t *conn;
    opal_list_t rma_pending;  /* puts and gets awaiting their reply, in order */
    opal_list_t rma_deferred; /* replies the channel could not take yet, in order */
    opal_list_t rma_unsent;   /* requests the path had no room for yet, in order */
    uint64_t rma_progress_ns; /* the latest answer (or the first request since none waited) */
    uint64_t next_rma_id;
    /* Through the host engine: the route number this endpoint's messages
     * name, and the engine behind the peer (from its modex entry). */
    uint16_t route;
    bool route_sent;
    uint8_t peer_engine[TB_WIRE_ENGINE_ID_SIZE];
    uint32_t peer_pid; /* the peer as its engine sees it (its modex entry) */
    bool loop; /* this process itself (btl_tbrdma_loop.c) */
    bool routed; /* through the host module, relayed by the engines of other hosts
                  * (btl_tbrdma_route.c): device is the first hop's */
    unsigned rma_split; /* its puts and gets split over several cables, not all answered
                         * (btl_tbrdma_stripe.c): a flush waits for them too */
    bool split_said;    /* the split was logged */
    bool away_failed; /* failed while the keeper ran: ob1 is told at the next progress */
    char away_why[256];
};
typedef struct mca_btl_base_endpoint_t mca_btl_base_endpoint_t;
OBJ_CLASS_DECLARATION(mca_btl_base_endpoint_t);

struct mca_btl_tbrdma_module_t {
    mca_btl_base_module_t super;
    tb_device_t *device; /* owned by the component's device list */
    int index;           /* in the component's module array and the modex; -1: host */
    /* Through the engine only: the module that reaches every peer any cable
     * reaches, each over its own cable, for osc/rdma, which wants one module
     * reaching every process of a window (in a mesh no cable's module does).
     * Below the cables' exclusivity, so ob1 does not send on it. */
    bool host;
    tb_domain_t *domain;
    tb_cm_t *cm;
    uint16_t cm_port;
    opal_list_t endpoints;
    opal_hash_table_t endpoint_by_name; /* opal_process_name_t as uint64 */
    mca_btl_base_module_error_cb_fn_t error_cb;
    uint64_t last_rma_check_ns;
    mca_btl_base_endpoint_t *self; /* the endpoint of this process, once made */
};

/* Links (other engines) and routes a process keeps through its engine. */
#define TBRDMA_ENGINE_MAX_LINKS 256
#define TBRDMA_ENGINE_MAX_ROUTES 4096

typedef struct mca_btl_tbrdma_component_t {
    mca_btl_base_component_t super;

    /* MCA parameter storage; Open MPI owns the strings. */
    char *verbs_library;
    char *if_include;
    char *if_exclude;
    int checksum;
    tb_tunables_t tunables;

    tb_device_list_t devices;
    int num_modules;
    unsigned add_procs_calls; /* by every module: a round ends each num_modules */
    mca_btl_tbrdma_module_t **modules; /* the cables' modules and the host module (host set) */
    mca_btl_tbrdma_module_t *host_module;

    opal_recursive_mutex_t lock; /* the channel is not thread safe */
    /* The direct path: keeps the channels alive while the application is
     * away from MPI, and what it holds back for the application
     * (btl_tbrdma_held.c). */
    tb_keeper_t *keeper;
    struct tbrdma_held_msg *held_first, *held_last;
    mca_btl_tbrdma_cookie_t *held_sends_first, *held_sends_last;
    size_t held_bytes;
    unsigned away_failures;
    bool held_full_said;
    opal_free_list_t eager_frags;
    opal_free_list_t max_frags;
    size_t eager_frag_size;
    size_t max_frag_size;
    /* Fragment pools (per size class): initial count, ceiling (-1: none), growth step. */
    int free_list_num;
    int free_list_max;
    int free_list_inc;
    tb_rma_table_t rma; /* memory exposed to peers' put/get */
    size_t rma_unsent;  /* requests waiting for room, over all endpoints */
    opal_list_t get_replies; /* GET_RESPs whose data the channel still reads */
    bool started;       /* lock, lists and table exist */
    /* Connection setup: this process's secret (published in the modex) and
     * the job's size, so a request naming a process outside the job is
     * refused before anything is looked up or created for it. */
    uint8_t cm_secret[TB_WIRE_SECRET_SIZE];
    uint32_t job_size; /* 0: unknown */
    uint64_t last_drop_warn_ns;

    /* The path: this process's own queue pairs, or the host engine's. */
    int path_param; /* btl_tbrdma_path: TBRDMA_PATH_* */
    bool use_engine;
    char *engine_path;
    int engine_ring_size;
    uint32_t engine_peer_timeout_ms;
    uint32_t engine_credit_window;
    uint32_t engine_spin_us;
    uint32_t engine_yield;
    uint32_t stripe_min; /* btl_tbrdma_stripe_min (btl_tbrdma_stripe.c) */
    unsigned idle_polls; /* progress calls in a row that found nothing */
    int engine_events;
    int engine_verbose;
    tb_eclient_t *engine;
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
    uint32_t engine_pid_of_me; /* this process as the engine saw it attach */
    bool engine_key_sent;
    unsigned next_route;
    /* The job's cabling as the engines route over it (btl_tbrdma_route.c),
     * and whether the engine was given its table. */
    struct tb_topo *topo;
    int topo_me;
    bool hosts_sent;
    /* Sends through the engine are complete once in the ring; ob1 hears it
     * from progress. */
    struct tbrdma_completion {
        mca_btl_base_endpoint_t *ep;
        void *cookie;
    } *completions;
    size_t ncompletions, completions_cap;
    /* The engine's links, as it announced them. */
    struct {
        bool known;
        int dev;
        uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE];
    } links[TBRDMA_ENGINE_MAX_LINKS];
} mca_btl_tbrdma_component_t;

enum {
    TBRDMA_PATH_AUTO = 0,   /* the engine when the host's ranks would not fit the devices */
    TBRDMA_PATH_DIRECT = 1, /* each process its own queue pairs */
    TBRDMA_PATH_ENGINE = 2, /* always the host engine */
};

/* Largest single put or get: the channel assembles it whole, so it is kept
 * well under the channel's message limit. */
#define TBRDMA_RMA_LIMIT (16u << 20)
/* The largest message this process agrees to receive: a put of
 * TBRDMA_RMA_LIMIT with its header (max_send_size is checked against it). */
#define TBRDMA_MAX_MSG (TBRDMA_RMA_LIMIT + TB_WIRE_RMA_HDR_SIZE)
/* Through the engine a message is at most TB_ENGINE_MAX_MSG bytes. */
#define TBRDMA_ENGINE_RMA_LIMIT (512u << 10)
/* A put or get this large or larger is split over every cable to its peer,
 * at most this many (btl_tbrdma_stripe.c): btl_tbrdma_stripe_min's default. */
#define TBRDMA_STRIPE_MIN (256u << 10)
#define TBRDMA_STRIPE_MAX_CABLES 8u
_Static_assert(TBRDMA_ENGINE_RMA_LIMIT + TB_WIRE_RMA_HDR_SIZE <= TB_ENGINE_MAX_MSG,
               "a put through the engine fits one message");

OPAL_DECLSPEC extern mca_btl_tbrdma_component_t mca_btl_tbrdma_component;

/* How often the keeper looks whether the application is away from MPI. */
#define TBRDMA_KEEPER_PERIOD_NS 10000000ull
/* The most the keeper holds for the application (messages and their headers). */
#define TBRDMA_HELD_MAX_BYTES ((size_t) 256 << 20)

/* The component's lock: Open MPI's between the application's threads (taken
 * only when it uses threads), and the keeper's gate against its thread. */
static inline void mca_btl_tbrdma_lock(void)
{
    OPAL_THREAD_LOCK(&mca_btl_tbrdma_component.lock);
    if (mca_btl_tbrdma_component.keeper) {
        tb_keeper_enter(mca_btl_tbrdma_component.keeper);
    }
}

static inline void mca_btl_tbrdma_unlock(void)
{
    if (mca_btl_tbrdma_component.keeper) {
        tb_keeper_leave(mca_btl_tbrdma_component.keeper);
    }
    OPAL_THREAD_UNLOCK(&mca_btl_tbrdma_component.lock);
}

extern mca_btl_tbrdma_module_t mca_btl_tbrdma_module_template;

/* Help file name for opal_show_help(). */
#define BTL_TBRDMA_HELP_FILE "help-mpi-btl-tbrdma.txt"

/* Print a message from the help file on this process's stderr.  Open MPI
 * 4.x's show_help relay to mpirun can lose a message sent shortly before a
 * process aborts (open-mpi/ompi#8356), exactly when these are needed. */
void mca_btl_tbrdma_show_help(const char *topic, ...);

/* True when btl names tbrdma and no transport that reaches other hosts. */
bool mca_btl_tbrdma_only_network(void);
/* btl_tbrdma_path auto: true if the job takes the host engines
 * (btl_tbrdma_path.c); every process of the job gets the same answer. */
bool mca_btl_tbrdma_path_auto_engine(void);
/* btl_tbrdma_path auto, for a process that will not run tbrdma: if it is its
 * host's first, it says its host has no cable, so that nobody waits for it. */
void mca_btl_tbrdma_path_auto_none(void);

#define BTL_TBRDMA_VERBOSE(level, ...) \
    opal_output_verbose(level, opal_btl_base_framework.framework_output, "btl:tbrdma: " __VA_ARGS__)

/* Module operations (btl_tbrdma_module.c). */
int mca_btl_tbrdma_module_start(mca_btl_tbrdma_module_t *module, char *err, size_t errlen);
void mca_btl_tbrdma_module_stop(mca_btl_tbrdma_module_t *module);
int mca_btl_tbrdma_module_progress(mca_btl_tbrdma_module_t *module, uint64_t now);
/* The keeper's share of progress: everything but what only the application
 * starts (queued put/get requests). */
void mca_btl_tbrdma_module_keep(mca_btl_tbrdma_module_t *module, uint64_t now);

/* btl_tbrdma_held.c: what the keeper holds back for the application. */
bool mca_btl_tbrdma_away(void);
void mca_btl_tbrdma_held_recv(mca_btl_base_endpoint_t *ep, uint8_t tag, const void *data,
                              size_t len);
void mca_btl_tbrdma_held_placed(mca_btl_base_endpoint_t *ep, uint8_t tag, const void *head,
                                size_t skip, size_t len);
void mca_btl_tbrdma_held_send_done(mca_btl_base_endpoint_t *ep, mca_btl_tbrdma_cookie_t *cookie,
                                   int status);
void mca_btl_tbrdma_held_fail(mca_btl_base_endpoint_t *ep, const char *why);
bool mca_btl_tbrdma_held_full(void);
int mca_btl_tbrdma_held_replay(void);
void mca_btl_tbrdma_held_forget(mca_btl_base_endpoint_t *ep);
void mca_btl_tbrdma_held_clear(void);
void mca_btl_tbrdma_keeper_stop(void);
/* A whole message from the peer, in order: hand it to ob1 or serve it. */
void mca_btl_tbrdma_deliver(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *data,
                            size_t len);
/* A channel send completed. */
void mca_btl_tbrdma_send_done(mca_btl_base_endpoint_t *endpoint, void *cookie, int status);

mca_btl_base_endpoint_t *mca_btl_tbrdma_module_find_endpoint(mca_btl_tbrdma_module_t *module,
                                                             const opal_process_name_t *name);
/* The endpoint of proc on this module's cable: the existing one, or one made
 * from proc's modex entry; NULL when proc has no device on this cable. */
mca_btl_base_endpoint_t *mca_btl_tbrdma_module_endpoint_for(mca_btl_tbrdma_module_t *module,
                                                            opal_proc_t *proc);
uint64_t mca_btl_tbrdma_now_ns(void);

/* Cables (btl_tbrdma_cable.c).  Where ports share a subnet, try every
 * remote process's candidate ports at once through the cables that may
 * reach them (what is known is not tried again). */
void mca_btl_tbrdma_cable_probe_procs(opal_proc_t **procs, size_t nprocs);
/* The peer's device (index in mx) at the far end of one of this host's
 * cables, and this end in *device: the module's own cable, or for the host
 * module the first cable that leads to the peer (a rank of this host: the
 * same device, through the engine).  -1: none; TB_MODEX_AMBIGUOUS: only
 * cables that cannot be told apart, said once per host. */
int mca_btl_tbrdma_cable_find(const mca_btl_tbrdma_module_t *module, opal_proc_t *proc,
                              const tb_wire_modex_t *mx, tb_device_t **device);
/* Forget what was learnt (the component closes). */
void mca_btl_tbrdma_cable_forget(void);

/* Endpoints and connections (btl_tbrdma_endpoint.c). */
/* device: this end of the cable to peer_dev (the module's own, but for the
 * host module). */
mca_btl_base_endpoint_t *mca_btl_tbrdma_endpoint_create(mca_btl_tbrdma_module_t *module,
                                                        tb_device_t *device, opal_proc_t *proc,
                                                        const tb_wire_modex_t *peer_mx,
                                                        const tb_wire_modex_dev_t *peer_dev);
void mca_btl_tbrdma_endpoint_release(mca_btl_base_endpoint_t *endpoint);
/* Queue a message to the peer, connecting first if needed.  OPAL_SUCCESS
 * (completion via mca_btl_tbrdma_send_done), OPAL_ERR_UNREACH once the peer
 * failed, or OPAL_ERR_OUT_OF_RESOURCE. */
int mca_btl_tbrdma_endpoint_send(mca_btl_base_endpoint_t *endpoint, uint8_t tag,
                                 const struct iovec *iov, int iovcnt, void *cookie);

/* put/get emulated over the channel (btl_tbrdma_rdma.c). */
int mca_btl_tbrdma_put(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                       void *local_address, uint64_t remote_address,
                       mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                       int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata);
int mca_btl_tbrdma_get(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                       void *local_address, uint64_t remote_address,
                       mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                       int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata);
mca_btl_base_registration_handle_t *mca_btl_tbrdma_register_mem(mca_btl_base_module_t *btl,
                                                                mca_btl_base_endpoint_t *endpoint,
                                                                void *base, size_t size,
                                                                uint32_t flags);
int mca_btl_tbrdma_deregister_mem(mca_btl_base_module_t *btl,
                                  mca_btl_base_registration_handle_t *handle);
/* Atomics, executed by the target on memory it registered for them. */
int mca_btl_tbrdma_atomic_op(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                             uint64_t remote_address,
                             mca_btl_base_registration_handle_t *remote_handle,
                             mca_btl_base_atomic_op_t op, uint64_t operand, int flags, int order,
                             mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                             void *cbdata);
int mca_btl_tbrdma_atomic_fop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                              void *local_address, uint64_t remote_address,
                              mca_btl_base_registration_handle_t *local_handle,
                              mca_btl_base_registration_handle_t *remote_handle,
                              mca_btl_base_atomic_op_t op, uint64_t operand, int flags, int order,
                              mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                              void *cbdata);
int mca_btl_tbrdma_atomic_cswap(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                                void *local_address, uint64_t remote_address,
                                mca_btl_base_registration_handle_t *local_handle,
                                mca_btl_base_registration_handle_t *remote_handle,
                                uint64_t compare, uint64_t value, int flags, int order,
                                mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                                void *cbdata);
/* A put (TB_TAG_RMA_PUT) or get (TB_TAG_RMA_GET_REQ) on endpoint alone; the
 * caller holds the lock.  As put and get, but for OUT_OF_RESOURCE. */
int mca_btl_tbrdma_rma_start(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                             uint64_t remote_address,
                             mca_btl_base_registration_handle_t *local_handle,
                             mca_btl_base_registration_handle_t *remote_handle, size_t size,
                             mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                             void *cbdata);
/* The same, split over every cable that reaches the peer when it is large
 * (btl_tbrdma_stripe.c); takes the lock. */
int mca_btl_tbrdma_rma_striped(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                               uint64_t remote_address,
                               mca_btl_base_registration_handle_t *local_handle,
                               mca_btl_base_registration_handle_t *remote_handle, size_t size,
                               mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                               void *cbdata);
/* Send the requests that waited for room, in order, as far as the path takes
 * them (from progress, while any waits: mca_btl_tbrdma_component.rma_unsent). */
void mca_btl_tbrdma_rma_post_unsent(mca_btl_base_endpoint_t *endpoint);
/* A peer's RMA message (tags below TB_TAG_FIRST_USER). */
void mca_btl_tbrdma_rma_deliver(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *data,
                                size_t len);
void mca_btl_tbrdma_rma_send_done(mca_btl_base_endpoint_t *endpoint, void *cookie, int status);
/* recv_place/recv_placed of the channel: a get's answer written straight
 * into the requester's buffer. */
void *mca_btl_tbrdma_rma_place(mca_btl_base_endpoint_t *endpoint, uint8_t tag, size_t len,
                               const void *head, size_t head_len, size_t *skip);
void mca_btl_tbrdma_rma_placed(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *head,
                               size_t skip, size_t len);
/* The peer is gone: fail every put and get awaiting it. */
void mca_btl_tbrdma_rma_fail_pending(mca_btl_base_endpoint_t *endpoint, int status);
/* Now and then: post the replies that waited for the channel, and return
 * why the endpoint must fail if its puts and gets waited too long for an
 * answer, else NULL. */
const char *mca_btl_tbrdma_rma_progress(mca_btl_base_endpoint_t *endpoint, uint64_t now);
/* The endpoint goes away: its replies in flight no longer belong to it. */
void mca_btl_tbrdma_rma_forget_replies(mca_btl_base_endpoint_t *endpoint);
/* Fail the endpoint (peer gone, protocol violation): pending work ends with
 * an error and ob1 is told. */
void mca_btl_tbrdma_endpoint_fail(mca_btl_base_endpoint_t *endpoint, const char *why);

/* This process as its own peer (btl_tbrdma_loop.c). */
mca_btl_base_endpoint_t *mca_btl_tbrdma_loop_endpoint(mca_btl_tbrdma_module_t *module,
                                                      opal_proc_t *proc);
int mca_btl_tbrdma_loop_send(mca_btl_base_endpoint_t *endpoint, uint8_t tag,
                             const struct iovec *iov, int iovcnt, void *cookie);
int mca_btl_tbrdma_loop_progress(void);
/* The endpoint goes away: what it queued ends now, canceled. */
void mca_btl_tbrdma_loop_forget(mca_btl_base_endpoint_t *endpoint);

/* The path through the host engine (btl_tbrdma_engine.c). */
int mca_btl_tbrdma_engine_start(char *err, size_t errlen);
void mca_btl_tbrdma_engine_stop(void);
uint16_t mca_btl_tbrdma_engine_port(int index);
int mca_btl_tbrdma_engine_send_job_key(void);

/* btl_tbrdma_route.c: hosts reached through other hosts' engines.  init
 * gives the engine the job's table of hosts (once; OPAL_ERR_OUT_OF_RESOURCE:
 * its ring was full, try again); find: the route to the host of engine_id
 * (0, with the first hop's device and the hops), or -1. */
int mca_btl_tbrdma_route_init(void);
int mca_btl_tbrdma_route_find(const uint8_t *engine_id, int *first_dev, unsigned *hops);
void mca_btl_tbrdma_route_fini(void);
int mca_btl_tbrdma_engine_progress(uint64_t now);
/* The endpoint goes away: its sends complete now, canceled. */
void mca_btl_tbrdma_engine_forget(mca_btl_base_endpoint_t *endpoint);
int mca_btl_tbrdma_engine_send(mca_btl_base_endpoint_t *endpoint, uint8_t tag,
                               const struct iovec *iov, int iovcnt, void *cookie);
void *mca_btl_tbrdma_engine_send_begin(mca_btl_base_endpoint_t *endpoint, uint8_t tag, size_t len);
void mca_btl_tbrdma_engine_send_commit(void);
void mca_btl_tbrdma_engine_send_cancel(void);

END_C_DECLS

#endif /* BTL_TBRDMA_H */
