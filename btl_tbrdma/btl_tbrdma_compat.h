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
#    include "opal/mca/pmix/pmix.h"
#    include "opal/threads/mutex.h"
#    define TBRDMA_MODEX_SCOPE OPAL_PMIX_GLOBAL
#    define TBRDMA_JOB_SIZE_KEY OPAL_PMIX_JOB_SIZE
#    define TBRDMA_UINT32 OPAL_UINT32
#    define TBRDMA_HOSTNAME_KEY OPAL_PMIX_HOSTNAME
#    define TBRDMA_STRING OPAL_STRING
#elif BTL_VERSION == 330
#    include "opal/mca/pmix/pmix-internal.h"
#    include "opal/mca/threads/mutex.h"
#    define TBRDMA_MODEX_SCOPE PMIX_GLOBAL
#    define TBRDMA_JOB_SIZE_KEY PMIX_JOB_SIZE
#    define TBRDMA_UINT32 PMIX_UINT32
#    define TBRDMA_HOSTNAME_KEY PMIX_HOSTNAME
#    define TBRDMA_STRING PMIX_STRING
#else
#    error "tbrdma supports BTL interface 3.1.0 (Open MPI 4.1) and 3.3.0 (Open MPI 5.0)"
#endif

/* 5.0's osc/rdma wants remote completion said; 4.1 has no flag for it. */
#if BTL_VERSION == 310
#    define TBRDMA_FLAGS_REMOTE_COMPLETION 0
#else
#    define TBRDMA_FLAGS_REMOTE_COMPLETION MCA_BTL_FLAGS_RDMA_REMOTE_COMPLETION
#endif

/* The number of processes in this process's job, from the runtime; 0 if it
 * does not say. */
static inline uint32_t tbrdma_compat_job_size(void)
{
    opal_process_name_t job = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = OPAL_VPID_WILDCARD};
    uint32_t size = 0, *ptr = &size;
    int rc;

    OPAL_MODEX_RECV_VALUE(rc, TBRDMA_JOB_SIZE_KEY, &job, &ptr, TBRDMA_UINT32);
    return OPAL_SUCCESS == rc ? size : 0;
}

/* The host of process vpid of this job, from what the launcher gave every
 * process (no exchange); NULL if the runtime does not say.  Free it. */
static inline char *tbrdma_compat_hostname(uint32_t vpid)
{
    opal_process_name_t name = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = vpid};
    char *host = NULL;
    int rc;

    OPAL_MODEX_RECV_VALUE_OPTIONAL(rc, TBRDMA_HOSTNAME_KEY, &name, &host, TBRDMA_STRING);
    return OPAL_SUCCESS == rc ? host : NULL;
}

/* Publish a uint32 under key in this process's modex entry, and commit it at
 * once so that other processes may read it before the runtime's own fence
 * (Open MPI commits first after every BTL's init, so the first commit holds
 * this key).  OPAL_SUCCESS or an error. */
static inline int tbrdma_compat_publish_u32(char *key, uint32_t value)
{
    int rc;

#if BTL_VERSION == 310
    OPAL_MODEX_SEND_VALUE(rc, OPAL_PMIX_GLOBAL, key, &value, OPAL_UINT32);
    if (OPAL_SUCCESS == rc) {
        rc = opal_pmix.commit();
    }
    return rc;
#else
    OPAL_MODEX_SEND_VALUE(rc, PMIX_GLOBAL, key, &value, PMIX_UINT32);
    if (PMIX_SUCCESS == rc) {
        rc = PMIx_Commit();
    }
    return PMIX_SUCCESS == rc ? OPAL_SUCCESS : OPAL_ERROR;
#endif
}

/* The uint32 process vpid of this job published under key, waiting until it
 * does (the runtime asks that process's host for it) or timeout_s seconds
 * pass.  OPAL_SUCCESS with *value, or an error. */
static inline int tbrdma_compat_wait_u32(uint32_t vpid, const char *key, int timeout_s,
                                         uint32_t *value)
{
    opal_process_name_t name = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = vpid};
    int rc;

#if BTL_VERSION == 310
    opal_value_t *kv = NULL, *timeout = OBJ_NEW(opal_value_t);
    opal_list_t info;

    OBJ_CONSTRUCT(&info, opal_list_t);
    if (NULL == timeout || NULL == (timeout->key = strdup(OPAL_PMIX_TIMEOUT))) {
        if (timeout) {
            OBJ_RELEASE(timeout);
        }
        OBJ_DESTRUCT(&info);
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    timeout->type = OPAL_INT;
    timeout->data.integer = timeout_s;
    opal_list_append(&info, &timeout->super);
    rc = opal_pmix.get(&name, key, &info, &kv);
    OPAL_LIST_DESTRUCT(&info);
    if (OPAL_SUCCESS == rc && NULL == kv) {
        rc = OPAL_ERR_NOT_FOUND;
    } else if (OPAL_SUCCESS == rc) {
        rc = OPAL_UINT32 == kv->type ? OPAL_SUCCESS : OPAL_ERR_TYPE_MISMATCH;
        if (OPAL_SUCCESS == rc) {
            *value = kv->data.uint32;
        }
        OBJ_RELEASE(kv);
    }
    return rc;
#else
    pmix_value_t *val = NULL;
    pmix_info_t info;
    pmix_proc_t proc;

    OPAL_PMIX_CONVERT_NAME(&proc, &name);
    PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &timeout_s, PMIX_INT);
    rc = PMIx_Get(&proc, key, &info, 1, &val);
    PMIX_INFO_DESTRUCT(&info);
    if (PMIX_SUCCESS != rc) {
        rc = opal_pmix_convert_status(rc);
    } else if (NULL == val) {
        rc = OPAL_ERR_NOT_FOUND;
    } else if (PMIX_UINT32 != val->type) {
        rc = OPAL_ERR_TYPE_MISMATCH;
    } else {
        rc = OPAL_SUCCESS;
        *value = val->data.uint32;
    }
    if (val) {
        PMIX_VALUE_RELEASE(val);
    }
    return rc;
#endif
}

/* Hand a received message to the callback registered for its tag: 4.1
 * passes a descriptor, 5.0 a receive descriptor naming the endpoint. */
static inline void tbrdma_compat_deliver(mca_btl_base_module_t *btl,
                                         struct mca_btl_base_endpoint_t *endpoint, uint8_t tag,
                                         mca_btl_base_segment_t *segment)
{
    const mca_btl_active_message_callback_t *reg = mca_btl_base_active_message_trigger + tag;
#if BTL_VERSION == 310
    mca_btl_base_descriptor_t des;

    (void) endpoint;
    des.des_segments = segment;
    des.des_segment_count = 1;
    des.des_cbfunc = NULL;
    des.des_cbdata = NULL;
    des.des_context = NULL;
    des.des_flags = 0;
    des.order = MCA_BTL_NO_ORDER;
    reg->cbfunc(btl, tag, &des, reg->cbdata);
#else
    mca_btl_base_receive_descriptor_t des = {
        .endpoint = endpoint,
        .des_segments = segment,
        .des_segment_count = 1,
        .tag = tag,
        .cbdata = reg->cbdata,
    };
    reg->cbfunc(btl, &des);
#endif
}

#endif /* BTL_TBRDMA_COMPAT_H */
