/*
 * tbrdma strict mode: an LD_PRELOAD interposer that holds every verbs program in the
 * test-bed guest to the rules of Apple's RDMA over Thunderbolt, which soft-RoCE (rxe)
 * alone does not enforce. Each refusal is logged on stderr as
 *   tbrdma-strict: [RULE] CALL: what was refused (errno NAME): what to do
 *
 * Rules (README.md has the full list): UC queue pairs only; IBV_WR_SEND only; no inline
 * data; one SGE per work request; at most 16,773,120 bytes a message; 10 QPs and 100 MRs
 * per device, counted across all processes; receives only once the QP is in RTS and at
 * most 32 outstanding per QP; a message must land in a receive of the same number of
 * 4 KiB frames; no SRQ and no extended CQ (their completions would bypass the checks).
 *
 * ibv_post_send/post_recv/poll_cq are inline in verbs.h and call the context's ops, so
 * the ops are replaced when a device is opened; likewise the verbs_context entry points
 * behind the inline ibv_create_qp_ex/ibv_create_cq_ex, and the ibv_wr_* function
 * pointers of extended QPs. The library does not link libibverbs: preloaded into every
 * process, it is inert in those that do not use verbs, and it reaches libibverbs only
 * through dlsym() (no undefined symbols, so even LD_BIND_NOW programs start).
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define STRICT_EXPORT __attribute__((visibility("default")))

#define STRICT_MAX_QP_PER_DEVICE 10
#define STRICT_MAX_MR_PER_DEVICE 100
#define STRICT_MAX_RECV_PER_QP 32
#define STRICT_FRAME_BYTES 4096u
#define STRICT_MAX_MESSAGE_BYTES (4095u * STRICT_FRAME_BYTES)
/* Shared by every process of the guest (all hosts): one lock file per QP or MR slot. */
#define STRICT_SLOT_DIR "/run/tbrdma-strict"

typedef int (*post_send_fn)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
typedef int (*post_recv_fn)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
typedef int (*poll_cq_fn)(struct ibv_cq *, int, struct ibv_wc *);
typedef struct ibv_qp *(*create_qp_ex_fn)(struct ibv_context *, struct ibv_qp_init_attr_ex *);

/* An opened device: its original ops and where its slot lock files live. */
struct strict_ctx {
    struct ibv_context *ctx;
    post_send_fn post_send;
    post_recv_fn post_recv;
    poll_cq_fn poll_cq;
    create_qp_ex_fn create_qp_ex;
    char slot_dir[PATH_MAX];
    struct strict_ctx *next;
};

/* Original ibv_wr_* entry points of an extended QP. */
struct strict_wr_ops {
    void (*wr_start)(struct ibv_qp_ex *);
    int (*wr_complete)(struct ibv_qp_ex *);
    void (*wr_abort)(struct ibv_qp_ex *);
    void (*wr_set_sge)(struct ibv_qp_ex *, uint32_t, uint64_t, uint32_t);
    void (*wr_set_sge_list)(struct ibv_qp_ex *, size_t, const struct ibv_sge *);
};

struct strict_qp {
    struct ibv_qp *qp;
    struct strict_ctx *sctx;
    int slot_fd;
    enum ibv_qp_state state;
    /* Frame counts of the posted, not yet completed receives, oldest first. */
    uint32_t recv_frames[STRICT_MAX_RECV_PER_QP];
    unsigned int recv_head;
    unsigned int recv_count;
    bool extended;
    struct strict_wr_ops wr;
    const char *wr_violation; /* rule broken in the current ibv_wr_start batch */
    struct strict_qp *next;
};

struct strict_mr {
    struct ibv_mr *mr;
    int slot_fd;
    struct strict_mr *next;
};

static pthread_mutex_t strict_lock = PTHREAD_MUTEX_INITIALIZER;
static struct strict_ctx *strict_ctxs;
static struct strict_qp *strict_qps;
static struct strict_mr *strict_mrs;
/* Set while inside a wrapper: libibverbs calls its own exported functions (ibv_reg_mr
 * calls ibv_reg_mr_iova2), and those inner calls must not be counted twice. */
static __thread int strict_depth;

static void strict_log(const char *rule, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void strict_log(const char *rule, const char *call, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "tbrdma-strict: [%s] %s: %s\n", rule, call, msg);
}

/* The next definition of NAME: libibverbs' own. A library dlopen()ed with RTLD_LOCAL
 * is not in RTLD_NEXT's scope, so look there too. */
