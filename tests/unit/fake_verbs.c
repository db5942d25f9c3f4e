/*
 * A stand-in verbs library for unit tests: devices described by the
 * TB_FAKE_VERBS environment variable, so discovery can be tested on machines
 * without RDMA.  Format: entries separated by ';', each NAME:STATE:GIDIPV4
 * where STATE is "active", "down" or "open" and GIDIPV4 an IPv4 address for
 * the IPv4-mapped GID at index 1, or "none" for a device with only a
 * link-local GID.  Control-path calls beyond discovery fail with ENOSYS,
 * except on an "open" device: it is active and gives protection domains,
 * completion queues (on which nothing completes) and registrations, so a
 * host engine can run on it and hand its own host's ranks their messages;
 * queue pairs still fail.
 */
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#undef ibv_query_port
#undef ibv_reg_mr

#define FAKE_MAX 16

struct fake_dev {
    char name[64];
    int active;
    int open; /* "open": protection domains, CQs and registrations work; queue pairs do not */
    int has_ipv4;
    struct in_addr ipv4;
};

static struct fake_dev fakes[FAKE_MAX];
static struct ibv_device devices[FAKE_MAX];
static int nfakes;

static void parse_env(void)
{
    char buf[1024], *save = NULL, *entry;
    const char *env = getenv("TB_FAKE_VERBS");

    nfakes = 0;
    if (NULL == env) {
        return;
    }
    snprintf(buf, sizeof(buf), "%s", env);
    for (entry = strtok_r(buf, ";", &save); entry && nfakes < FAKE_MAX;
         entry = strtok_r(NULL, ";", &save)) {
        struct fake_dev *f = &fakes[nfakes];
        char *state = strchr(entry, ':'), *ip;
        if (NULL == state) {
            continue;
        }
        *state++ = '\0';
        ip = strchr(state, ':');
        if (NULL == ip) {
            continue;
        }
        *ip++ = '\0';
        snprintf(f->name, sizeof(f->name), "%s", entry);
        f->open = 0 == strcmp(state, "open");
        f->active = f->open || 0 == strcmp(state, "active");
        f->has_ipv4 = 1 == inet_pton(AF_INET, ip, &f->ipv4);
        memset(&devices[nfakes], 0, sizeof(devices[nfakes]));
        snprintf(devices[nfakes].name, sizeof(devices[nfakes].name), "%s", f->name);
        nfakes++;
    }
}

static struct fake_dev *fake_of(struct ibv_context *ctx)
{
    return &fakes[ctx->device - devices];
}

struct ibv_device **ibv_get_device_list(int *num)
{
    struct ibv_device **list;
    int i;

    parse_env();
    list = calloc((size_t) nfakes + 1, sizeof(*list));
    if (NULL == list) {
        return NULL;
    }
    for (i = 0; i < nfakes; ++i) {
        list[i] = &devices[i];
    }
    if (num) {
        *num = nfakes;
    }
    return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

/* An open device's completion queue: nothing ever completes (no queue
 * pair can be made), and asking for an event always works. */
static int fake_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    return 0;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return 0;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx) {
        ctx->device = device;
        ctx->ops.poll_cq = fake_poll_cq;
        ctx->ops.req_notify_cq = fake_req_notify_cq;
    }
    return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    free(ctx);
    return 0;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
    memset(attr, 0, sizeof(*attr));
    attr->max_qp = 1024;
    attr->max_mr = 4096;
    attr->max_qp_wr = 16384;
    attr->max_sge = 32;
    attr->max_cqe = 65536;
    return 0;
}

int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *compat)
{
    struct ibv_port_attr *attr = (struct ibv_port_attr *) compat;

    if (1 != port) {
        return EINVAL;
    }
    attr->state = fake_of(ctx)->active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    attr->active_mtu = IBV_MTU_1024;
    attr->max_msg_sz = 1u << 31;
    attr->gid_tbl_len = 2;
    return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    struct fake_dev *f = fake_of(ctx);

    memset(gid, 0, sizeof(*gid));
    if (0 == index) {
        gid->raw[0] = 0xfe;
        gid->raw[1] = 0x80;
        gid->raw[15] = 1;
        return 0;
    }
    if (1 == index && f->has_ipv4) {
        gid->raw[10] = 0xff;
        gid->raw[11] = 0xff;
        memcpy(&gid->raw[12], &f->ipv4, 4);
        return 0;
    }
    return EINVAL;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    struct ibv_pd *pd;

    if (!fake_of(ctx)->open) {
        errno = ENOSYS;
        return NULL;
    }
    pd = calloc(1, sizeof(*pd));
    if (pd) {
        pd->context = ctx;
    }
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    static uint32_t next_key = 1;
    struct ibv_mr *mr = calloc(1, sizeof(*mr));

    if (mr) {
        mr->context = pd->context;
        mr->pd = pd;
        mr->addr = addr;
        mr->length = length;
        mr->lkey = mr->rkey = next_key++;
    }
    return mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    free(mr);
    return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    struct ibv_cq *cq;

    if (!fake_of(ctx)->open) {
        errno = ENOSYS;
        return NULL;
    }
    cq = calloc(1, sizeof(*cq));
    if (cq) {
        cq->context = ctx;
        cq->cq_context = cq_context;
        cq->cqe = cqe;
    }
    return cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    free(cq);
    return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    errno = ENOSYS;
    return NULL;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    return ENOSYS;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    return ENOSYS;
}
