/*
 * tbrdma BTL: a large put or get split over every cable to its peer.
 *
 * ob1 moves a large message with gets on the one module its rendezvous
 * came on, and osc/rdma puts and gets on the module it picked: either way
 * one cable, however many join the two hosts.  Where several cables reach
 * the peer, a put or get of btl_tbrdma_stripe_min bytes or more is cut into
 * one part per cable (of a page at least), each a request of its own on that
 * cable's endpoint (the peer's registration belongs to its process, so its
 * key is good on every cable).  The caller hears once, when every part is answered, with the
 * first error any part had.  Smaller ones stay on their cable: the latency
 * of a small message is one cable's, and a part's fixed cost would outweigh
 * the bandwidth a second cable adds.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include <stdlib.h>
#include <string.h>

/* The smallest part. */
#define TBRDMA_STRIPE_PAGE 4096u

typedef struct tbrdma_split {
    mca_btl_base_endpoint_t *origin; /* the endpoint the caller named (retained) */
    void *local_address;
    mca_btl_base_registration_handle_t *local_handle;
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
    unsigned parts_left; /* parts not answered yet, plus one while they are being started */
    int status;          /* the first error of any part */
} tbrdma_split_t;

static void part_done(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                      mca_btl_base_registration_handle_t *local_handle, void *context, void *data,
                      int status)
{
    tbrdma_split_t *s = context;

    (void) btl;
    (void) ep;
    (void) local_address;
    (void) local_handle;
    (void) data;
    if (OPAL_SUCCESS != status && OPAL_SUCCESS == s->status) {
        s->status = status;
    }
    if (0 != --s->parts_left) {
        return;
    }
    s->origin->rma_split--;
    /* osc/rdma gives no callback when it waits with btl_flush instead. */
    if (NULL != s->cbfunc) {
        s->cbfunc(&s->origin->module->super, s->origin, s->local_address, s->local_handle,
                  s->cbcontext, s->cbdata, s->status);
    }
    OBJ_RELEASE(s->origin);
    free(s);
}

/* The endpoints that reach origin's peer, one per cable of this host,
 * origin first. */
static unsigned cables_to(mca_btl_base_endpoint_t *origin, mca_btl_base_endpoint_t **eps,
                          unsigned max)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    unsigned n = 1;

    eps[0] = origin;
    for (int i = 0; i < c->num_modules && n < max; ++i) {
        mca_btl_base_endpoint_t *ep;
        bool same_cable = false;

        if (c->modules[i]->host) {
            continue;
        }
        ep = mca_btl_tbrdma_module_find_endpoint(c->modules[i], &origin->name);
        if (NULL == ep || ep->loop || TBRDMA_EP_FAILED == ep->state) {
            continue;
        }
        for (unsigned j = 0; j < n; ++j) {
            same_cable = same_cable || eps[j]->device == ep->device;
        }
        if (!same_cable) {
            eps[n++] = ep;
        }
    }
    return n;
}

static void say_split(mca_btl_base_endpoint_t *origin, mca_btl_base_endpoint_t **eps, unsigned n)
{
    char list[256];
    size_t at = 0;

    if (origin->split_said) {
        return;
    }
    origin->split_said = true;
    list[0] = '\0';
    for (unsigned i = 0; i < n && at < sizeof(list); ++i) {
        int w = snprintf(list + at, sizeof(list) - at, "%s%s", i ? ", " : "", eps[i]->device->name);
        at += w > 0 ? (size_t) w : 0;
    }
    BTL_TBRDMA_VERBOSE(
        20, "%sputs and gets of %u bytes or more to %s on %s are split over %u cables: %s",
        origin->module->host ? "host module, " : "", mca_btl_tbrdma_component.stripe_min,
        OPAL_NAME_PRINT(origin->name), opal_get_proc_hostname(origin->proc), n, list);
}

int mca_btl_tbrdma_rma_striped(mca_btl_base_endpoint_t *endpoint, uint8_t tag, void *local_address,
                               uint64_t remote_address,
                               mca_btl_base_registration_handle_t *local_handle,
                               mca_btl_base_registration_handle_t *remote_handle, size_t size,
                               mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                               void *cbdata)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    mca_btl_base_endpoint_t *eps[TBRDMA_STRIPE_MAX_CABLES];
    tbrdma_split_t *s;
    unsigned n = 1;
    int rc;

    mca_btl_tbrdma_lock();
    if (0 != c->stripe_min && size >= c->stripe_min && size >= 2 * TBRDMA_STRIPE_PAGE &&
        !endpoint->loop && NULL != remote_handle && TBRDMA_EP_FAILED != endpoint->state) {
        n = cables_to(endpoint, eps, TBRDMA_STRIPE_MAX_CABLES);
        n = n < size / TBRDMA_STRIPE_PAGE ? n : (unsigned) (size / TBRDMA_STRIPE_PAGE);
    }
    if (1 == n || NULL == (s = malloc(sizeof(*s)))) {
        rc = mca_btl_tbrdma_rma_start(endpoint, tag, local_address, remote_address, local_handle,
                                      remote_handle, size, cbfunc, cbcontext, cbdata);
        mca_btl_tbrdma_unlock();
        return rc;
    }
    say_split(endpoint, eps, n);
    s->origin = endpoint;
    s->local_address = local_address;
    s->local_handle = local_handle;
    s->cbfunc = cbfunc;
    s->cbcontext = cbcontext;
    s->cbdata = cbdata;
    s->parts_left = 1;
    s->status = OPAL_SUCCESS;
    for (unsigned i = 0; i < n; ++i) {
        /* Parts of equal size, on 64-byte boundaries. */
        size_t from = (size * i / n) & ~(size_t) 63;
        size_t to = i + 1 < n ? (size * (i + 1) / n) & ~(size_t) 63 : size;

        rc = mca_btl_tbrdma_rma_start(eps[i], tag, (char *) local_address + from,
                                      remote_address + from, local_handle, remote_handle, to - from,
                                      part_done, s, NULL);
        if (OPAL_SUCCESS != rc && 0 != i) {
            /* That cable failed meanwhile: its part goes on the first. */
            rc = mca_btl_tbrdma_rma_start(eps[0], tag, (char *) local_address + from,
                                          remote_address + from, local_handle, remote_handle,
                                          to - from, part_done, s, NULL);
        }
        if (OPAL_SUCCESS != rc) {
            if (0 == i) {
                /* Nothing was started: the caller hears it now, as unsplit. */
                free(s);
                mca_btl_tbrdma_unlock();
                return rc;
            }
            s->status = rc;
            continue;
        }
        if (0 == i) {
            OBJ_RETAIN(endpoint);
            endpoint->rma_split++;
        }
        s->parts_left++;
    }
    part_done(NULL, NULL, NULL, NULL, s, NULL, OPAL_SUCCESS);
    mca_btl_tbrdma_unlock();
    return OPAL_SUCCESS;
}