static void *strict_real(const char *name)
{
    void *sym = dlsym(RTLD_NEXT, name);

    if (NULL == sym) {
        void *lib = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD);

        if (NULL != lib) {
            sym = dlsym(lib, name);
            dlclose(lib);
        }
    }
    if (NULL == sym) {
        fprintf(stderr, "tbrdma-strict: dlsym(%s) failed: libibverbs.so.1 is not loaded in "
                "this process; link the program with -libverbs\n", name);
    }
    return sym;
}

#define STRICT_REAL(name)                                                  \
    static __typeof__(name) *real_fn;                                      \
    if (NULL == real_fn) {                                                 \
        real_fn = (__typeof__(name) *) strict_real(#name);                 \
    }

static uint32_t strict_frames(uint64_t bytes)
{
    return 0 == bytes ? 1 : (uint32_t) ((bytes + STRICT_FRAME_BYTES - 1) / STRICT_FRAME_BYTES);
}

/* Called with strict_lock held. */
static struct strict_ctx *strict_ctx_find(const struct ibv_context *ctx)
{
    for (struct strict_ctx *s = strict_ctxs; NULL != s; s = s->next) {
        if (s->ctx == ctx) {
            return s;
        }
    }
    return NULL;
}

static struct strict_qp *strict_qp_find(const struct ibv_qp *qp)
{
    for (struct strict_qp *q = strict_qps; NULL != q; q = q->next) {
        if (q->qp == qp) {
            return q;
        }
    }
    return NULL;
}

static struct strict_qp *strict_qp_find_num(const struct ibv_context *ctx, uint32_t qp_num)
{
    for (struct strict_qp *q = strict_qps; NULL != q; q = q->next) {
        if (q->qp->context == ctx && q->qp->qp_num == qp_num) {
            return q;
        }
    }
    return NULL;
}

/*
 * Takes one of MAX slots of KIND ("qp" or "mr") of the device: a lock file held with
 * flock() by an open descriptor. Every process of the guest sees the same files, and the
 * kernel drops the lock when its holder dies, so crashed programs leak nothing.
 * Returns the descriptor, or -errno (EBUSY: all slots taken).
 */
static int strict_slot_take(const struct strict_ctx *sctx, const char *kind, int max,
                            const char *call)
{
    char path[PATH_MAX + 16];

    for (int i = 0; i < max; ++i) {
        snprintf(path, sizeof(path), "%s/%s.%d", sctx->slot_dir, kind, i);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            int err = errno;
            fprintf(stderr, "tbrdma-strict: %s: open(%s) failed: %s; check that %s is "
                    "writable\n", call, path, strerror(err), STRICT_SLOT_DIR);
            return -err;
        }
        if (0 == flock(fd, LOCK_EX | LOCK_NB)) {
            return fd;
        }
        close(fd);
    }
    return -EBUSY;
}

/* Device names are unique in the kernel, across network namespaces. */
static int strict_ctx_slot_dir(struct strict_ctx *sctx)
{
    int n = snprintf(sctx->slot_dir, sizeof(sctx->slot_dir), "%s/%s", STRICT_SLOT_DIR,
                     sctx->ctx->device->name);

    if (n < 0 || (size_t) n >= sizeof(sctx->slot_dir)) {
        return ENAMETOOLONG;
    }
    /* Any user may count against the device's limits: the directories are shared. */
    if ((0 != mkdir(STRICT_SLOT_DIR, 01777) && EEXIST != errno) ||
        (0 != mkdir(sctx->slot_dir, 01777) && EEXIST != errno)) {
        return errno;
    }
    return 0;
}

/* ---- work requests ---- */

static const char *strict_check_send_wr(const struct ibv_send_wr *wr, int *err)
{
    *err = EINVAL;
    if (IBV_WR_SEND != wr->opcode) {
        strict_log("send-only", "ibv_post_send", "opcode %d refused: only IBV_WR_SEND "
                   "exists (no RDMA write/read, atomics or immediate data) (errno EINVAL)",
                   (int) wr->opcode);
        return "send-only";
    }
    if (wr->send_flags & IBV_SEND_INLINE) {
        strict_log("no-inline", "ibv_post_send", "IBV_SEND_INLINE refused: "
                   "max_inline_data is 0; send from a registered buffer (errno EINVAL)");
        return "no-inline";
    }
    if (wr->num_sge > 1) {
        strict_log("one-sge", "ibv_post_send", "%d SGEs refused: one SGE per work request; "
                   "copy into one buffer (errno EINVAL)", wr->num_sge);
        return "one-sge";
    }
    if (1 == wr->num_sge && wr->sg_list[0].length > STRICT_MAX_MESSAGE_BYTES) {
        strict_log("message-size", "ibv_post_send", "%" PRIu32 " bytes refused: at most %u "
                   "bytes a message (errno EINVAL)", wr->sg_list[0].length,
                   STRICT_MAX_MESSAGE_BYTES);
        return "message-size";
    }
    return NULL;
}

