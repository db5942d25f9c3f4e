/*
 * tbrdma BTL: hosts no cable of this host reaches, through the host engines.
 *
 * Every process on the engine path reads the job's modex entries, one per
 * rank, and makes of them the job's table of hosts: each engine's id and its
 * cables' ends (common/tb_topology.h).  Every rank reads the same entries, so
 * every engine is given the same table (TB_EREC_HOSTS) and computes the same
 * routes.  A peer whose host no cable reaches, but a route does, is reached
 * through the host module with a routed route (TB_EROUTE_F_ROUTED): the
 * engines relay its messages host to host.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tb_ehosts.h"

static int entry_cmp(const void *a, const void *b)
{
    const tb_wire_ehost_t *x = a, *y = b;
    int c = memcmp(x->engine_id, y->engine_id, sizeof(x->engine_id));

    return c ? c : (int) x->dev - (int) y->dev;
}

/* The job's table of hosts from every rank's modex entry: n entries. */
static tb_wire_ehost_t *job_table(size_t *n)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    size_t cap = (size_t) TB_TOPO_MAX_HOSTS * TB_TOPO_MAX_DEVS, count = 0;
    tb_wire_ehost_t *t = calloc(cap, sizeof(*t));

    if (NULL == t) {
        return NULL;
    }
    for (uint32_t v = 0; v < c->job_size; ++v) {
        opal_process_name_t name = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = v};
        tb_wire_modex_t *mx = NULL;
        bool seen = false;
        size_t size = 0;
        int rc;

        OPAL_MODEX_RECV(rc, &c->super.btl_version, &name, (void **) &mx, &size);
        if (OPAL_SUCCESS != rc || NULL == mx || 0 != tb_modex_check(mx, size, NULL) ||
            TB_MODEX_PATH_ENGINE != mx->path) {
            free(mx);
            continue;
        }
        for (size_t i = 0; i < count && !seen; ++i) {
            seen = 0 == memcmp(t[i].engine_id, mx->engine_id, sizeof(mx->engine_id));
        }
        for (unsigned d = 0; !seen && d < mx->ndevices && count < cap; ++d) {
            tb_wire_ehost_t *e = &t[count++];
            memcpy(e->engine_id, mx->engine_id, sizeof(e->engine_id));
            e->ipv4 = mx->devices[d].ipv4;
            e->netmask = mx->devices[d].netmask;
            memcpy(e->gid, mx->devices[d].gid, sizeof(e->gid));
            e->cm_port = mx->devices[d].cm_port;
            e->dev = (uint8_t) d;
        }
        free(mx);
    }
    qsort(t, count, sizeof(*t), entry_cmp);
    *n = count;
    return t;
}

/* The graph the table makes, as the engines make it. */
static int build_topo(const tb_wire_ehost_t *t, size_t n)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    const char *why = NULL;
    int rc = OPAL_ERROR;

    /* The very code the engines run on the same table. */
    c->topo = calloc(1, sizeof(*c->topo));
    if (NULL == c->topo || 0 != tb_ehosts_topo(t, n, c->topo, &why)) {
        goto out;
    }
    c->topo_me = tb_topo_find(c->topo, c->engine_id);
    rc = c->topo_me < 0 ? OPAL_ERROR : OPAL_SUCCESS;
out:
    if (OPAL_SUCCESS != rc) {
        BTL_TBRDMA_VERBOSE(10, "no routes through other hosts: %s",
                           why ? why : "this host's engine is not in the job's table of hosts");
        free(c->topo);
        c->topo = NULL;
    }
    return rc;
}

int mca_btl_tbrdma_route_init(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tb_wire_ehost_t *t;
    size_t n = 0;
    int rc;

    if (c->hosts_sent || 0 == c->job_size) {
        return OPAL_SUCCESS;
    }
    t = job_table(&n);
    if (NULL == t) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (NULL == c->topo && 0 != n) {
        (void) build_topo(t, n);
    }
    rc = NULL == c->topo ? 0 : tb_eclient_hosts(c->engine, t, n);
    free(t);
    if (-EAGAIN == rc) {
        return OPAL_ERR_OUT_OF_RESOURCE; /* tried again at the next route */
    }
    c->hosts_sent = true;
    return OPAL_SUCCESS;
}

int mca_btl_tbrdma_route_find(const uint8_t *engine_id, int *first_dev, unsigned *hops)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    unsigned dev;
    int h;

    if (NULL == c->topo || (h = tb_topo_find(c->topo, engine_id)) < 0 || h == c->topo_me ||
        tb_topo_next_hop(c->topo, (unsigned) c->topo_me, (unsigned) h, &dev) < 0 ||
        dev >= (unsigned) c->devices.count) {
        return -1;
    }
    *first_dev = (int) dev;
    *hops = c->topo->dist[c->topo_me][h];
    return 0;
}

void mca_btl_tbrdma_route_fini(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    free(c->topo);
    c->topo = NULL;
    c->hosts_sent = false;
}
