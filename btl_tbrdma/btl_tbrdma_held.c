/*
 * tbrdma BTL: what the keeper holds back for the application's threads.
 *
 * On the direct path the keeper (common/tb_keeper.h) progresses the channels
 * while the application computes outside MPI, so peers keep hearing from this
 * process.  Open MPI's callbacks must stay on the application's threads, so
 * whatever the keeper's progress would hand to ob1 or osc waits here, in the
 * order it happened, until the application next calls progress:
 *  - messages: copied out of the receive slots (the channel reposts them);
 *  - send completions: linked through their cookies, no allocation;
 *  - endpoint failures: noted on the endpoint; the channel is aborted at once
 *    so nothing more from that peer is taken.
 * Put, get and atomic requests from peers are served at once, as a NIC
 * would: they touch only memory this process exposed, and call nobody.
 *
 * The held messages are bounded (TBRDMA_HELD_MAX_BYTES, headers counted);
 * past it the keeper stops taking traffic until the application drains it.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include <stdlib.h>
#include <string.h>

typedef enum { HELD_RECV = 1, HELD_PLACED = 2 } held_kind_t;

struct tbrdma_held_msg {
    struct tbrdma_held_msg *next;
    held_kind_t kind;
    mca_btl_base_endpoint_t *ep;
    uint8_t tag;
    size_t len;  /* RECV: the bytes in data; PLACED: the message's length */
    size_t skip; /* PLACED: the head bytes in data */
    unsigned char data[];
};

/* What one held message costs against the bound: its bytes and a header's
 * worth beyond them. */
static size_t held_cost(const struct tbrdma_held_msg *m)
{
    return (HELD_RECV == m->kind ? m->len : m->skip) + sizeof(*m) + 64u;
}

static void append(struct tbrdma_held_msg *m)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    m->next = NULL;
    if (c->held_last) {
        c->held_last->next = m;
    } else {
        c->held_first = m;
    }
    c->held_last = m;
    c->held_bytes += held_cost(m);
}

static struct tbrdma_held_msg *hold(mca_btl_base_endpoint_t *ep, held_kind_t kind, uint8_t tag,
                                    size_t bytes)
{
    struct tbrdma_held_msg *m = malloc(sizeof(*m) + bytes);

    if (NULL == m) {
        /* Nothing after it may be delivered before it: the peer is lost. */
        mca_btl_tbrdma_endpoint_fail(ep, "out of memory holding a message while the application "
                                         "was away from MPI");
        return NULL;
    }
    m->kind = kind;
    m->ep = ep;
    m->tag = tag;
    return m;
}

bool mca_btl_tbrdma_away(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    return NULL != c->keeper && tb_keeper_away(c->keeper);
}

void mca_btl_tbrdma_held_recv(mca_btl_base_endpoint_t *ep, uint8_t tag, const void *data,
                              size_t len)
{
    struct tbrdma_held_msg *m = hold(ep, HELD_RECV, tag, len);

    if (NULL == m) {
        return;
    }
    m->len = len;
    m->skip = 0;
    if (len) {
        memcpy(m->data, data, len);
    }
    append(m);
}

void mca_btl_tbrdma_held_placed(mca_btl_base_endpoint_t *ep, uint8_t tag, const void *head,
                                size_t skip, size_t len)
{
    struct tbrdma_held_msg *m = hold(ep, HELD_PLACED, tag, skip);

    if (NULL == m) {
        return;
    }
    m->len = len;
    m->skip = skip;
    if (skip) {
        memcpy(m->data, head, skip);
    }
    append(m);
}

void mca_btl_tbrdma_held_send_done(mca_btl_base_endpoint_t *ep, mca_btl_tbrdma_cookie_t *cookie,
                                   int status)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    cookie->held_ep = ep;
    cookie->held_status = status;
    cookie->held_next = NULL;
    if (c->held_sends_last) {
        c->held_sends_last->held_next = cookie;
    } else {
        c->held_sends_first = cookie;
    }
    c->held_sends_last = cookie;
}