static int strict_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                            struct ibv_send_wr **bad_wr)
{
    struct ibv_send_wr *prev = NULL, *bad = NULL;
    post_send_fn real;
    int err = 0, rc;

    pthread_mutex_lock(&strict_lock);
    real = strict_ctx_find(qp->context)->post_send;
    pthread_mutex_unlock(&strict_lock);

    for (struct ibv_send_wr *w = wr; NULL != w; prev = w, w = w->next) {
        if (NULL != strict_check_send_wr(w, &err)) {
            bad = w;
            break;
        }
    }
    if (NULL == bad) {
        return real(qp, wr, bad_wr);
    }
    /* Post the valid work requests before the first refused one, as a device would. */
    if (NULL != prev) {
        prev->next = NULL;
        rc = real(qp, wr, bad_wr);
        prev->next = bad;
        if (0 != rc) {
            return rc;
        }
    }
    *bad_wr = bad;
    return err;
}

static const char *strict_check_recv_wr(const struct strict_qp *sq, const struct ibv_recv_wr *wr,
                                        unsigned int queued, int *err)
{
    *err = EINVAL;
    if (NULL != sq && IBV_QPS_RTS != sq->state) {
        strict_log("recv-after-rts", "ibv_post_recv", "QP 0x%x is not in RTS: receives can "
                   "be posted only once the QP is in RTS (errno EINVAL)", sq->qp->qp_num);
        return "recv-after-rts";
    }
    if (wr->num_sge > 1) {
        strict_log("one-sge", "ibv_post_recv", "%d SGEs refused: one SGE per work request "
                   "(errno EINVAL)", wr->num_sge);
        return "one-sge";
    }
    if (1 == wr->num_sge && wr->sg_list[0].length > STRICT_MAX_MESSAGE_BYTES) {
        strict_log("message-size", "ibv_post_recv", "%" PRIu32 " bytes refused: at most %u "
                   "bytes a message (errno EINVAL)", wr->sg_list[0].length,
                   STRICT_MAX_MESSAGE_BYTES);
        return "message-size";
    }
    if (queued >= STRICT_MAX_RECV_PER_QP) {
        *err = ENOMEM;
        strict_log("recv-depth", "ibv_post_recv", "QP 0x%x already has %u receives "
                   "outstanding; at most %d (errno ENOMEM)", sq->qp->qp_num, queued,
                   STRICT_MAX_RECV_PER_QP);
        return "recv-depth";
    }
    return NULL;
}

static int strict_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                            struct ibv_recv_wr **bad_wr)
{
    struct ibv_recv_wr *prev = NULL, *bad = NULL;
    struct strict_qp *sq;
    unsigned int queued, pushed = 0;
    int err = 0, rc = 0;

    /* Held across the real post: the frame counts must be queued in posting order and
     * before any completion of these receives can be polled. */
    pthread_mutex_lock(&strict_lock);
    post_recv_fn real = strict_ctx_find(qp->context)->post_recv;
    sq = strict_qp_find(qp);
    queued = NULL != sq ? sq->recv_count : 0;
    for (struct ibv_recv_wr *w = wr; NULL != w; prev = w, w = w->next, ++queued) {
        if (NULL != strict_check_recv_wr(sq, w, queued, &err)) {
            bad = w;
            break;
        }
        if (NULL != sq) {
            uint64_t bytes = 1 == w->num_sge ? w->sg_list[0].length : 0;
            sq->recv_frames[(sq->recv_head + sq->recv_count + pushed) %
                            STRICT_MAX_RECV_PER_QP] = strict_frames(bytes);
            ++pushed;
        }
    }
    if (NULL != bad && NULL != prev) {
        prev->next = NULL;
    }
    if (bad != wr) {
        rc = real(qp, wr, bad_wr);
    }
    if (NULL != bad && NULL != prev) {
        prev->next = bad;
    }
    if (NULL != sq) {
        if (0 != rc) {
            /* Only the receives before the one the device refused were posted. */
            pushed = 0;
            for (struct ibv_recv_wr *w = wr; w != *bad_wr; w = w->next) {
                ++pushed;
            }
        }
        sq->recv_count += pushed;
    }
    pthread_mutex_unlock(&strict_lock);
    if (0 != rc) {
        return rc;
    }
    if (NULL != bad) {
        *bad_wr = bad;
        return err;
    }
    return 0;
}

/* A receive completion for QP SQ: check the frame rule against the oldest posted
 * receive. Called with strict_lock held. */
