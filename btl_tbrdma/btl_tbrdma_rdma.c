/*
 * tbrdma BTL: put, get and atomics emulated over the channel.
 *
 * Apple's RDMA has no RDMA WRITE or READ and no atomics.  A put is a message
 * carrying the data, answered by PUT_ACK once the target wrote it; a get is
 * a request answered by GET_RESP carrying the data; an atomic is executed by
 * the target with its CPU's atomic instructions and answered by ATOMIC_RESP
 * with the old value (tb_wire.h, RMA section).  The target writes or reads
 * only memory it registered (tb_rma), after checking the key, the range and
 * the access.  The channel delivers in order, so the replies come back in
 * the order of the requests.  Every answer means the target's memory has
 * changed: completion is remote completion, which osc/rdma asks of the BTL
 * it runs on.
 *
 * A request the path cannot take yet (its ring or channel is full) waits on
 * the endpoint, in order, and goes out from progress: a put or get is never
 * refused for want of room, which neither ob1 (5.0.7 frees a fragment it
 * also queues for retry) nor osc/rdma would take well.  So do requests past
 * the window of unanswered ones (TB_WIRE_RMA_WINDOW): the target then never
 * holds more answers than it promised, however many requests an epoch makes.
 *
 * Every message is parsed and checked whole (tb_rma_parse) before use; a
 * peer that breaks the protocol (a reply nobody asked for, a message that
 * does not parse) fails its endpoint, so nothing waits for an answer that
 * cannot come.  A reply the channel cannot take yet waits in order on the
 * endpoint, and answers that stop coming fail it too (mca_btl_tbrdma_rma_progress).
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include <stdlib.h>
#include <string.h>

typedef struct tbrdma_rma_req_t {
    opal_list_item_t super;
    mca_btl_tbrdma_cookie_t cookie;
    opal_list_item_t unsent; /* in the endpoint's rma_unsent while the path had no room */
    tb_wire_rma_hdr_t hdr;   /* the request as sent */
    tb_wire_rma_atomic_t atomic;
    uint8_t tag;
    int queued;  /* in rma_unsent: not handed to the path yet */
    int sent;    /* the channel finished sending the request */
    int replied; /* the reply came (status in reply_status) */
    int placed;  /* a get whose answer the channel writes straight to local_address */
    int reply_status;
    void *local_address;
    size_t size; /* an atomic: its width */
    mca_btl_base_registration_handle_t *local_handle;
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
} tbrdma_rma_req_t;
static void req_construct(tbrdma_rma_req_t *req)
{
    OBJ_CONSTRUCT(&req->unsent, opal_list_item_t);
}

static void req_destruct(tbrdma_rma_req_t *req)
{
    OBJ_DESTRUCT(&req->unsent);
}

OBJ_CLASS_INSTANCE(tbrdma_rma_req_t, opal_list_item_t, req_construct, req_destruct);

/* A reply must outlive the call that sends it: the channel reads it later.
 * A GET_RESP's data is the registered memory itself until the channel has
 * copied it; if the region is withdrawn first, the channel is told to copy
 * the rest at once (mca_btl_tbrdma_deregister_mem). */
typedef struct tbrdma_rma_reply_t {
    opal_list_item_t super; /* in the component's get_replies, or the endpoint's deferred */
    mca_btl_tbrdma_cookie_t cookie;
    tb_wire_rma_hdr_t hdr;
    mca_btl_base_endpoint_t *endpoint;
    uint8_t tag;
    uint64_t key;     /* the region a GET_RESP reads, 0 otherwise */
    const void *data; /* GET_RESP: what to send after the header */
    size_t len;
    void *copy;       /* a deferred GET_RESP's own copy of the data */
    uint64_t old;     /* ATOMIC_RESP: the data, little-endian */
} tbrdma_rma_reply_t;
OBJ_CLASS_INSTANCE(tbrdma_rma_reply_t, opal_list_item_t, NULL, NULL);

#define REQ_OF_COOKIE(c) ((tbrdma_rma_req_t *) ((char *) (c) -offsetof(tbrdma_rma_req_t, cookie)))
#define REQ_OF_UNSENT(i) ((tbrdma_rma_req_t *) ((char *) (i) -offsetof(tbrdma_rma_req_t, unsent)))

static const char *request_name(uint8_t tag)
{
    switch (tag) {
    case TB_TAG_RMA_PUT:
        return "put";
    case TB_TAG_RMA_GET_REQ:
        return "get";
    default:
        return "atomic";
    }
}

