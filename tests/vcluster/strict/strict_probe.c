/*
 * strict_probe: breaks each rule of strict mode in turn on one RDMA device and checks the
 * outcome. With --strict every violation must be refused; with --loose (the run's
 * --no-strict) the same requests must succeed where rxe allows them, which proves that
 * the interposer, not rxe, refuses them. Behaviour that is UC's own (a send with no
 * posted receive is dropped silently) is checked in both modes.
 *   tbrdma-strict-probe --strict|--loose [DEVICE]
 * Prints one "ok"/"not ok" line per check and exits non-zero if any check failed.
 * Queue pairs talk to each other through the device's own loopback.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PROBE_BUF_BYTES (64 * 1024)
#define PROBE_SEND_OFF 0
#define PROBE_RECV_OFF (32 * 1024)
#define PROBE_BIG_BYTES (16773120 + 4096)
#define PROBE_GID_INDEX 1 /* the IPv4-mapped GID, as on the Mac */
#define PROBE_TIMEOUT_MS 5000
#define PROBE_ATTEMPTS 3

struct probe {
    bool strict;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    char *buf;
    struct ibv_mr *mr;
    union ibv_gid gid;
    /* Completions polled while waiting for another QP's. Send and receive completions
     * share one CQ and come in either order; dropping one loses its message's result. */
    struct ibv_wc held[64];
    int nheld;
    int passed;
    int failed;
};

static void report(struct probe *p, bool ok, const char *rule, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void report(struct probe *p, bool ok, const char *rule, const char *fmt, ...)
{
    va_list ap;

    printf("%s %s: ", ok ? "ok" : "not ok", rule);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (ok) {
        ++p->passed;
    } else {
        ++p->failed;
    }
}

/* A request that strict mode must refuse with ERR and rxe alone accepts. RC is 0 or an
 * errno value. */
static void expect_refusal(struct probe *p, const char *rule, const char *what, int rc, int err)
{
    if (p->strict) {
        report(p, rc == err, rule, "%s: %s (want %s)", what, rc ? strerror(rc) : "accepted",
               strerror(err));
    } else {
        report(p, 0 == rc, rule, "%s without strict mode: %s (want accepted)", what,
               rc ? strerror(rc) : "accepted");
    }
}

static struct ibv_qp *make_qp(struct probe *p, enum ibv_qp_type type, uint32_t inline_bytes,
                              uint32_t sges)
{
    struct ibv_qp_init_attr attr = {
        .send_cq = p->cq,
        .recv_cq = p->cq,
        .qp_type = type,
        .cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = sges,
                 .max_recv_sge = sges, .max_inline_data = inline_bytes },
    };

    return ibv_create_qp(p->pd, &attr);
}

/* The caps of the probe's own QPs: Apple's under strict mode, roomy otherwise so that
 * each per-request rule can be shown to be strict mode's and not rxe's. */
static struct ibv_qp *make_uc_qp(struct probe *p)
{
    return p->strict ? make_qp(p, IBV_QPT_UC, 0, 1) : make_qp(p, IBV_QPT_UC, 64, 2);
}

static int qp_to_init(struct ibv_qp *qp)
{
    struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                                .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

    return ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* Connects QP to REMOTE_QPN on this same device, as jaccl does between Macs. */
static int qp_connect(struct probe *p, struct ibv_qp *qp, uint32_t remote_qpn)
{
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = remote_qpn,
        .rq_psn = 0,
        .ah_attr = { .is_global = 1, .port_num = 1,
                     .grh = { .dgid = p->gid, .sgid_index = PROBE_GID_INDEX,
                              .hop_limit = 1 } },
    };
    int rc = qp_to_init(qp);

    if (0 != rc) {
        fprintf(stderr, "strict_probe: ibv_modify_qp(INIT) failed: %s\n", strerror(rc));
        return rc;
    }
    rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
    if (0 != rc) {
        fprintf(stderr, "strict_probe: ibv_modify_qp(RTR) failed: %s\n", strerror(rc));
        return rc;
    }
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = 0;
    rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
    if (0 != rc) {
        fprintf(stderr, "strict_probe: ibv_modify_qp(RTS) failed: %s\n", strerror(rc));
    }
    return rc;
}