static void strict_recv_completed(struct strict_qp *sq, struct ibv_wc *wc)
{
    uint32_t posted, got;

    if (0 == sq->recv_count) {
        return;
    }
    posted = sq->recv_frames[sq->recv_head];
    sq->recv_head = (sq->recv_head + 1) % STRICT_MAX_RECV_PER_QP;
    --sq->recv_count;
    if (IBV_WC_SUCCESS != wc->status) {
        return;
    }
    got = strict_frames(wc->byte_len);
    if (got != posted) {
        strict_log("frame-rule", "ibv_poll_cq", "QP 0x%x: a %" PRIu32 "-byte message (%" PRIu32
                   " frames of 4 KiB) landed in a receive of %" PRIu32 " frames; completed "
                   "as IBV_WC_LOC_LEN_ERR: size receives in the sender's frame count",
                   sq->qp->qp_num, wc->byte_len, got, posted);
        wc->status = IBV_WC_LOC_LEN_ERR;
    }
}

static int strict_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    poll_cq_fn real;
    int n;

    pthread_mutex_lock(&strict_lock);
    real = strict_ctx_find(cq->context)->poll_cq;
    pthread_mutex_unlock(&strict_lock);

    n = real(cq, num_entries, wc);
    if (n <= 0) {
        return n;
    }
    pthread_mutex_lock(&strict_lock);
    for (int i = 0; i < n; ++i) {
        struct strict_qp *sq = strict_qp_find_num(cq->context, wc[i].qp_num);
        if (NULL == sq) {
            continue;
        }
        /* With one CQ for both queues, rely on the opcode, which rxe also sets on
         * error completions. */
        bool recv = sq->qp->recv_cq != sq->qp->send_cq ? cq == sq->qp->recv_cq
                                                        : (wc[i].opcode & IBV_WC_RECV);
        if (recv) {
            strict_recv_completed(sq, &wc[i]);
        }
    }
    pthread_mutex_unlock(&strict_lock);
    return n;
}

/* ---- ibv_wr_* API of extended QPs ---- */

static struct strict_qp *strict_qpx_find(struct ibv_qp_ex *qpx)
{
    pthread_mutex_lock(&strict_lock);
    struct strict_qp *sq = strict_qp_find(&qpx->qp_base);
    pthread_mutex_unlock(&strict_lock);
    return sq;
}

static void strict_wr_violate(struct ibv_qp_ex *qpx, const char *rule, const char *call,
                              const char *what)
{
    struct strict_qp *sq = strict_qpx_find(qpx);

    strict_log(rule, call, "%s; the whole batch fails at ibv_wr_complete (errno EINVAL)",
               what);
    if (NULL != sq && NULL == sq->wr_violation) {
        sq->wr_violation = rule;
    }
}

static void strict_wr_start(struct ibv_qp_ex *qpx)
{
    struct strict_qp *sq = strict_qpx_find(qpx);

    sq->wr_violation = NULL;
    sq->wr.wr_start(qpx);
}

static int strict_wr_complete(struct ibv_qp_ex *qpx)
{
    struct strict_qp *sq = strict_qpx_find(qpx);

    if (NULL != sq->wr_violation) {
        sq->wr.wr_abort(qpx);
        sq->wr_violation = NULL;
        return EINVAL;
    }
    return sq->wr.wr_complete(qpx);
}

static void strict_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr,
                              uint32_t length)
{
    struct strict_qp *sq = strict_qpx_find(qpx);

    if (length > STRICT_MAX_MESSAGE_BYTES) {
        strict_wr_violate(qpx, "message-size", "ibv_wr_set_sge", "message over 16,773,120 "
                          "bytes");
    }
    sq->wr.wr_set_sge(qpx, lkey, addr, length);
}

static void strict_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge,
                                   const struct ibv_sge *sg_list)
{
    struct strict_qp *sq = strict_qpx_find(qpx);

    if (num_sge > 1) {
        strict_wr_violate(qpx, "one-sge", "ibv_wr_set_sge_list", "more than one SGE");
    } else if (1 == num_sge && sg_list[0].length > STRICT_MAX_MESSAGE_BYTES) {
        strict_wr_violate(qpx, "message-size", "ibv_wr_set_sge_list",
                          "message over 16,773,120 bytes");
    }
    sq->wr.wr_set_sge_list(qpx, num_sge, sg_list);
}

static void strict_wr_inline(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
    (void) addr;
    (void) length;
    strict_wr_violate(qpx, "no-inline", "ibv_wr_set_inline_data", "inline data");
}

static void strict_wr_inline_list(struct ibv_qp_ex *qpx, size_t num_buf,
                                  const struct ibv_data_buf *buf_list)
{
    (void) num_buf;
    (void) buf_list;
    strict_wr_violate(qpx, "no-inline", "ibv_wr_set_inline_data_list", "inline data");
}