static uint8_t answer_tag(uint8_t request)
{
    switch (request) {
    case TB_TAG_RMA_PUT:
        return TB_TAG_RMA_PUT_ACK;
    case TB_TAG_RMA_GET_REQ:
        return TB_TAG_RMA_GET_RESP;
    default:
        return TB_TAG_RMA_ATOMIC_RESP;
    }
}

/* The largest put or get this process serves: one message on its path. */
static size_t rma_limit(void)
{
    return mca_btl_tbrdma_component.use_engine ? TBRDMA_ENGINE_RMA_LIMIT : TBRDMA_RMA_LIMIT;
}

static int rma_status_to_opal(int status)
{
    return TB_RMA_OK == status ? OPAL_SUCCESS : OPAL_ERR_BAD_PARAM;
}

/* Both the send and the reply are needed before the caller hears back: the
 * caller's buffer is read by the channel until the send completes. */
static void maybe_complete(mca_btl_base_endpoint_t *endpoint, tbrdma_rma_req_t *req)
{
    if (!req->sent || !req->replied) {
        return;
    }
    /* osc/rdma gives none when it waits with btl_flush instead. */
    if (NULL != req->cbfunc) {
        req->cbfunc(&endpoint->module->super, endpoint, req->local_address, req->local_handle,
                    req->cbcontext, req->cbdata, req->reply_status);
    }
    OBJ_RELEASE(req);
}

/* No answer will come: the request ends with status, once its send is
 * reported too. */
static void end_unanswered(mca_btl_base_endpoint_t *endpoint, tbrdma_rma_req_t *req, int status)
{
    opal_list_remove_item(&endpoint->rma_pending, &req->super);
    req->replied = 1;
    req->reply_status = status;
    maybe_complete(endpoint, req);
}

/* Hand the request to the path: OPAL_SUCCESS, OPAL_ERR_OUT_OF_RESOURCE
 * when it has no room yet, or the endpoint's failure. */
static int request_post(mca_btl_base_endpoint_t *endpoint, tbrdma_rma_req_t *req)
{
    struct iovec iov[2];
    int n = 1;

    iov[0].iov_base = &req->hdr;
    iov[0].iov_len = sizeof(req->hdr);
    if (TB_TAG_RMA_PUT == req->tag) {
        iov[1].iov_base = req->local_address;
        iov[1].iov_len = req->size;
        n = 2;
    } else if (TB_TAG_RMA_ATOMIC == req->tag) {
        iov[1].iov_base = &req->atomic;
        iov[1].iov_len = sizeof(req->atomic);
        n = 2;
    }
    return mca_btl_tbrdma_endpoint_send(endpoint, req->tag, iov, n, &req->cookie);
}

/* Requests handed to the path and not answered yet. */
static size_t unanswered(mca_btl_base_endpoint_t *endpoint)
{
    return opal_list_get_size(&endpoint->rma_pending) - opal_list_get_size(&endpoint->rma_unsent);
}

/* Requests go out in order: once one waits for room or for the window, the
 * rest wait behind it. */
void mca_btl_tbrdma_rma_post_unsent(mca_btl_base_endpoint_t *endpoint)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    while (!opal_list_is_empty(&endpoint->rma_unsent)
           && unanswered(endpoint) < TB_WIRE_RMA_WINDOW) {
        tbrdma_rma_req_t *req = REQ_OF_UNSENT(opal_list_remove_first(&endpoint->rma_unsent));
        int rc;

        /* Off the queue before the path sees it: a path that fails the
         * endpoint meanwhile ends it as a sent request, once. */
        req->queued = 0;
        c->rma_unsent--;
        rc = request_post(endpoint, req);
        if (OPAL_ERR_OUT_OF_RESOURCE == rc) {
            opal_list_prepend(&endpoint->rma_unsent, &req->unsent);
            req->queued = 1;
            c->rma_unsent++;
            return;
        }
        if (OPAL_SUCCESS != rc) {
            /* The endpoint failed meanwhile: it was never sent. */
            req->sent = 1;
            end_unanswered(endpoint, req, rc);
        }
    }
}