static int post_send(struct probe *p, struct ibv_qp *qp, uint32_t len, enum ibv_wr_opcode op,
                     unsigned int flags, int nsge)
{
    struct ibv_sge sge[2] = {
        { .addr = (uintptr_t) p->buf + PROBE_SEND_OFF, .length = len, .lkey = p->mr->lkey },
        { .addr = (uintptr_t) p->buf + PROBE_SEND_OFF + 8192, .length = 8, .lkey = p->mr->lkey },
    };
    struct ibv_send_wr wr = { .wr_id = 1, .sg_list = sge, .num_sge = nsge, .opcode = op,
                              .send_flags = IBV_SEND_SIGNALED | flags }, *bad;

    if (IBV_WR_RDMA_WRITE == op) {
        wr.wr.rdma.remote_addr = (uintptr_t) p->buf + PROBE_RECV_OFF;
        wr.wr.rdma.rkey = p->mr->rkey;
    }
    return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(struct probe *p, struct ibv_qp *qp, uint32_t len)
{
    struct ibv_sge sge = { .addr = (uintptr_t) p->buf + PROBE_RECV_OFF, .length = len,
                           .lkey = p->mr->lkey };
    struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;

    return ibv_post_recv(qp, &wr, &bad);
}

static long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits up to PROBE_TIMEOUT_MS for a completion of QP_NUM (send or receive side, as
 * RECV says); other completions are discarded. Returns false on timeout. */
static bool wc_matches(const struct ibv_wc *wc, uint32_t qp_num, bool recv)
{
    return wc->qp_num == qp_num &&
           (IBV_WC_SUCCESS == wc->status ? (0 != (wc->opcode & IBV_WC_RECV)) == recv : true);
}

static bool wait_wc(struct probe *p, uint32_t qp_num, bool recv, struct ibv_wc *out)
{
    long deadline = now_ms() + PROBE_TIMEOUT_MS;
    struct ibv_wc wc;

    for (int i = 0; i < p->nheld; ++i) {
        if (wc_matches(&p->held[i], qp_num, recv)) {
            *out = p->held[i];
            memmove(&p->held[i], &p->held[i + 1], (p->nheld - i - 1) * sizeof(wc));
            --p->nheld;
            return true;
        }
    }
    while (now_ms() < deadline) {
        int n = ibv_poll_cq(p->cq, 1, &wc);
        if (n < 0) {
            fprintf(stderr, "strict_probe: ibv_poll_cq failed (%d)\n", n);
            return false;
        }
        if (1 != n) {
            continue;
        }
        if (wc_matches(&wc, qp_num, recv)) {
            *out = wc;
            return true;
        }
        if (p->nheld < (int) (sizeof(p->held) / sizeof(p->held[0]))) {
            p->held[p->nheld++] = wc;
        }
    }
    return false;
}

/* Waits for QP's send completion; true if it arrived and succeeded. */
static bool send_done(struct probe *p, struct ibv_qp *qp)
{
    struct ibv_wc wc;

    return wait_wc(p, qp->qp_num, false, &wc) && IBV_WC_SUCCESS == wc.status;
}

static void drain_cq(struct probe *p, int ms)
{
    long deadline = now_ms() + ms;
    struct ibv_wc wc;

    while (now_ms() < deadline) {
        ibv_poll_cq(p->cq, 1, &wc);
    }
    p->nheld = 0;
}

/* ---- the checks ---- */

static void check_create(struct probe *p)
{
    struct ibv_qp *qp;

    qp = make_qp(p, IBV_QPT_RC, 0, 1);
    expect_refusal(p, "uc-only", "create an RC QP", qp ? 0 : errno, EOPNOTSUPP);
    if (qp) {
        ibv_destroy_qp(qp);
    }
    qp = make_qp(p, IBV_QPT_UD, 0, 1);
    expect_refusal(p, "uc-only", "create a UD QP", qp ? 0 : errno, EOPNOTSUPP);
    if (qp) {
        ibv_destroy_qp(qp);
    }
    qp = make_qp(p, IBV_QPT_UC, 64, 1);
    expect_refusal(p, "no-inline", "create a UC QP with max_inline_data 64", qp ? 0 : errno,
                   EINVAL);
    if (qp) {
        ibv_destroy_qp(qp);
    }
    qp = make_qp(p, IBV_QPT_UC, 0, 2);
    expect_refusal(p, "one-sge", "create a UC QP with 2 SGEs", qp ? 0 : errno, EINVAL);
    if (qp) {
        ibv_destroy_qp(qp);
    }

    struct ibv_qp_init_attr_ex ax = {
        .send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_UC, .pd = p->pd,
        .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
    };
    qp = ibv_create_qp_ex(p->ctx, &ax);
    expect_refusal(p, "send-only", "ibv_create_qp_ex with IBV_QP_EX_WITH_RDMA_WRITE",
                   qp ? 0 : errno, EOPNOTSUPP);
    if (qp) {
        ibv_destroy_qp(qp);
    }

    struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
    struct ibv_srq *srq = ibv_create_srq(p->pd, &sa);
    expect_refusal(p, "no-srq", "create an SRQ", srq ? 0 : errno, EOPNOTSUPP);
    if (srq) {
        ibv_destroy_srq(srq);
    }

    struct ibv_cq_init_attr_ex ca = { .cqe = 16 };
    struct ibv_cq_ex *cqx = ibv_create_cq_ex(p->ctx, &ca);
    expect_refusal(p, "no-cq-ex", "ibv_create_cq_ex", cqx ? 0 : errno, EOPNOTSUPP);
    if (cqx) {
        ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
    }
}

static void check_recv_before_rts(struct probe *p)
{
    struct ibv_qp *qp = make_uc_qp(p);

    if (NULL == qp || 0 != qp_to_init(qp)) {
        report(p, false, "recv-after-rts", "cannot create a QP in INIT: %s", strerror(errno));
        goto out;
    }
    expect_refusal(p, "recv-after-rts", "post a receive in INIT", post_recv(p, qp, 4096),
                   EINVAL);
out:
    if (qp) {
        ibv_destroy_qp(qp);
    }
}

/* Sends SEND_LEN bytes from A into a receive of RECV_LEN bytes on B; returns B's
 * completion status, or -1 if no completion came. UC gives no delivery guarantee, even
 * through loopback on a loaded machine: a lost message is sent again. */
static int transfer(struct probe *p, struct ibv_qp *a, struct ibv_qp *b, uint32_t send_len,
                    uint32_t recv_len)
{
    struct ibv_wc wc;

    if (0 != post_recv(p, b, recv_len)) {
        return -2;
    }
    for (int attempt = 0; attempt < PROBE_ATTEMPTS; ++attempt) {
        if (0 != post_send(p, a, send_len, IBV_WR_SEND, 0, 1) || !send_done(p, a)) {
            return -2;
        }
        if (wait_wc(p, b->qp_num, true, &wc)) {
            return (int) wc.status;
        }
    }
    return -1;
}

/* rxe's count of packets received on the probe's port, or -1 when unreadable. */
static long rcvd_pkts(const struct probe *p)
{
    char path[256];
    long n = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/rcvd_pkts",
             ibv_get_device_name(p->ctx->device));
    f = fopen(path, "r");
    if (NULL != f) {
        if (1 != fscanf(f, "%ld", &n)) {
            n = -1;
        }
        fclose(f);
    }
    return n;
}

