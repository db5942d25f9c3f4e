/*
 * tbrdma BTL: what differs between Open MPI 4.1 (BTL 3.1) and 5.0 (BTL 3.3).
 *
 * Everything version-specific lives here so the rest of the component is one
 * source for both.  BTL_VERSION comes from opal/mca/btl/btl.h.
 */
#ifndef BTL_TBRDMA_COMPAT_H
#define BTL_TBRDMA_COMPAT_H

#include "opal_config.h"
#include "opal/mca/btl/btl.h"

#if BTL_VERSION == 310
#    include "opal/threads/mutex.h"
#elif BTL_VERSION == 330
#    include "opal/mca/threads/mutex.h"
#else
#    error "tbrdma supports BTL interface 3.1.0 (Open MPI 4.1) and 3.3.0 (Open MPI 5.0)"
#endif

#endif /* BTL_TBRDMA_COMPAT_H */