static int start(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                 uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                 mca_btl_base_registration_handle_t *remote_handle, size_t size,
                 const tb_wire_rma_atomic_t *atomic, mca_btl_base_rdma_completion_fn_t cbfunc,
                 void *cbcontext, void *cbdata)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tbrdma_rma_req_t *req;
    int rc;

    if (TBRDMA_EP_FAILED == endpoint->state) {
        return OPAL_ERR_UNREACH;
    }
    /* Only this process's own memory goes without a handle: osc/rdma 4.1
     * runs atomics on itself so, at addresses it reads directly too. */
    if (NULL == remote_handle && !endpoint->loop) {
        return OPAL_ERR_BAD_PARAM;
    }
    req = OBJ_NEW(tbrdma_rma_req_t);
    if (NULL == req) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    req->cookie.kind = TBRDMA_COOKIE_RMA;
    memset(&req->hdr, 0, sizeof(req->hdr));
    req->hdr.version = TB_WIRE_RMA_VERSION;
    req->hdr.req_id = tb_wire_le64(endpoint->next_rma_id++);
    req->hdr.key = tb_wire_le64(remote_handle ? remote_handle->key : 0);
    req->hdr.addr = tb_wire_le64(remote_address);
    req->hdr.len = tb_wire_le64(size);
    req->tag = tag;
    /* OBJ_NEW does not clear: a recycled request would otherwise start out
     * sent and replied, completing at its first event and again at its last. */
    req->queued = 0;
    req->sent = 0;
    req->replied = 0;
    req->placed = 0;
    req->reply_status = OPAL_SUCCESS;
    req->local_address = local_address;
    req->size = size;
    req->local_handle = local_handle;
    req->cbfunc = cbfunc;
    req->cbcontext = cbcontext;
    req->cbdata = cbdata;
    if (atomic) {
        req->atomic = *atomic;
    }

    if (opal_list_is_empty(&endpoint->rma_pending)) {
        endpoint->rma_progress_ns = mca_btl_tbrdma_now_ns(); /* waiting starts now */
    }
    rc = opal_list_is_empty(&endpoint->rma_unsent) && unanswered(endpoint) < TB_WIRE_RMA_WINDOW
             ? OPAL_SUCCESS
             : OPAL_ERR_OUT_OF_RESOURCE;
    opal_list_append(&endpoint->rma_pending, &req->super);
    if (OPAL_SUCCESS == rc) {
        rc = request_post(endpoint, req);
    }
    if (OPAL_ERR_OUT_OF_RESOURCE == rc) {
        opal_list_append(&endpoint->rma_unsent, &req->unsent);
        req->queued = 1;
        c->rma_unsent++;
        return OPAL_SUCCESS;
    }
    if (OPAL_SUCCESS != rc) {
        opal_list_remove_item(&endpoint->rma_pending, &req->super);
        OBJ_RELEASE(req);
    }
    return rc;
}

static int start_locked(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                        uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                        mca_btl_base_registration_handle_t *remote_handle, size_t size,
                        const tb_wire_rma_atomic_t *atomic,
                        mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    int rc;

    mca_btl_tbrdma_lock();
    rc = start(endpoint, tag, local_address, remote_address, local_handle, remote_handle, size,
               atomic, cbfunc, cbcontext, cbdata);
    mca_btl_tbrdma_unlock();
    return rc;
}

int mca_btl_tbrdma_rma_start(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                             uint64_t remote_address,
                             mca_btl_base_registration_handle_t *local_handle,
                             mca_btl_base_registration_handle_t *remote_handle, size_t size,
                             mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                             void *cbdata)
{
    return start(endpoint, tag, local_address, remote_address, local_handle, remote_handle, size,
                 NULL, cbfunc, cbcontext, cbdata);
}

int mca_btl_tbrdma_put(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                       void *local_address, uint64_t remote_address,
                       mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                       int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata)
{
    int rc = mca_btl_tbrdma_rma_striped(endpoint, TB_TAG_RMA_PUT, local_address, remote_address,
                                        local_handle, remote_handle, size, cbfunc, cbcontext,
                                        cbdata);

    /* ob1 (5.0.7) both queues a put fragment for retry and frees it when put
     * reports OUT_OF_RESOURCE (here only out of memory); any other error
     * makes it send the data instead. */
    return OPAL_ERR_OUT_OF_RESOURCE == rc ? OPAL_ERROR : rc;
}

int mca_btl_tbrdma_get(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                       void *local_address, uint64_t remote_address,
                       mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                       int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata)
{
    return mca_btl_tbrdma_rma_striped(endpoint, TB_TAG_RMA_GET_REQ, local_address, remote_address,
                                      local_handle, remote_handle, size, cbfunc, cbcontext,
                                      cbdata);
}

