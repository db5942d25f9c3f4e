/*
 * tbrdma BTL: put and get emulated over the channel.
 *
 * Apple's RDMA has no RDMA WRITE or READ.  A put is a message carrying the
 * data, answered by PUT_ACK once the target wrote it; a get is a request
 * answered by GET_RESP carrying the data (tb_wire.h, RMA section).  The
 * target writes or reads only memory it registered (tb_rma), after checking
 * the key, the range and the access.  The channel delivers in order, so the
 * replies come back in the order of the requests.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include <stdlib.h>
#include <string.h>

typedef struct tbrdma_rma_req_t {
    opal_list_item_t super;
    mca_btl_tbrdma_cookie_t cookie;
    tb_wire_rma_hdr_t hdr; /* the request as sent */
    uint8_t tag;
    int sent;    /* the channel finished sending the request */
    int replied; /* the reply came (status in reply_status) */
    int reply_status;
    void *local_address;
    size_t size;
    mca_btl_base_registration_handle_t *local_handle;
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
} tbrdma_rma_req_t;
OBJ_CLASS_INSTANCE(tbrdma_rma_req_t, opal_list_item_t, NULL, NULL);

/* A reply must outlive the call that sends it: the channel reads it later. */
typedef struct tbrdma_rma_reply_t {
    mca_btl_tbrdma_cookie_t cookie;
    tb_wire_rma_hdr_t hdr;
} tbrdma_rma_reply_t;

#define REQ_OF_COOKIE(c) ((tbrdma_rma_req_t *) ((char *) (c) -offsetof(tbrdma_rma_req_t, cookie)))

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
    req->cbfunc(&endpoint->module->super, endpoint, req->local_address, req->local_handle,
                req->cbcontext, req->cbdata, req->reply_status);
    OBJ_RELEASE(req);
}

static int start(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                 uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                 mca_btl_base_registration_handle_t *remote_handle, size_t size,
                 mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    tbrdma_rma_req_t *req = OBJ_NEW(tbrdma_rma_req_t);
    struct iovec iov[2];
    int rc;

    if (NULL == req) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    req->cookie.kind = TBRDMA_COOKIE_RMA;
    memset(&req->hdr, 0, sizeof(req->hdr));
    req->hdr.version = TB_WIRE_RMA_VERSION;
    req->hdr.req_id = tb_wire_le64(endpoint->next_rma_id++);
    req->hdr.key = tb_wire_le64(remote_handle->key);
    req->hdr.addr = tb_wire_le64(remote_address);
    req->hdr.len = tb_wire_le64(size);
    req->tag = tag;
    /* OBJ_NEW does not clear: a recycled request would otherwise start out
     * sent and replied, completing at its first event and again at its last. */
    req->sent = 0;
    req->replied = 0;
    req->reply_status = OPAL_SUCCESS;
    req->local_address = local_address;
    req->size = size;
    req->local_handle = local_handle;
    req->cbfunc = cbfunc;
    req->cbcontext = cbcontext;
    req->cbdata = cbdata;

    iov[0].iov_base = &req->hdr;
    iov[0].iov_len = sizeof(req->hdr);
    iov[1].iov_base = local_address;
    iov[1].iov_len = size;
    opal_list_append(&endpoint->rma_pending, &req->super);
    rc = mca_btl_tbrdma_endpoint_send(endpoint, tag, iov, TB_TAG_RMA_PUT == tag ? 2 : 1,
                                      &req->cookie);
    if (OPAL_SUCCESS != rc) {
        opal_list_remove_item(&endpoint->rma_pending, &req->super);
        OBJ_RELEASE(req);
    }
    return rc;
}

static int start_locked(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                        uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                        mca_btl_base_registration_handle_t *remote_handle, size_t size,
                        mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    int rc;

    OPAL_THREAD_LOCK(&mca_btl_tbrdma_component.lock);
    rc = start(endpoint, tag, local_address, remote_address, local_handle, remote_handle, size,
               cbfunc, cbcontext, cbdata);
    OPAL_THREAD_UNLOCK(&mca_btl_tbrdma_component.lock);
    return rc;
}