void mca_btl_tbrdma_held_fail(mca_btl_base_endpoint_t *ep, const char *why)
{
    if (ep->away_failed) {
        return;
    }
    ep->away_failed = true;
    snprintf(ep->away_why, sizeof(ep->away_why), "%s", why);
    mca_btl_tbrdma_component.away_failures++;
    if (ep->module->cm) {
        tb_cm_cancel(ep->module->cm, ep);
    }
    if (ep->conn) {
        tb_channel_abort(tb_conn_channel(ep->conn), TB_CHAN_ECANCELED, why);
    }
}

bool mca_btl_tbrdma_held_full(void)
{
    return mca_btl_tbrdma_component.held_bytes >= TBRDMA_HELD_MAX_BYTES;
}

static void deliver(struct tbrdma_held_msg *m)
{
    if (HELD_RECV == m->kind) {
        mca_btl_tbrdma_deliver(m->ep, m->tag, m->data, m->len);
    } else {
        mca_btl_tbrdma_rma_placed(m->ep, m->tag, m->data, m->skip, m->len);
    }
}

/* Failures noted while away, finished here: ob1 hears of them now. */
static void finish_failures(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    for (int i = 0; i < c->num_modules && c->away_failures; ++i) {
        mca_btl_base_endpoint_t *ep, *next;
        OPAL_LIST_FOREACH_SAFE (ep, next, &c->modules[i]->endpoints, mca_btl_base_endpoint_t) {
            if (ep->away_failed) {
                ep->away_failed = false;
                c->away_failures--;
                mca_btl_tbrdma_endpoint_fail(ep, ep->away_why);
            }
        }
    }
}

int mca_btl_tbrdma_held_replay(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    int n = 0;

    while (c->held_sends_first) {
        mca_btl_tbrdma_cookie_t *cookie = c->held_sends_first;
        c->held_sends_first = cookie->held_next;
        if (NULL == c->held_sends_first) {
            c->held_sends_last = NULL;
        }
        mca_btl_tbrdma_send_done(cookie->held_ep, cookie, cookie->held_status);
        n++;
    }
    /* Delivering may send, and sending may progress nothing here: the list
     * is only added to by the keeper, which waits for the lock. */
    while (c->held_first) {
        struct tbrdma_held_msg *m = c->held_first;
        c->held_first = m->next;
        if (NULL == c->held_first) {
            c->held_last = NULL;
        }
        c->held_bytes -= held_cost(m);
        deliver(m);
        free(m);
        n++;
    }
    if (c->away_failures) {
        finish_failures();
    }
    return n;
}

void mca_btl_tbrdma_held_forget(mca_btl_base_endpoint_t *ep)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    struct tbrdma_held_msg **mp = &c->held_first, *last = NULL;
    mca_btl_tbrdma_cookie_t **cp = &c->held_sends_first, *clast = NULL;

    while (*mp) {
        struct tbrdma_held_msg *m = *mp;
        if (m->ep == ep) {
            *mp = m->next;
            c->held_bytes -= held_cost(m);
            free(m);
        } else {
            last = m;
            mp = &m->next;
        }
    }
    c->held_last = last;
    /* Their owners still wait to hear how the sends ended. */
    while (*cp) {
        mca_btl_tbrdma_cookie_t *cookie = *cp;
        if (cookie->held_ep == ep) {
            *cp = cookie->held_next;
            mca_btl_tbrdma_send_done(ep, cookie, cookie->held_status);
        } else {
            clast = cookie;
            cp = &cookie->held_next;
        }
    }
    c->held_sends_last = clast;
    if (ep->away_failed) {
        ep->away_failed = false;
        c->away_failures--;
    }
}

void mca_btl_tbrdma_held_clear(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    while (c->held_first) {
        struct tbrdma_held_msg *m = c->held_first;
        c->held_first = m->next;
        free(m);
    }
    c->held_last = NULL;
    c->held_sends_first = c->held_sends_last = NULL;
    c->held_bytes = 0;
}