/* UC's own behaviour, in both modes: a message with no receive posted is lost without
 * an error on either side, and the next one lands normally. On a loaded machine the
 * first message may reach the far end only after the receive is posted, which proves
 * nothing: such an attempt is repeated. */
static void check_no_recv_drop(struct probe *p, struct ibv_qp *a, struct ibv_qp *b)
{
    int st = -2;

    for (int attempt = 0; attempt < PROBE_ATTEMPTS; ++attempt) {
        long before = rcvd_pkts(p);
        long deadline = now_ms() + PROBE_TIMEOUT_MS;

        strcpy(p->buf + PROBE_SEND_OFF, "first");
        if (0 != post_send(p, a, 64, IBV_WR_SEND, 0, 1) || !send_done(p, a)) {
            break;
        }
        /* Wait for the first message to arrive, then for it to be dropped. */
        while (before >= 0 && rcvd_pkts(p) <= before && now_ms() < deadline) {
            usleep(10 * 1000);
        }
        usleep(500 * 1000);
        strcpy(p->buf + PROBE_SEND_OFF, "second");
        memset(p->buf + PROBE_RECV_OFF, 0, 64);
        st = transfer(p, a, b, 64, 4096);
        if (IBV_WC_SUCCESS != st || 0 != strcmp(p->buf + PROBE_RECV_OFF, "first")) {
            break;
        }
        printf("# uc-drop: the first message landed in the receive posted after it; "
               "trying again\n");
    }
    bool ok = IBV_WC_SUCCESS == st && 0 == strcmp(p->buf + PROBE_RECV_OFF, "second");
    report(p, ok, "uc-drop", "a send with no posted receive completes without error and is "
           "dropped; the next send lands (status %d, received \"%.8s\")", st,
           p->buf + PROBE_RECV_OFF);
}