int mca_btl_tbrdma_put(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                       void *local_address, uint64_t remote_address,
                       mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                       int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata)
{
    int rc = start_locked(endpoint, TB_TAG_RMA_PUT, local_address, remote_address, local_handle,
                          remote_handle, size, cbfunc, cbcontext, cbdata);

    /* ob1 (5.0.7) both queues a put fragment for retry and frees it when put
     * reports OUT_OF_RESOURCE; any other error makes it send the data instead. */
    return OPAL_ERR_OUT_OF_RESOURCE == rc ? OPAL_ERROR : rc;
}

int mca_btl_tbrdma_get(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *endpoint,
                       void *local_address, uint64_t remote_address,
                       mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                       int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata)
{
    return start_locked(endpoint, TB_TAG_RMA_GET_REQ, local_address, remote_address, local_handle,
                        remote_handle, size, cbfunc, cbcontext, cbdata);
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
    OPAL_THREAD_LOCK(&mca_btl_tbrdma_component.lock);
    rc = tb_rma_register(&mca_btl_tbrdma_component.rma, base, size, access, &handle->key);
    OPAL_THREAD_UNLOCK(&mca_btl_tbrdma_component.lock);
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
        OPAL_THREAD_LOCK(&c->lock);
        (void) tb_rma_deregister(&c->rma, handle->key);
        OPAL_THREAD_UNLOCK(&c->lock);
    }
    free(handle);
    return OPAL_SUCCESS;
}

static void send_reply(mca_btl_base_endpoint_t *endpoint, uint8_t tag, uint64_t req_id, int status,
                       const void *data, size_t len)
{
    tbrdma_rma_reply_t *reply = calloc(1, sizeof(*reply));
    struct iovec iov[2];

    if (NULL == reply) {
        opal_output(0, "btl:tbrdma: out of memory answering a put/get from %s",
                    opal_get_proc_hostname(endpoint->proc));
        return;
    }
    reply->cookie.kind = TBRDMA_COOKIE_REPLY;
    reply->hdr.version = TB_WIRE_RMA_VERSION;
    reply->hdr.status = (uint8_t) status;
    reply->hdr.req_id = req_id;
    reply->hdr.len = tb_wire_le64(len);
    iov[0].iov_base = &reply->hdr;
    iov[0].iov_len = sizeof(reply->hdr);
    iov[1].iov_base = (void *) data;
    iov[1].iov_len = len;
    if (OPAL_SUCCESS !=
        mca_btl_tbrdma_endpoint_send(endpoint, tag, iov, len ? 2 : 1, &reply->cookie)) {
        free(reply);
    }
}

/* A peer's PUT or GET_REQ: check it against what this process registered,
 * then serve it or refuse it.  A refusal is logged: it means a peer holds a
 * stale or forged handle, which is a bug worth seeing. */
static void serve(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const tb_wire_rma_hdr_t *hdr,
                  const void *payload, size_t payload_len)
{
    uint64_t addr = tb_wire_le64(hdr->addr), len = tb_wire_le64(hdr->len);
    int put = TB_TAG_RMA_PUT == tag;
    void *local = NULL;
    int status;

    if (TB_WIRE_RMA_VERSION != hdr->version || (put && payload_len != len) ||
        (!put && 0 != payload_len)) {
        status = TB_RMA_EPROTO;
    } else {
        status = tb_rma_check(&mca_btl_tbrdma_component.rma, tb_wire_le64(hdr->key), addr, len,
                              put ? TB_RMA_ACCESS_WRITE : TB_RMA_ACCESS_READ, &local);
    }
    if (TB_RMA_OK != status) {
        opal_output(0,
                    "btl:tbrdma on %s: refused a %s of %llu bytes at 0x%llx (key %016llx) from "
                    "%s: %s; nothing was %s",
                    opal_process_info.nodename, put ? "put" : "get", (unsigned long long) len,
                    (unsigned long long) addr, (unsigned long long) tb_wire_le64(hdr->key),
                    opal_get_proc_hostname(endpoint->proc), tb_rma_status_string(status),
                    put ? "written" : "read");
        send_reply(endpoint, put ? TB_TAG_RMA_PUT_ACK : TB_TAG_RMA_GET_RESP, hdr->req_id, status,
                   NULL, 0);
        return;
    }
    if (put) {
        memcpy(local, payload, len);
        send_reply(endpoint, TB_TAG_RMA_PUT_ACK, hdr->req_id, TB_RMA_OK, NULL, 0);
    } else {
        send_reply(endpoint, TB_TAG_RMA_GET_RESP, hdr->req_id, TB_RMA_OK, local, len);
    }
}