/* Creation refuses every send_ops_flags bit but IBV_QP_EX_WITH_SEND, yet a provider may
 * still fill in the other builders: each of these only marks the batch as failed. */
#define STRICT_WR_REFUSE(name, ...)                                                  \
    static void strict_##name(struct ibv_qp_ex *qpx, __VA_ARGS__)                    \
    {                                                                               \
        strict_wr_violate(qpx, "send-only", "ibv_" #name, "only ibv_wr_send exists"); \
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
STRICT_WR_REFUSE(wr_atomic_cmp_swp, uint32_t a, uint64_t b, uint64_t c, uint64_t d)
STRICT_WR_REFUSE(wr_atomic_fetch_add, uint32_t a, uint64_t b, uint64_t c)
STRICT_WR_REFUSE(wr_bind_mw, struct ibv_mw *a, uint32_t b, const struct ibv_mw_bind_info *c)
STRICT_WR_REFUSE(wr_local_inv, uint32_t a)
STRICT_WR_REFUSE(wr_rdma_read, uint32_t a, uint64_t b)
STRICT_WR_REFUSE(wr_rdma_write, uint32_t a, uint64_t b)
STRICT_WR_REFUSE(wr_rdma_write_imm, uint32_t a, uint64_t b, __be32 c)
STRICT_WR_REFUSE(wr_send_imm, __be32 a)
STRICT_WR_REFUSE(wr_send_inv, uint32_t a)
STRICT_WR_REFUSE(wr_send_tso, void *a, uint16_t b, uint16_t c)
#pragma GCC diagnostic pop

static void strict_wrap_qpx(struct strict_qp *sq, struct ibv_qp_ex *qpx)
{
    sq->extended = true;
    sq->wr.wr_start = qpx->wr_start;
    sq->wr.wr_complete = qpx->wr_complete;
    sq->wr.wr_abort = qpx->wr_abort;
    sq->wr.wr_set_sge = qpx->wr_set_sge;
    sq->wr.wr_set_sge_list = qpx->wr_set_sge_list;
    qpx->wr_start = strict_wr_start;
    qpx->wr_complete = strict_wr_complete;
    qpx->wr_set_sge = strict_wr_set_sge;
    qpx->wr_set_sge_list = strict_wr_set_sge_list;
    qpx->wr_set_inline_data = strict_wr_inline;
    qpx->wr_set_inline_data_list = strict_wr_inline_list;
    qpx->wr_atomic_cmp_swp = strict_wr_atomic_cmp_swp;
    qpx->wr_atomic_fetch_add = strict_wr_atomic_fetch_add;
    qpx->wr_bind_mw = strict_wr_bind_mw;
    qpx->wr_local_inv = strict_wr_local_inv;
    qpx->wr_rdma_read = strict_wr_rdma_read;
    qpx->wr_rdma_write = strict_wr_rdma_write;
    qpx->wr_rdma_write_imm = strict_wr_rdma_write_imm;
    qpx->wr_send_imm = strict_wr_send_imm;
    qpx->wr_send_inv = strict_wr_send_inv;
    qpx->wr_send_tso = strict_wr_send_tso;
}

/* ---- queue pairs ---- */

/* Checks a QP request against the rules; returns 0 or the errno to fail with. */
static int strict_check_qp_init(enum ibv_qp_type type, const struct ibv_qp_cap *cap,
                                uint64_t send_ops, const char *call)
{
    if (IBV_QPT_UC != type) {
        strict_log("uc-only", call, "QP type %d refused: only UC queue pairs exist (no RC, "
                   "no UD) (errno EOPNOTSUPP)", (int) type);
        return EOPNOTSUPP;
    }
    if (cap->max_inline_data > 0) {
        strict_log("no-inline", call, "max_inline_data %" PRIu32 " refused: the device has "
                   "none; request 0 (errno EINVAL)", cap->max_inline_data);
        return EINVAL;
    }
    if (cap->max_send_sge > 1 || cap->max_recv_sge > 1) {
        strict_log("one-sge", call, "max_send_sge %" PRIu32 " / max_recv_sge %" PRIu32
                   " refused: one SGE per work request (errno EINVAL)", cap->max_send_sge,
                   cap->max_recv_sge);
        return EINVAL;
    }
    if (send_ops & ~(uint64_t) IBV_QP_EX_WITH_SEND) {
        strict_log("send-only", call, "send_ops_flags 0x%" PRIx64 " refused: only "
                   "IBV_QP_EX_WITH_SEND exists (errno EOPNOTSUPP)", send_ops);
        return EOPNOTSUPP;
    }
    return 0;
}

/* Takes a QP slot of the device; returns the descriptor or -errno. */
static int strict_qp_slot(struct ibv_context *ctx, const char *call)
{
    pthread_mutex_lock(&strict_lock);
    struct strict_ctx *sctx = strict_ctx_find(ctx);
    pthread_mutex_unlock(&strict_lock);
    if (NULL == sctx) {
        fprintf(stderr, "tbrdma-strict: %s: device %s was not opened through ibv_open_device "
                "(ibv_import_device?); strict mode cannot follow it\n", call,
                ctx->device->name);
        return -EOPNOTSUPP;
    }
    int fd = strict_slot_take(sctx, "qp", STRICT_MAX_QP_PER_DEVICE, call);
    if (-EBUSY == fd) {
        strict_log("qp-limit", call, "device %s already has %d QPs in this guest: at most %d "
                   "per device (errno EBUSY)", ctx->device->name,
                   STRICT_MAX_QP_PER_DEVICE, STRICT_MAX_QP_PER_DEVICE);
    }
    return fd;
}

/* rxe writes its real capabilities back into the request; report Apple's instead, so
 * that a program reusing the structure for its next QP does not ask for inline data. */
static void strict_clamp_caps(struct ibv_qp_cap *cap)
{
    cap->max_inline_data = 0;
    cap->max_send_sge = cap->max_send_sge > 1 ? 1 : cap->max_send_sge;
    cap->max_recv_sge = cap->max_recv_sge > 1 ? 1 : cap->max_recv_sge;
}

/* Records a new QP; on failure destroys it. */
static struct ibv_qp *strict_qp_track(struct ibv_qp *qp, int slot_fd, bool extended)
{
    struct strict_qp *sq = calloc(1, sizeof(*sq));

    if (NULL == sq) {
        fprintf(stderr, "tbrdma-strict: calloc(QP state) failed: out of memory\n");
        goto fail;
    }
    sq->qp = qp;
    sq->slot_fd = slot_fd;
    sq->state = IBV_QPS_RESET;
    pthread_mutex_lock(&strict_lock);
    sq->sctx = strict_ctx_find(qp->context);
    if (extended) {
        STRICT_REAL(ibv_qp_to_qp_ex);
        if (NULL == real_fn) {
            pthread_mutex_unlock(&strict_lock);
            goto fail;
        }
        strict_wrap_qpx(sq, real_fn(qp));
    }
    sq->next = strict_qps;
    strict_qps = sq;
    pthread_mutex_unlock(&strict_lock);
    return qp;

fail:
    free(sq);
    ibv_destroy_qp(qp);
    close(slot_fd);
    errno = ENOMEM;
    return NULL;
}

STRICT_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    STRICT_REAL(ibv_create_qp);
    struct ibv_qp *qp;
    int err, fd;

    if (NULL == real_fn) {
        errno = ENOSYS;
        return NULL;
    }
    if (strict_depth > 0) {
        return real_fn(pd, attr);
    }
    err = strict_check_qp_init(attr->qp_type, &attr->cap, 0, "ibv_create_qp");
    if (0 == err && NULL != attr->srq) {
        strict_log("no-srq", "ibv_create_qp", "QP with an SRQ refused (errno EOPNOTSUPP)");
        err = EOPNOTSUPP;
    }
    if (0 != err) {
        errno = err;
        return NULL;
    }
    fd = strict_qp_slot(pd->context, "ibv_create_qp");
    if (fd < 0) {
        errno = -fd;
        return NULL;
    }
    ++strict_depth;
    qp = real_fn(pd, attr);
    --strict_depth;
    if (NULL == qp) {
        err = errno;
        close(fd);
        errno = err;
        return NULL;
    }
    strict_clamp_caps(&attr->cap);
    return strict_qp_track(qp, fd, false);
}

static struct ibv_qp *strict_create_qp_ex(struct ibv_context *ctx,
                                          struct ibv_qp_init_attr_ex *attr)
{
    bool extended = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    uint64_t send_ops = extended ? attr->send_ops_flags : 0;
    create_qp_ex_fn real;
    struct ibv_qp *qp;
    int err, fd;

    err = strict_check_qp_init(attr->qp_type, &attr->cap, send_ops, "ibv_create_qp_ex");
    if (0 == err && NULL != attr->srq) {
        strict_log("no-srq", "ibv_create_qp_ex", "QP with an SRQ refused (errno EOPNOTSUPP)");
        err = EOPNOTSUPP;
    }
    if (0 != err) {
        errno = err;
        return NULL;
    }
    fd = strict_qp_slot(ctx, "ibv_create_qp_ex");
    if (fd < 0) {
        errno = -fd;
        return NULL;
    }
    pthread_mutex_lock(&strict_lock);
    real = strict_ctx_find(ctx)->create_qp_ex;
    pthread_mutex_unlock(&strict_lock);
    ++strict_depth;
    qp = real(ctx, attr);
    --strict_depth;
    if (NULL == qp) {
        err = errno;
        close(fd);
        errno = err;
        return NULL;
    }
    strict_clamp_caps(&attr->cap);
    return strict_qp_track(qp, fd, extended);
}

STRICT_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    STRICT_REAL(ibv_modify_qp);
    int rc;

    if (NULL == real_fn) {
        return ENOSYS;
    }
    rc = real_fn(qp, attr, attr_mask);
    if (0 == rc && (attr_mask & IBV_QP_STATE)) {
        pthread_mutex_lock(&strict_lock);
        struct strict_qp *sq = strict_qp_find(qp);
        if (NULL != sq) {
            sq->state = attr->qp_state;
        }
        pthread_mutex_unlock(&strict_lock);
    }
    return rc;
}

