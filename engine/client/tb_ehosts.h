/*
 * tbrdma host engine, client side: the job's table of hosts (TB_EREC_HOSTS,
 * tb_wire_ehost_t) as a graph of hosts and cables (common/tb_topology.h).
 * A rank makes the graph from the table it gives its engine, and the engine
 * from the table a rank gave it, with this one function, so that both see
 * the same routes.
 */
#ifndef TB_EHOSTS_H
#define TB_EHOSTS_H

#include <stddef.h>

#include "tb_eproto.h"
#include "tb_topology.h"

/* Build t from the table's n entries (sorted by engine id, each host's
 * devices counting from 0, reserved bytes zero; x may be unaligned).  0;
 * -ENOMEM; or -EINVAL with *why when the table is not so or makes no graph
 * (an engine takes it from a rank: untrusted). */
int tb_ehosts_topo(const tb_wire_ehost_t *x, size_t n, tb_topo_t *t, const char **why);

#endif /* TB_EHOSTS_H */
