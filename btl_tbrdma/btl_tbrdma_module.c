/*
 * tbrdma BTL: one module per RDMA device.
 *
 * The data path (endpoints, eager and rendezvous sends over the reliable
 * channel) is not built yet, so add_procs reaches no peer and ob1 uses the
 * job's other BTLs; the module exists so that devices are opened, counted
 * and reported from the start.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"

#include "opal/class/opal_bitmap.h"

#include <stdlib.h>

static int tbrdma_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                            struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers,
                            opal_bitmap_t *reachable)
{
    mca_btl_tbrdma_module_t *module = (mca_btl_tbrdma_module_t *) btl;

    BTL_TBRDMA_VERBOSE(10, "device %s: no data path yet, %zu peer(s) left to other BTLs",
                       module->device->name, nprocs);
    return OPAL_SUCCESS;
}

static int tbrdma_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                            struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers)
{
    return OPAL_SUCCESS;
}

static int tbrdma_register_error(struct mca_btl_base_module_t *btl,
                                 mca_btl_base_module_error_cb_fn_t cbfunc)
{
    return OPAL_SUCCESS;
}

static int tbrdma_finalize(struct mca_btl_base_module_t *btl)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    int i;

    for (i = 0; i < c->num_modules; ++i) {
        if (&c->modules[i]->super == btl) {
            c->modules[i] = c->modules[--c->num_modules];
            break;
        }
    }
    free(btl);
    return OPAL_SUCCESS;
}

mca_btl_tbrdma_module_t mca_btl_tbrdma_module_template = {
    .super = {
        .btl_component = &mca_btl_tbrdma_component.super,
        .btl_add_procs = tbrdma_add_procs,
        .btl_del_procs = tbrdma_del_procs,
        .btl_finalize = tbrdma_finalize,
        .btl_register_error = tbrdma_register_error,
    },
};