STRICT_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    STRICT_REAL(ibv_destroy_qp);
    struct strict_qp *found = NULL;
    int rc;

    if (NULL == real_fn) {
        return ENOSYS;
    }
    rc = real_fn(qp);
    if (0 != rc) {
        return rc;
    }
    pthread_mutex_lock(&strict_lock);
    for (struct strict_qp **p = &strict_qps; NULL != *p; p = &(*p)->next) {
        if ((*p)->qp == qp) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&strict_lock);
    if (NULL != found) {
        close(found->slot_fd);
        free(found);
    }
    return 0;
}

/* ---- SRQs and extended CQs: refused ---- */

STRICT_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    (void) pd;
    (void) attr;
    strict_log("no-srq", "ibv_create_srq", "shared receive queues are not known to exist on "
               "Apple's RDMA and would bypass the per-QP receive rules (errno EOPNOTSUPP)");
    errno = EOPNOTSUPP;
    return NULL;
}

static struct ibv_srq *strict_create_srq_ex(struct ibv_context *ctx,
                                            struct ibv_srq_init_attr_ex *attr)
{
    (void) ctx;
    (void) attr;
    strict_log("no-srq", "ibv_create_srq_ex", "shared receive queues are refused "
               "(errno EOPNOTSUPP)");
    errno = EOPNOTSUPP;
    return NULL;
}