/* Open MPI's atomic operation, as the wire names it; 0 if there is none. */
static uint8_t wire_aop(mca_btl_base_atomic_op_t op)
{
    switch (op) {
    case MCA_BTL_ATOMIC_ADD:
        return TB_RMA_AOP_ADD;
    case MCA_BTL_ATOMIC_AND:
        return TB_RMA_AOP_AND;
    case MCA_BTL_ATOMIC_OR:
        return TB_RMA_AOP_OR;
    case MCA_BTL_ATOMIC_XOR:
        return TB_RMA_AOP_XOR;
    case MCA_BTL_ATOMIC_LAND:
        return TB_RMA_AOP_LAND;
    case MCA_BTL_ATOMIC_LOR:
        return TB_RMA_AOP_LOR;
    case MCA_BTL_ATOMIC_LXOR:
        return TB_RMA_AOP_LXOR;
    case MCA_BTL_ATOMIC_SWAP:
        return TB_RMA_AOP_SWAP;
    case MCA_BTL_ATOMIC_MIN:
        return TB_RMA_AOP_MIN;
    case MCA_BTL_ATOMIC_MAX:
        return TB_RMA_AOP_MAX;
    default:
        return 0;
    }
}

static int start_atomic(mca_btl_base_endpoint_t *endpoint, void *local_address,
                        uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                        mca_btl_base_registration_handle_t *remote_handle, uint8_t aop,
                        uint64_t operand, uint64_t compare, int flags,
                        mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    size_t width = (flags & MCA_BTL_ATOMIC_FLAG_32BIT) ? 4 : 8;
    tb_wire_rma_atomic_t a;

    /* Integers only (the atomic flags claim no FLOAT), at the width's alignment. */
    if (0 == aop || (flags & MCA_BTL_ATOMIC_FLAG_FLOAT) || 0 != remote_address % width) {
        return OPAL_ERR_NOT_AVAILABLE;
    }
    memset(&a, 0, sizeof(a));
    a.op = aop;
    a.operand = tb_wire_le64(operand);
    a.compare = tb_wire_le64(compare);
    return start_locked(endpoint, TB_TAG_RMA_ATOMIC, local_address, remote_address, local_handle,
                        remote_handle, width, &a, cbfunc, cbcontext, cbdata);
}

int mca_btl_tbrdma_atomic_op(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                             uint64_t remote_address,
                             mca_btl_base_registration_handle_t *remote_handle,
                             mca_btl_base_atomic_op_t op, uint64_t operand, int flags, int order,
                             mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                             void *cbdata)
{
    return start_atomic(endpoint, NULL, remote_address, NULL, remote_handle, wire_aop(op),
                        operand, 0, flags, cbfunc, cbcontext, cbdata);
}

int mca_btl_tbrdma_atomic_fop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                              void *local_address, uint64_t remote_address,
                              mca_btl_base_registration_handle_t *local_handle,
                              mca_btl_base_registration_handle_t *remote_handle,
                              mca_btl_base_atomic_op_t op, uint64_t operand, int flags, int order,
                              mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                              void *cbdata)
{
    return start_atomic(endpoint, local_address, remote_address, local_handle, remote_handle,
                        wire_aop(op), operand, 0, flags, cbfunc, cbcontext, cbdata);
}

int mca_btl_tbrdma_atomic_cswap(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                                void *local_address, uint64_t remote_address,
                                mca_btl_base_registration_handle_t *local_handle,
                                mca_btl_base_registration_handle_t *remote_handle,
                                uint64_t compare, uint64_t value, int flags, int order,
                                mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                                void *cbdata)
{
    return start_atomic(endpoint, local_address, remote_address, local_handle, remote_handle,
                        TB_RMA_AOP_CSWAP, value, compare, flags, cbfunc, cbcontext, cbdata);
}

mca_btl_base_registration_handle_t *mca_btl_tbrdma_register_mem(mca_btl_base_module_t *btl,
                                                                mca_btl_base_endpoint_t *endpoint,
                                                                void *base, size_t size,
                                                                uint32_t flags)
{
    mca_btl_base_registration_handle_t *handle = malloc(sizeof(*handle));
    uint32_t access = 0;
    int rc;

    if (NULL == handle) {
        return NULL;
    }
    if (flags & MCA_BTL_REG_FLAG_REMOTE_READ) {
        access |= TB_RMA_ACCESS_READ;
    }
    if (flags & MCA_BTL_REG_FLAG_REMOTE_WRITE) {
        access |= TB_RMA_ACCESS_WRITE;
    }
    if (flags & MCA_BTL_REG_FLAG_REMOTE_ATOMIC) {
        access |= TB_RMA_ACCESS_ATOMIC;
    }
    mca_btl_tbrdma_lock();
    rc = tb_rma_register(&mca_btl_tbrdma_component.rma, base, size, access, &handle->key);
    mca_btl_tbrdma_unlock();
    if (0 != rc) {
        free(handle);
        return NULL;
    }
    handle->base = (uint64_t) (uintptr_t) base;
    handle->len = size;
    BTL_TBRDMA_VERBOSE(50, "exposed %zu bytes at %p to %s under key %016llx", size, base,
                       (access & TB_RMA_ACCESS_WRITE) ? "put and get" : "get",
                       (unsigned long long) handle->key);
    return handle;
}