static void check_frames(struct probe *p, struct ibv_qp *a, struct ibv_qp *b)
{
    int st;

    st = transfer(p, a, b, 6000, 8192);
    report(p, IBV_WC_SUCCESS == st, "frame-rule", "6000 B into an 8192 B receive (2 frames "
           "each): status %d (want success)", st);
    st = transfer(p, a, b, 0, 4096);
    report(p, IBV_WC_SUCCESS == st, "frame-rule", "0 B into a 4096 B receive (1 frame each): "
           "status %d (want success)", st);
    st = transfer(p, a, b, 4096, 8192);
    if (p->strict) {
        report(p, IBV_WC_LOC_LEN_ERR == st, "frame-rule", "4096 B (1 frame) into an 8192 B "
               "receive (2 frames): status %d (want IBV_WC_LOC_LEN_ERR)", st);
    } else {
        report(p, IBV_WC_SUCCESS == st, "frame-rule", "4096 B into an 8192 B receive without "
               "strict mode: status %d (want success)", st);
    }
}

static void check_post_send(struct probe *p, struct ibv_qp *a)
{
    int rc;

    rc = post_send(p, a, 64, IBV_WR_RDMA_WRITE, 0, 1);
    expect_refusal(p, "send-only", "post an RDMA WRITE", rc, EINVAL);
    rc = post_send(p, a, 64, IBV_WR_SEND_WITH_IMM, 0, 1);
    expect_refusal(p, "send-only", "post a SEND_WITH_IMM", rc, EINVAL);
    rc = post_send(p, a, 8, IBV_WR_SEND, IBV_SEND_INLINE, 1);
    expect_refusal(p, "no-inline", "post with IBV_SEND_INLINE", rc, EINVAL);
    rc = post_send(p, a, 64, IBV_WR_SEND, 0, 2);
    expect_refusal(p, "one-sge", "post a send with 2 SGEs", rc, EINVAL);
    drain_cq(p, 500);

    char *big = malloc(PROBE_BIG_BYTES);
    struct ibv_mr *mr = big ? ibv_reg_mr(p->pd, big, PROBE_BIG_BYTES, IBV_ACCESS_LOCAL_WRITE)
                            : NULL;
    if (NULL == mr) {
        report(p, false, "message-size", "cannot register %d bytes: %s", PROBE_BIG_BYTES,
               strerror(errno));
    } else {
        struct ibv_sge sge = { .addr = (uintptr_t) big, .length = 16773121, .lkey = mr->lkey };
        struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                  .send_flags = IBV_SEND_SIGNALED }, *bad;
        expect_refusal(p, "message-size", "send 16,773,121 bytes", ibv_post_send(a, &wr, &bad),
                       EINVAL);
        drain_cq(p, 2000);
        ibv_dereg_mr(mr);
    }
    free(big);
}

/* The ibv_wr_* API: a plain send passes, inline data fails at ibv_wr_complete. */
static void check_wr_api(struct probe *p, struct ibv_qp *x, struct ibv_qp *y)
{
    struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(x);
    struct ibv_wc wc;
    int rc;

    rc = post_recv(p, y, 4096);
    ibv_wr_start(qpx);
    qpx->wr_id = 3;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_sge(qpx, p->mr->lkey, (uintptr_t) p->buf + PROBE_SEND_OFF, 100);
    rc = rc ? rc : ibv_wr_complete(qpx);
    bool ok = 0 == rc && send_done(p, x) && wait_wc(p, y->qp_num, true, &wc) &&
              IBV_WC_SUCCESS == wc.status && 100 == wc.byte_len;
    report(p, ok, "wr-api", "ibv_wr_send of 100 B arrives (rc %d)", rc);

    ibv_wr_start(qpx);
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_inline_data(qpx, p->buf, 8);
    expect_refusal(p, "no-inline", "ibv_wr_set_inline_data", ibv_wr_complete(qpx), EINVAL);
    drain_cq(p, 500);
}