static struct ibv_cq_ex *strict_create_cq_ex(struct ibv_context *ctx,
                                             struct ibv_cq_init_attr_ex *attr)
{
    (void) ctx;
    (void) attr;
    strict_log("no-cq-ex", "ibv_create_cq_ex", "the extended CQ API is refused: its "
               "completions would bypass the receive checks; use ibv_create_cq "
               "(errno EOPNOTSUPP)");
    errno = EOPNOTSUPP;
    return NULL;
}

/* ---- memory regions ---- */

static int strict_mr_slot(struct ibv_pd *pd, const char *call)
{
    pthread_mutex_lock(&strict_lock);
    struct strict_ctx *sctx = strict_ctx_find(pd->context);
    pthread_mutex_unlock(&strict_lock);
    if (NULL == sctx) {
        fprintf(stderr, "tbrdma-strict: %s: device %s was not opened through ibv_open_device; "
                "strict mode cannot follow it\n", call, pd->context->device->name);
        return -EOPNOTSUPP;
    }
    int fd = strict_slot_take(sctx, "mr", STRICT_MAX_MR_PER_DEVICE, call);
    if (-EBUSY == fd) {
        strict_log("mr-limit", call, "device %s already has %d memory regions in this guest: "
                   "at most %d per device; register a few large buffers (errno EBUSY)",
                   pd->context->device->name, STRICT_MAX_MR_PER_DEVICE,
                   STRICT_MAX_MR_PER_DEVICE);
    }
    return fd;
}

static struct ibv_mr *strict_mr_track(struct ibv_mr *mr, int fd)
{
    struct strict_mr *sm;

    if (NULL == mr) {
        int err = errno;
        close(fd);
        errno = err;
        return NULL;
    }
    sm = malloc(sizeof(*sm));
    if (NULL == sm) {
        fprintf(stderr, "tbrdma-strict: malloc(MR state) failed: out of memory\n");
        goto fail;
    }
    sm->mr = mr;
    sm->slot_fd = fd;
    pthread_mutex_lock(&strict_lock);
    sm->next = strict_mrs;
    strict_mrs = sm;
    pthread_mutex_unlock(&strict_lock);
    return mr;

fail:
    ibv_dereg_mr(mr);
    close(fd);
    errno = ENOMEM;
    return NULL;
}