int mca_btl_tbrdma_deregister_mem(mca_btl_base_module_t *btl,
                                  mca_btl_base_registration_handle_t *handle)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    BTL_TBRDMA_VERBOSE(50, "withdrew key %016llx", (unsigned long long) handle->key);
    /* Open MPI's registration caches may hand handles back after the
     * component closed; by then the table is gone and nothing is exposed. */
    if (c->started) {
        tbrdma_rma_reply_t *reply;
        mca_btl_tbrdma_lock();
        (void) tb_rma_deregister(&c->rma, handle->key);
        /* The memory may be freed once this returns: answers still reading
         * it take their own copy of what is left. */
    again:
        OPAL_LIST_FOREACH (reply, &c->get_replies, tbrdma_rma_reply_t) {
            if (reply->key == handle->key && reply->endpoint->conn
                && TB_CHAN_ENOMEM == tb_channel_send_detach(tb_conn_channel(reply->endpoint->conn),
                                                            &reply->cookie)) {
                /* No memory for the copy: end the answer rather than let it
                 * read memory that is about to go.  Failing the endpoint
                 * aborts its channel, which frees its answers from this list
                 * (the endpoint is not failed yet: a failed one has no
                 * channel sends left): walk the list again. */
                mca_btl_tbrdma_endpoint_fail(reply->endpoint, "out of memory withdrawing a "
                                                              "region a get still reads");
                goto again;
            }
        }
        mca_btl_tbrdma_unlock();
    }
    free(handle);
    return OPAL_SUCCESS;
}

static void reply_free(tbrdma_rma_reply_t *reply)
{
    free(reply->copy);
    OBJ_RELEASE(reply);
}

/* Hand a reply to the channel: OPAL_SUCCESS, OPAL_ERR_OUT_OF_RESOURCE when it
 * cannot take it yet, or the endpoint's failure. */
static int reply_post(tbrdma_rma_reply_t *reply)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    struct iovec iov[2];
    int rc;

    iov[0].iov_base = &reply->hdr;
    iov[0].iov_len = sizeof(reply->hdr);
    iov[1].iov_base = (void *) reply->data;
    iov[1].iov_len = reply->len;
    rc = mca_btl_tbrdma_endpoint_send(reply->endpoint, reply->tag, iov, reply->len ? 2 : 1,
                                      &reply->cookie);
    if (OPAL_SUCCESS == rc) {
        if (0 != reply->key) {
            opal_list_append(&c->get_replies, &reply->super);
        }
    }
    return rc;
}

/* Replies go out in the order of the requests: once one waits, the rest
 * queue behind it. */
static void reply_queue(mca_btl_base_endpoint_t *endpoint, tbrdma_rma_reply_t *reply)
{
    /* A correct requester keeps within the window (start()): more is a
     * peer that breaks the protocol. */
    if (opal_list_get_size(&endpoint->rma_deferred) >= TB_WIRE_RMA_WINDOW) {
        reply_free(reply);
        mca_btl_tbrdma_endpoint_fail(endpoint, "the peer kept more put/get requests unanswered "
                                               "than the protocol's window (protocol violation)");
        return;
    }
    if (0 != reply->key && NULL == reply->copy) {
        /* The channel will read it later than the region may live. */
        reply->copy = malloc(reply->len);
        if (NULL == reply->copy) {
            reply_free(reply);
            mca_btl_tbrdma_endpoint_fail(endpoint, "out of memory answering a get");
            return;
        }
        memcpy(reply->copy, reply->data, reply->len);
        reply->data = reply->copy;
        reply->key = 0;
    }
    opal_list_append(&endpoint->rma_deferred, &reply->super);
}

