/*
 * tbrdma BTL: RDMA over Thunderbolt for Open MPI.
 *
 * One module per usable RDMA device (one per Thunderbolt cable), so ob1
 * stripes large messages across cables by itself.  The transport proper
 * (devices, framing, reliability) is in common/, free of Open MPI.
 */
#ifndef BTL_TBRDMA_H
#define BTL_TBRDMA_H

#include "btl_tbrdma_compat.h"

#include "opal/mca/btl/base/base.h"

#include "tb_device.h"
#include "tb_tunables.h"

BEGIN_C_DECLS

typedef struct mca_btl_tbrdma_module_t {
    mca_btl_base_module_t super;
    tb_device_t *device; /* owned by the component's device list */
} mca_btl_tbrdma_module_t;

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
    mca_btl_tbrdma_module_t **modules;
} mca_btl_tbrdma_component_t;

OPAL_MODULE_DECLSPEC extern mca_btl_tbrdma_component_t mca_btl_tbrdma_component;

extern mca_btl_tbrdma_module_t mca_btl_tbrdma_module_template;

/* Help file name for opal_show_help(). */
#define BTL_TBRDMA_HELP_FILE "help-mpi-btl-tbrdma.txt"

#define BTL_TBRDMA_VERBOSE(level, ...) \
    opal_output_verbose(level, opal_btl_base_framework.framework_output, "btl:tbrdma: " __VA_ARGS__)

END_C_DECLS

#endif /* BTL_TBRDMA_H */