/* Registers through CALL_REAL (an expression using pd) once a slot is held. */
#define STRICT_REG_MR(name, call_real)                                  \
    STRICT_REAL(name);                                                  \
    struct ibv_mr *mr;                                                  \
    int fd;                                                             \
    if (NULL == real_fn) {                                              \
        errno = ENOSYS;                                                 \
        return NULL;                                                    \
    }                                                                   \
    if (strict_depth > 0) {                                             \
        return call_real;                                               \
    }                                                                   \
    fd = strict_mr_slot(pd, #name);                                     \
    if (fd < 0) {                                                       \
        errno = -fd;                                                    \
        return NULL;                                                    \
    }                                                                   \
    ++strict_depth;                                                     \
    mr = call_real;                                                     \
    --strict_depth;                                                     \
    return strict_mr_track(mr, fd)

#undef ibv_reg_mr
STRICT_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
                                        int access)
{
    STRICT_REG_MR(ibv_reg_mr, real_fn(pd, addr, length, access));
}

#undef ibv_reg_mr_iova
STRICT_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                                             uint64_t iova, int access)
{
    STRICT_REG_MR(ibv_reg_mr_iova, real_fn(pd, addr, length, iova, access));
}

STRICT_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                              uint64_t iova, unsigned int access)
{
    STRICT_REG_MR(ibv_reg_mr_iova2, real_fn(pd, addr, length, iova, access));
}

STRICT_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
                                               size_t length, uint64_t iova, int fd_arg,
                                               int access)
{
    STRICT_REG_MR(ibv_reg_dmabuf_mr, real_fn(pd, offset, length, iova, fd_arg, access));
}

STRICT_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    STRICT_REAL(ibv_dereg_mr);
    struct strict_mr *found = NULL;
    int rc;

    if (NULL == real_fn) {
        return ENOSYS;
    }
    rc = real_fn(mr);
    if (0 != rc) {
        return rc;
    }
    pthread_mutex_lock(&strict_lock);
    for (struct strict_mr **p = &strict_mrs; NULL != *p; p = &(*p)->next) {
        if ((*p)->mr == mr) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&strict_lock);
    if (NULL != found) {
        close(found->slot_fd);
        free(found);
    }
    return 0;
}

/* ---- devices ---- */

STRICT_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    STRICT_REAL(ibv_open_device);
    struct ibv_context *ctx;
    struct strict_ctx *sctx;
    struct verbs_context *vctx;
    int err;

    if (NULL == real_fn) {
        errno = ENOSYS;
        return NULL;
    }
    ctx = real_fn(device);
    if (NULL == ctx) {
        return NULL;
    }
    sctx = calloc(1, sizeof(*sctx));
    if (NULL == sctx) {
        fprintf(stderr, "tbrdma-strict: ibv_open_device: calloc failed: out of memory\n");
        err = ENOMEM;
        goto fail;
    }
    sctx->ctx = ctx;
    err = strict_ctx_slot_dir(sctx);
    if (0 != err) {
        fprintf(stderr, "tbrdma-strict: ibv_open_device(%s): mkdir(%s) failed: %s; make %s "
                "writable\n", device->name, sctx->slot_dir, strerror(err),
                STRICT_SLOT_DIR);
        goto fail;
    }
    sctx->post_send = ctx->ops.post_send;
    sctx->post_recv = ctx->ops.post_recv;
    sctx->poll_cq = ctx->ops.poll_cq;
    ctx->ops.post_send = strict_post_send;
    ctx->ops.post_recv = strict_post_recv;
    ctx->ops.poll_cq = strict_poll_cq;
    vctx = verbs_get_ctx_op(ctx, create_qp_ex);
    if (NULL != vctx) {
        sctx->create_qp_ex = vctx->create_qp_ex;
        vctx->create_qp_ex = strict_create_qp_ex;
    }
    vctx = verbs_get_ctx_op(ctx, create_cq_ex);
    if (NULL != vctx) {
        vctx->create_cq_ex = strict_create_cq_ex;
    }
    vctx = verbs_get_ctx_op(ctx, create_srq_ex);
    if (NULL != vctx) {
        vctx->create_srq_ex = strict_create_srq_ex;
    }
    pthread_mutex_lock(&strict_lock);
    sctx->next = strict_ctxs;
    strict_ctxs = sctx;
    pthread_mutex_unlock(&strict_lock);
    return ctx;

fail:
    free(sctx);
    ibv_close_device(ctx);
    errno = err;
    return NULL;
}

STRICT_EXPORT int ibv_close_device(struct ibv_context *ctx)
{
    STRICT_REAL(ibv_close_device);
    struct strict_ctx *found = NULL;

    if (NULL == real_fn) {
        return ENOSYS;
    }
    pthread_mutex_lock(&strict_lock);
    for (struct strict_ctx **p = &strict_ctxs; NULL != *p; p = &(*p)->next) {
        if ((*p)->ctx == ctx) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&strict_lock);
    free(found);
    return real_fn(ctx);
}