/* Post the replies that waited, in order, as far as the channel takes them. */
static void post_deferred(mca_btl_base_endpoint_t *endpoint)
{
    while (!opal_list_is_empty(&endpoint->rma_deferred)) {
        tbrdma_rma_reply_t *reply =
            (tbrdma_rma_reply_t *) opal_list_get_first(&endpoint->rma_deferred);
        int rc;

        opal_list_remove_item(&endpoint->rma_deferred, &reply->super);
        rc = reply_post(reply);
        if (OPAL_ERR_OUT_OF_RESOURCE == rc) {
            opal_list_prepend(&endpoint->rma_deferred, &reply->super);
            return;
        }
        if (OPAL_SUCCESS != rc) {
            reply_free(reply); /* the endpoint failed: nobody waits for it */
        }
    }
}

/* hdr_len: the header's len (an atomic's width, a get's size); data and
 * len: what follows the header. */
static void send_reply(mca_btl_base_endpoint_t *endpoint, uint8_t tag, uint64_t req_id,
                       int status, uint64_t key, uint64_t hdr_len, const void *data, size_t len)
{
    tbrdma_rma_reply_t *reply = OBJ_NEW(tbrdma_rma_reply_t);
    int rc;

    if (NULL == reply) {
        mca_btl_tbrdma_endpoint_fail(endpoint, "out of memory answering a put or get");
        return;
    }
    reply->cookie.kind = TBRDMA_COOKIE_REPLY;
    memset(&reply->hdr, 0, sizeof(reply->hdr));
    reply->hdr.version = TB_WIRE_RMA_VERSION;
    reply->hdr.status = (uint8_t) status;
    reply->hdr.req_id = tb_wire_le64(req_id);
    reply->hdr.len = tb_wire_le64(hdr_len);
    reply->endpoint = endpoint;
    reply->tag = tag;
    reply->key = TB_RMA_OK == status ? key : 0;
    reply->data = data;
    reply->len = len;
    reply->copy = NULL;
    if (TB_TAG_RMA_ATOMIC_RESP == tag && TB_RMA_OK == status) {
        /* The answer outlives this call: it carries its own value. */
        memcpy(&reply->old, data, sizeof(reply->old));
        reply->data = &reply->old;
    }
    if (opal_list_is_empty(&endpoint->rma_deferred)) {
        rc = reply_post(reply);
        if (OPAL_SUCCESS == rc) {
            return;
        }
        if (OPAL_ERR_OUT_OF_RESOURCE != rc) {
            reply_free(reply);
            return;
        }
    }
    reply_queue(endpoint, reply);
}

/* A peer's PUT or GET_REQ: check it against what this process registered,
 * then serve it or refuse it.  A refusal is logged: it means a peer holds a
 * stale or forged handle, which is a bug worth seeing. */
static void serve(mca_btl_base_endpoint_t *endpoint, const tb_rma_msg_t *m, int status)
{
    static const uint32_t access[] = {
        [TB_TAG_RMA_PUT] = TB_RMA_ACCESS_WRITE,
        [TB_TAG_RMA_GET_REQ] = TB_RMA_ACCESS_READ,
        [TB_TAG_RMA_ATOMIC] = TB_RMA_ACCESS_ATOMIC,
    };
    uint64_t old = 0;
    void *local = NULL;

    if (TB_RMA_OK == status && endpoint->loop && 0 == m->key) {
        /* From this process to itself without a handle (start()): nothing
         * from outside reaches the loopback. */
        local = (void *) (uintptr_t) m->addr;
    } else if (TB_RMA_OK == status) {
        status = tb_rma_check(&mca_btl_tbrdma_component.rma, m->key, m->addr, m->len,
                              access[m->tag], &local);
    }
    if (TB_RMA_OK == status && TB_TAG_RMA_ATOMIC == m->tag) {
        status = tb_rma_atomic(local, (unsigned) m->len, m->aop, m->operand, m->compare, &old);
    }
    if (TB_RMA_OK != status) {
        opal_output(0,
                    "btl:tbrdma on %s: refused a%s %s of %llu bytes at 0x%llx (key %016llx) from "
                    "%s: %s; nothing was %s",
                    opal_process_info.nodename, TB_TAG_RMA_ATOMIC == m->tag ? "n" : "",
                    request_name(m->tag), (unsigned long long) m->len,
                    (unsigned long long) m->addr, (unsigned long long) m->key,
                    opal_get_proc_hostname(endpoint->proc), tb_rma_status_string(status),
                    TB_TAG_RMA_GET_REQ == m->tag ? "read" : "written");
        /* A refused atomic still names a width the requester can parse. */
        send_reply(endpoint, answer_tag(m->tag), m->req_id, status, 0,
                   TB_TAG_RMA_ATOMIC != m->tag ? 0 : 4 == m->len ? 4 : 8, NULL, 0);
        return;
    }
    switch (m->tag) {
    case TB_TAG_RMA_PUT:
        memcpy(local, m->payload, m->len);
        send_reply(endpoint, TB_TAG_RMA_PUT_ACK, m->req_id, TB_RMA_OK, 0, 0, NULL, 0);
        break;
    case TB_TAG_RMA_GET_REQ:
        send_reply(endpoint, TB_TAG_RMA_GET_RESP, m->req_id, TB_RMA_OK, m->key, m->len, local,
                   m->len);
        break;
    default:
        old = tb_wire_le64(old);
        send_reply(endpoint, TB_TAG_RMA_ATOMIC_RESP, m->req_id, TB_RMA_OK, 0, m->len, &old,
                   sizeof(old));
        break;
    }
}