static void check_recv_depth(struct probe *p, struct ibv_qp *qp)
{
    int rc = 0, posted = 0;

    while (posted < 33 && 0 == (rc = post_recv(p, qp, 4096))) {
        ++posted;
    }
    if (p->strict) {
        report(p, 32 == posted && ENOMEM == rc, "recv-depth", "posted %d receives, then %s "
               "(want 32, then ENOMEM)", posted, rc ? strerror(rc) : "nothing refused");
    } else {
        report(p, 33 == posted, "recv-depth", "posted %d receives without strict mode "
               "(want 33)", posted);
    }
}

/* The QP limit counts across processes: a child holds CHILD_QPS queue pairs of the same
 * device while this process creates more. HELD is how many this process has now. */
static void check_qp_limit(struct probe *p, struct ibv_device *dev, int held)
{
    enum { CHILD_QPS = 3 };
    int up[2], down[2], created = 0, err = 0;
    struct ibv_qp *extra[16];
    char c = 0;
    pid_t pid;

    if (0 != pipe(up) || 0 != pipe(down)) {
        report(p, false, "qp-limit", "pipe failed: %s", strerror(errno));
        return;
    }
    pid = fork();
    if (pid < 0) {
        report(p, false, "qp-limit", "fork failed: %s", strerror(errno));
        return;
    }
    if (0 == pid) {
        struct ibv_context *ctx = ibv_open_device(dev);
        struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
        struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
        struct ibv_qp_init_attr attr = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UC,
                                         .cap = { 4, 4, 1, 1, 0 } };
        int n = 0;

        while (cq && n < CHILD_QPS && ibv_create_qp(pd, &attr)) {
            ++n;
        }
        c = (char) n;
        if (1 != write(up[1], &c, 1) || 1 != read(down[0], &c, 1)) {
            _exit(1);
        }
        _exit(0);
    }
    if (1 != read(up[0], &c, 1) || CHILD_QPS != c) {
        report(p, false, "qp-limit", "the helper process created %d of %d QPs", c, CHILD_QPS);
        goto out;
    }
    while (created < 16) {
        extra[created] = make_uc_qp(p);
        if (NULL == extra[created]) {
            err = errno;
            break;
        }
        ++created;
    }
    if (p->strict) {
        int want = 10 - held - CHILD_QPS;
        report(p, want == created && EBUSY == err, "qp-limit", "with %d QPs here and %d in "
               "another process, %d more were created, then %s (want %d, then EBUSY)", held,
               CHILD_QPS, created, err ? strerror(err) : "no refusal", want);
    } else {
        report(p, 16 == created, "qp-limit", "created %d more QPs without strict mode "
               "(want 16)", created);
    }
    while (created > 0) {
        ibv_destroy_qp(extra[--created]);
    }
out:
    if (1 != write(down[1], &c, 1)) {
        kill(pid, SIGKILL);
    }
    waitpid(pid, NULL, 0);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}