/* A reply to the oldest request still waiting. */
static void complete(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const tb_wire_rma_hdr_t *hdr,
                     const void *payload, size_t payload_len)
{
    tbrdma_rma_req_t *req = NULL;
    int status = hdr->status;
    uint8_t want = 0;

    if (!opal_list_is_empty(&endpoint->rma_pending)) {
        req = (tbrdma_rma_req_t *) opal_list_get_first(&endpoint->rma_pending);
        want = TB_TAG_RMA_PUT == req->tag ? TB_TAG_RMA_PUT_ACK : TB_TAG_RMA_GET_RESP;
    }
    if (NULL == req || req->hdr.req_id != hdr->req_id || want != tag) {
        opal_output(0, "btl:tbrdma on %s: unexpected put/get reply from %s (ignored)",
                    opal_process_info.nodename, opal_get_proc_hostname(endpoint->proc));
        return;
    }
    if (TB_RMA_OK == status && TB_TAG_RMA_GET_RESP == tag) {
        if (payload_len != req->size) {
            status = TB_RMA_EPROTO;
        } else {
            memcpy(req->local_address, payload, payload_len);
        }
    }
    if (TB_RMA_OK != status) {
        opal_output(0, "btl:tbrdma on %s: %s of %zu bytes refused by %s: %s",
                    opal_process_info.nodename, TB_TAG_RMA_PUT == req->tag ? "put" : "get",
                    req->size, opal_get_proc_hostname(endpoint->proc),
                    tb_rma_status_string(status));
    }
    opal_list_remove_item(&endpoint->rma_pending, &req->super);
    req->replied = 1;
    req->reply_status = rma_status_to_opal(status);
    maybe_complete(endpoint, req);
}

void mca_btl_tbrdma_rma_deliver(mca_btl_base_endpoint_t *endpoint, uint8_t tag, const void *data,
                                size_t len)
{
    tb_wire_rma_hdr_t hdr;
    const char *payload = (const char *) data + sizeof(hdr);

    if (len < sizeof(hdr)) {
        opal_output(0,
                    "btl:tbrdma on %s: dropped a %zu-byte put/get message from %s: shorter "
                    "than its header",
                    opal_process_info.nodename, len, opal_get_proc_hostname(endpoint->proc));
        return;
    }
    memcpy(&hdr, data, sizeof(hdr));
    switch (tag) {
    case TB_TAG_RMA_PUT:
    case TB_TAG_RMA_GET_REQ:
        serve(endpoint, tag, &hdr, payload, len - sizeof(hdr));
        break;
    case TB_TAG_RMA_PUT_ACK:
    case TB_TAG_RMA_GET_RESP:
        complete(endpoint, tag, &hdr, payload, len - sizeof(hdr));
        break;
    default:
        opal_output(0, "btl:tbrdma on %s: dropped a message with unknown tag %u from %s",
                    opal_process_info.nodename, (unsigned) tag,
                    opal_get_proc_hostname(endpoint->proc));
    }
}

void mca_btl_tbrdma_rma_send_done(mca_btl_base_endpoint_t *endpoint, void *cookie, int status)
{
    mca_btl_tbrdma_cookie_t *c = cookie;
    tbrdma_rma_req_t *req;

    if (TBRDMA_COOKIE_REPLY == c->kind) {
        free((char *) c - offsetof(tbrdma_rma_reply_t, cookie));
        return;
    }
    req = REQ_OF_COOKIE(c);
    req->sent = 1;
    if (OPAL_SUCCESS != status && !req->replied) {
        /* The channel failed: no reply will come. */
        opal_list_remove_item(&endpoint->rma_pending, &req->super);
        req->replied = 1;
        req->reply_status = status;
    }
    maybe_complete(endpoint, req);
}

void mca_btl_tbrdma_rma_fail_pending(mca_btl_base_endpoint_t *endpoint, int status)
{
    tbrdma_rma_req_t *req, *next;

    OPAL_LIST_FOREACH_SAFE (req, next, &endpoint->rma_pending, tbrdma_rma_req_t) {
        if (req->sent) {
            opal_list_remove_item(&endpoint->rma_pending, &req->super);
            req->replied = 1;
            req->reply_status = status;
            maybe_complete(endpoint, req);
        }
    }
}