/* A reply to the oldest request still waiting. */
static void complete(mca_btl_base_endpoint_t *endpoint, const tb_rma_msg_t *m, bool placed)
{
    tbrdma_rma_req_t *req = NULL;
    int status = m->status;
    uint8_t want = 0;

    if (!opal_list_is_empty(&endpoint->rma_pending)) {
        req = (tbrdma_rma_req_t *) opal_list_get_first(&endpoint->rma_pending);
        want = answer_tag(req->tag);
    }
    if (NULL == req || req->queued || tb_wire_le64(req->hdr.req_id) != m->req_id
        || want != m->tag
        || (TB_RMA_OK == status && TB_TAG_RMA_PUT_ACK != m->tag && m->len != req->size)
        || placed != (bool) req->placed) {
        mca_btl_tbrdma_endpoint_fail(endpoint, "the peer answered a put, get or atomic that was "
                                               "not asked (protocol violation)");
        return;
    }
    if (TB_RMA_OK == status && TB_TAG_RMA_GET_RESP == m->tag && !placed) {
        memcpy(req->local_address, m->payload, m->payload_len);
    }
    if (TB_RMA_OK == status && TB_TAG_RMA_ATOMIC_RESP == m->tag && NULL != req->local_address) {
        uint64_t old;
        memcpy(&old, m->payload, sizeof(old));
        old = tb_wire_le64(old);
        if (4 == req->size) {
            uint32_t narrow = (uint32_t) old;
            memcpy(req->local_address, &narrow, sizeof(narrow));
        } else {
            memcpy(req->local_address, &old, sizeof(old));
        }
    }
    if (TB_RMA_OK != status) {
        opal_output(0, "btl:tbrdma on %s: %s of %zu bytes refused by %s: %s",
                    opal_process_info.nodename, request_name(req->tag), req->size,
                    opal_get_proc_hostname(endpoint->proc), tb_rma_status_string(status));
    }
    opal_list_remove_item(&endpoint->rma_pending, &req->super);
    endpoint->rma_progress_ns = mca_btl_tbrdma_now_ns();
    req->replied = 1;
    req->reply_status = rma_status_to_opal(status);
    maybe_complete(endpoint, req);
}

void mca_btl_tbrdma_rma_deliver(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *data,
                                size_t len)
{
    tb_rma_msg_t m;
    int status = tb_rma_parse(tag, data, len, rma_limit(), &m);
    bool request = tb_rma_is_request(tag);

    /* A malformed request with a readable header is answered, so its
     * requester hears why; anything else malformed ends the connection. */
    if (TB_RMA_OK != status && !(request && len >= sizeof(tb_wire_rma_hdr_t))) {
        char why[160];
        snprintf(why, sizeof(why), "the peer sent a malformed put/get message (tag %u, %zu "
                 "bytes)", (unsigned) tag, len);
        mca_btl_tbrdma_endpoint_fail(endpoint, why);
        return;
    }
    if (request) {
        serve(endpoint, &m, status);
    } else {
        complete(endpoint, &m, false);
    }
}

/* A get's answer of more than one frame begins: its data can go straight to
 * the requester's buffer (one copy fewer), once its header names a get this
 * process is waiting for, of exactly that size. */
