/*
 * tbrdma host engine, client side: the job's table of hosts as a graph (see
 * tb_ehosts.h).
 */
#include "tb_ehosts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The table's hosts, or -1 with *why. */
static int table_hosts(const tb_wire_ehost_t *x, size_t n, tb_topo_host_t *hosts,
                       unsigned *nhosts, const char **why)
{
    unsigned nh = 0;

    for (size_t i = 0; i < n; ++i) {
        tb_wire_ehost_t ent;
        tb_topo_host_t *h;
        memcpy(&ent, &x[i], sizeof(ent));
        for (unsigned k = 0; k < sizeof(ent.reserved); ++k) {
            if (ent.reserved[k]) {
                *why = "an entry's reserved bytes are set";
                return -1;
            }
        }
        if (0 == nh || 0 != memcmp(hosts[nh - 1].id, ent.engine_id, TB_TOPO_ID_SIZE)) {
            if (nh == TB_TOPO_MAX_HOSTS) {
                *why = "more hosts than routes are kept for";
                return -1;
            }
            memcpy(hosts[nh++].id, ent.engine_id, TB_TOPO_ID_SIZE);
        }
        h = &hosts[nh - 1];
        if (ent.dev != h->ndev || h->ndev == TB_TOPO_MAX_DEVS) {
            *why = "a host's devices are not numbered from 0 in order";
            return -1;
        }
        h->dev[h->ndev].ipv4 = ent.ipv4;
        h->dev[h->ndev].netmask = ent.netmask;
        h->ndev++;
    }
    *nhosts = nh;
    return 0;
}

int tb_ehosts_topo(const tb_wire_ehost_t *x, size_t n, tb_topo_t *t, const char **why)
{
    tb_topo_host_t *hosts = calloc(TB_TOPO_MAX_HOSTS, sizeof(*hosts));
    unsigned nh = 0;
    int rc = -EINVAL;

    *why = NULL;
    if (NULL == hosts) {
        *why = "out of memory";
        return -ENOMEM;
    }
    if (0 == table_hosts(x, n, hosts, &nh, why) && 0 == tb_topo_build(t, hosts, nh, why)) {
        rc = 0;
    }
    free(hosts);
    return rc;
}
