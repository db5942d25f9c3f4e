/*
 * tbrdma BTL: this process as its own peer.
 *
 * osc/rdma runs one-sided MPI straight on a BTL only if that BTL reaches
 * every process of the window, this one included; otherwise it wraps every
 * BTL in active messages, at half the speed or less.  So each module has an
 * endpoint for the process itself.  Nothing of it touches a device: a send
 * copies the message into a queue and progress delivers it through the same
 * code as a peer's message, so a put, get or atomic on this process's own
 * memory is checked against its registrations like any other.
 *
 * ob1 never sends to itself here while btl/self is loaded (self's
 * exclusivity wins); without it, these sends carry ob1's messages too.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include <stdlib.h>
#include <string.h>

/* Bytes queued to self before a send is told to retry: what osc/rdma and
 * ob1 keep outstanding is bounded anyway; this bounds a runaway. */
#define TBRDMA_LOOP_MAX_BYTES (64u << 20)

typedef struct tbrdma_loop_msg {
    struct tbrdma_loop_msg *next;
    mca_btl_base_endpoint_t *ep;
    void *cookie;
    size_t len;
    uint8_t tag;
    unsigned char data[];
} tbrdma_loop_msg_t;

static struct {
    tbrdma_loop_msg_t *head, *tail;
    size_t bytes;
} loop;

mca_btl_base_endpoint_t *mca_btl_tbrdma_loop_endpoint(mca_btl_tbrdma_module_t *module,
                                                      opal_proc_t *proc)
{
    mca_btl_base_endpoint_t *ep;

    if (NULL != module->self) {
        return module->self;
    }
    ep = OBJ_NEW(mca_btl_base_endpoint_t);
    if (NULL == ep) {
        return NULL;
    }
    ep->module = module;
    ep->device = module->device;
    ep->proc = proc;
    ep->name = proc->proc_name;
    ep->loop = true;
    ep->state = TBRDMA_EP_CONNECTED;
    /* In the module's list, so flush and release see it; not in the table
     * by name, which answers connection requests from the network. */
    opal_list_append(&module->endpoints, &ep->super);
    module->self = ep;
    return ep;
}

int mca_btl_tbrdma_loop_send(mca_btl_base_endpoint_t *ep, uint8_t tag, const struct iovec *iov,
                             int iovcnt, void *cookie)
{
    tbrdma_loop_msg_t *m;
    size_t len = 0, off = 0;
    int i;

    for (i = 0; i < iovcnt; ++i) {
        len += iov[i].iov_len;
    }
    if (loop.bytes + len > TBRDMA_LOOP_MAX_BYTES && NULL != loop.head) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    m = malloc(sizeof(*m) + len);
    if (NULL == m) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    for (i = 0; i < iovcnt; ++i) {
        memcpy(m->data + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    m->next = NULL;
    m->ep = ep;
    m->cookie = cookie;
    m->len = len;
    m->tag = tag;
    if (loop.tail) {
        loop.tail->next = m;
    } else {
        loop.head = m;
    }
    loop.tail = m;
    loop.bytes += len;
    return OPAL_SUCCESS;
}

int mca_btl_tbrdma_loop_progress(void)
{
    tbrdma_loop_msg_t *m = loop.head;
    int n = 0;

    /* What is queued now; what the deliveries send waits for the next call. */
    loop.head = loop.tail = NULL;
    loop.bytes = 0;
    while (m) {
        tbrdma_loop_msg_t *next = m->next;
        /* Sent once copied: the sender hears it first, as over a channel. */
        mca_btl_tbrdma_send_done(m->ep, m->cookie, TB_CHAN_OK);
        mca_btl_tbrdma_deliver(m->ep, m->tag, m->data, m->len);
        free(m);
        m = next;
        ++n;
    }
    return n;
}

void mca_btl_tbrdma_loop_forget(mca_btl_base_endpoint_t *ep)
{
    tbrdma_loop_msg_t **pp = &loop.head, *m, *last = NULL;

    while (NULL != (m = *pp)) {
        if (m->ep != ep) {
            last = m;
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        loop.bytes -= m->len;
        mca_btl_tbrdma_send_done(ep, m->cookie, TB_CHAN_ECANCELED);
        free(m);
    }
    loop.tail = last;
    if (ep->module->self == ep) {
        ep->module->self = NULL;
    }
}
