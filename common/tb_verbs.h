/*
 * tbrdma common layer: the verbs library, loaded at run time.
 *
 * The verbs library is dlopen()ed rather than linked so that one binary runs
 * on machines without RDMA (macOS before 26.2, Linux without rdma-core): the
 * transport then reports "no device" instead of failing to load.  The data
 * path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq) are inline in
 * <infiniband/verbs.h> and dispatch through the device context, so only the
 * control path is resolved here.
 */
#ifndef TB_VERBS_H
#define TB_VERBS_H

#include <infiniband/verbs.h>
#include <stddef.h>

typedef struct tb_verbs {
    void *handle;
    char path[256];

    struct ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int (*close_device)(struct ibv_context *context);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    /* Completion events: optional (NULL when the library has none; whether
     * Apple's does is not known). */
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
    int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
    int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
} tb_verbs_t;

/* The library tried when the caller names none: librdma on macOS,
 * libibverbs.so.1 elsewhere (set at configure time). */
const char *tb_verbs_default_library(void);

/* Load `path` (NULL or "" for the default) and resolve every entry point.
 * On failure returns -1 with a message in err that says what to install or
 * set; nothing stays loaded. */
int tb_verbs_load(tb_verbs_t *verbs, const char *path, char *err, size_t errlen);

void tb_verbs_unload(tb_verbs_t *verbs);

#endif /* TB_VERBS_H */