static void check_mr_limit(struct probe *p, int held)
{
    enum { MAX_TRY = 110 };
    struct ibv_mr *mrs[MAX_TRY];
    int n = 0, err = 0;

    while (n < MAX_TRY) {
        mrs[n] = ibv_reg_mr(p->pd, p->buf + PROBE_SEND_OFF, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (NULL == mrs[n]) {
            err = errno;
            break;
        }
        ++n;
    }
    if (p->strict) {
        report(p, 100 - held == n && EBUSY == err, "mr-limit", "with %d MR(s) held, %d more "
               "were registered, then %s (want %d, then EBUSY)", held, n,
               err ? strerror(err) : "no refusal", 100 - held);
    } else {
        report(p, MAX_TRY == n, "mr-limit", "registered %d more MRs without strict mode "
               "(want %d)", n, MAX_TRY);
    }
    while (n > 0) {
        ibv_dereg_mr(mrs[--n]);
    }
}

static struct ibv_qp *make_wr_qp(struct probe *p)
{
    struct ibv_qp_init_attr_ex ax = {
        .send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_UC, .pd = p->pd,
        .cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1,
                 .max_inline_data = p->strict ? 0 : 64 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .send_ops_flags = IBV_QP_EX_WITH_SEND,
    };

    return ibv_create_qp_ex(p->ctx, &ax);
}

int main(int argc, char **argv)
{
    struct probe p = { 0 };
    struct ibv_device **list = NULL, *dev = NULL;
    struct ibv_qp *a = NULL, *b = NULL, *x = NULL, *y = NULL;
    int rc = 2, ndev = 0;

    if (argc < 2 || (0 != strcmp(argv[1], "--strict") && 0 != strcmp(argv[1], "--loose"))) {
        fprintf(stderr, "usage: %s --strict|--loose [DEVICE]\n", argv[0]);
        return 2;
    }
    p.strict = 0 == strcmp(argv[1], "--strict");
    list = ibv_get_device_list(&ndev);
    for (int i = 0; NULL != list && i < ndev && NULL == dev; ++i) {
        if (argc < 3 || 0 == strcmp(ibv_get_device_name(list[i]), argv[2])) {
            dev = list[i];
        }
    }
    if (NULL == dev) {
        fprintf(stderr, "strict_probe: no RDMA device%s%s: run it on a host with a cable "
                "(tbrdma-vc cables)\n", argc > 2 ? " named " : "", argc > 2 ? argv[2] : "");
        goto out;
    }
    p.ctx = ibv_open_device(dev);
    if (NULL == p.ctx) {
        fprintf(stderr, "strict_probe: ibv_open_device(%s) failed: %s\n",
                ibv_get_device_name(dev), strerror(errno));
        goto out;
    }
    p.pd = ibv_alloc_pd(p.ctx);
    p.cq = p.pd ? ibv_create_cq(p.ctx, 256, NULL, NULL, 0) : NULL;
    p.buf = aligned_alloc(4096, PROBE_BUF_BYTES);
    p.mr = p.buf && p.cq ? ibv_reg_mr(p.pd, p.buf, PROBE_BUF_BYTES, IBV_ACCESS_LOCAL_WRITE |
                                      IBV_ACCESS_REMOTE_WRITE) : NULL;
    if (NULL == p.mr) {
        fprintf(stderr, "strict_probe: setting up PD, CQ and MR failed: %s; is the locked "
                "memory limit high enough (ulimit -l unlimited)?\n", strerror(errno));
        goto out;
    }
    if (0 != ibv_query_gid(p.ctx, 1, PROBE_GID_INDEX, &p.gid)) {
        fprintf(stderr, "strict_probe: ibv_query_gid(index %d) failed: %s; does the "
                "interface have an IPv4 address?\n", PROBE_GID_INDEX, strerror(errno));
        goto out;
    }
    printf("# strict_probe on %s, %s mode\n", ibv_get_device_name(dev),
           p.strict ? "strict" : "loose");

    check_create(&p);
    check_recv_before_rts(&p);

    a = make_uc_qp(&p);
    b = make_uc_qp(&p);
    x = make_wr_qp(&p);
    y = make_uc_qp(&p);
    if (NULL == a || NULL == b || NULL == x || NULL == y ||
        0 != qp_connect(&p, a, b->qp_num) || 0 != qp_connect(&p, b, a->qp_num) ||
        0 != qp_connect(&p, x, y->qp_num) || 0 != qp_connect(&p, y, x->qp_num)) {
        fprintf(stderr, "strict_probe: creating and connecting the UC queue pairs failed: "
                "%s\n", strerror(errno));
        goto out;
    }
    check_no_recv_drop(&p, a, b);
    check_frames(&p, a, b);
    check_post_send(&p, a);
    check_wr_api(&p, x, y);
    check_recv_depth(&p, y);
    check_qp_limit(&p, dev, 4);
    check_mr_limit(&p, 1);

    printf("# strict_probe: %d passed, %d failed\n", p.passed, p.failed);
    rc = p.failed > 0 ? 1 : 0;
out:
    if (y) {
        ibv_destroy_qp(y);
    }
    if (x) {
        ibv_destroy_qp(x);
    }
    if (b) {
        ibv_destroy_qp(b);
    }
    if (a) {
        ibv_destroy_qp(a);
    }
    if (p.mr) {
        ibv_dereg_mr(p.mr);
    }
    free(p.buf);
    if (p.cq) {
        ibv_destroy_cq(p.cq);
    }
    if (p.pd) {
        ibv_dealloc_pd(p.pd);
    }
    if (p.ctx) {
        ibv_close_device(p.ctx);
    }
    if (list) {
        ibv_free_device_list(list);
    }
    return rc;
}