void *mca_btl_tbrdma_rma_place(mca_btl_base_endpoint_t *endpoint, uint8_t tag, size_t len,
                               const void *head, size_t head_len, size_t *skip)
{
    tbrdma_rma_req_t *req;
    tb_rma_msg_t m;

    if (TB_TAG_RMA_GET_RESP != tag
        || TB_RMA_OK != tb_rma_parse_head(tag, head, head_len, len, rma_limit(), &m)
        || TB_RMA_OK != m.status) {
        return NULL;
    }
    OPAL_LIST_FOREACH (req, &endpoint->rma_pending, tbrdma_rma_req_t) {
        if (tb_wire_le64(req->hdr.req_id) == m.req_id) {
            if (TB_TAG_RMA_GET_REQ != req->tag || req->size != m.len || req->placed
                || req->queued) {
                return NULL; /* complete() will find out */
            }
            req->placed = 1;
            *skip = sizeof(tb_wire_rma_hdr_t);
            return req->local_address;
        }
    }
    return NULL;
}

void mca_btl_tbrdma_rma_placed(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *head,
                               size_t skip, size_t len)
{
    tb_rma_msg_t m;

    if (TB_RMA_OK != tb_rma_parse_head(tag, head, skip, len, rma_limit(), &m)) {
        mca_btl_tbrdma_endpoint_fail(endpoint, "a placed put/get answer does not parse");
        return;
    }
    complete(endpoint, &m, true);
}

/* A peer that keeps its channel alive but never answers a put or get would
 * keep a flush waiting for ever; one whose answers are merely slow (a lossy
 * link, a long queue before them) keeps its channel moving, and is never
 * failed for it (tb_rma_answers_overdue).  Without a channel yet, connection
 * setup has its own deadline. */
static const char *overdue(mca_btl_base_endpoint_t *endpoint, uint64_t now)
{
    uint64_t timeout = tb_tunables_stall_timeout_ns(&mca_btl_tbrdma_component.tunables);

    if (opal_list_is_empty(&endpoint->rma_pending) || NULL == endpoint->conn
        || !tb_rma_answers_overdue(now, endpoint->rma_progress_ns,
                                   tb_channel_progress_ns(tb_conn_channel(endpoint->conn)),
                                   timeout)) {
        return NULL;
    }
    return "puts or gets got no answer, and the channel to the peer moved nothing, within "
           "btl_tbrdma_stall_timeout";
}

const char *mca_btl_tbrdma_rma_progress(mca_btl_base_endpoint_t *endpoint, uint64_t now)
{
    post_deferred(endpoint);
    /* Through the engine, liveness is the engines' business: a target that
     * computes for long answers late, and is not dead for it. */
    return mca_btl_tbrdma_component.use_engine ? NULL : overdue(endpoint, now);
}

void mca_btl_tbrdma_rma_forget_replies(mca_btl_base_endpoint_t *endpoint)
{
    while (!opal_list_is_empty(&endpoint->rma_deferred)) {
        reply_free((tbrdma_rma_reply_t *) opal_list_remove_first(&endpoint->rma_deferred));
    }
}

void mca_btl_tbrdma_rma_send_done(mca_btl_base_endpoint_t *endpoint, void *cookie, int status)
{
    mca_btl_tbrdma_cookie_t *c = cookie;
    tbrdma_rma_req_t *req;

    if (TBRDMA_COOKIE_REPLY == c->kind) {
        tbrdma_rma_reply_t *reply =
            (tbrdma_rma_reply_t *) ((char *) c - offsetof(tbrdma_rma_reply_t, cookie));
        if (0 != reply->key) {
            opal_list_remove_item(&mca_btl_tbrdma_component.get_replies, &reply->super);
        }
        reply_free(reply);
        return;
    }
    req = REQ_OF_COOKIE(c);
    req->sent = 1;
    if (OPAL_SUCCESS != status && !req->replied) {
        /* The channel failed: no reply will come. */
        end_unanswered(endpoint, req, status);
        return;
    }
    maybe_complete(endpoint, req);
}

void mca_btl_tbrdma_rma_fail_pending(mca_btl_base_endpoint_t *endpoint, int status)
{
    tbrdma_rma_req_t *req, *next;

    /* What never went out has no send to complete: it ends now. */
    while (!opal_list_is_empty(&endpoint->rma_unsent)) {
        req = REQ_OF_UNSENT(opal_list_remove_first(&endpoint->rma_unsent));
        mca_btl_tbrdma_component.rma_unsent--;
        req->queued = 0;
        req->sent = 1;
    }
    /* No answer comes now.  A request whose send is not reported yet (in
     * the loopback's queue, a completion batch or a channel) completes when
     * it is; the rest complete here. */
    OPAL_LIST_FOREACH_SAFE (req, next, &endpoint->rma_pending, tbrdma_rma_req_t) {
        end_unanswered(endpoint, req, status);
    }
}
