/*
 * Unit tests of the reliable channel over the lossy in-process link.
 */
#include <check.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tb_channel.h"
#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_lossy_link.h"
#include "tb_rma.h"
#include "tb_wire.h"

#define SRC_SIZE (16u << 20)
#define MAX_MSGS 100000
#define MS 1000000ull

static unsigned char *src; /* random bytes every message is cut from */

/* One direction of traffic: what was sent, what arrived. */
typedef struct flow {
    uint32_t lens[MAX_MSGS];
    uint32_t offs[MAX_MSGS];
    uint8_t tags[MAX_MSGS];
    unsigned nsent;
    unsigned nrecv;
    unsigned bad; /* deliveries that did not match */
} flow_t;

typedef struct peer {
    tb_channel_t *ch;
    flow_t *in;  /* traffic this peer receives */
    unsigned send_ok;
    unsigned send_err;
    int last_send_status;
    unsigned errors;
    int error_status;
    char why[256];
    uint64_t error_ns;
    unsigned bufs_given;
    unsigned bufs_dropped;
    unsigned bufs_out;
    void *given[64]; /* caller buffers handed out, not yet returned */
    int use_recv_buf;
    int use_place;      /* place multi-frame messages (recv_place) */
    unsigned placed;    /* messages delivered through recv_placed */
    unsigned char *dst; /* the destination of the message being placed */
    /* What the channel handed back when it failed (unsent): each message's
     * length, tag and checksum, in the order given. */
    unsigned nunsent;
    uint32_t unsent_len[MAX_MSGS];
    uint8_t unsent_tag[MAX_MSGS];
    uint32_t unsent_crc[MAX_MSGS];
    struct pair *pair;
} peer_t;

typedef struct pair {
    tb_lossy_net_t *net;
    tb_lossy_cfg_t cfg;
    tb_channel_params_t params[2];
    peer_t p[2];
    flow_t flow[2]; /* flow[i]: messages received by side i */
    uint64_t now;
} pair_t;

static void log_quiet(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) level;
    (void) msg;
    (void) ctx;
}

static void fill_src(void)
{
    uint64_t x = 0x1234567;
    if (src) {
        return;
    }
    src = malloc(SRC_SIZE);
    ck_assert_ptr_nonnull(src);
    for (size_t i = 0; i < SRC_SIZE; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (unsigned char) (x >> 33);
    }
}

static void on_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    peer_t *pe = ctx;
    flow_t *f = pe->in;
    unsigned i = f->nrecv++;

    if (i >= f->nsent || f->lens[i] != len || f->tags[i] != tag
        || (len && memcmp(data, src + f->offs[i], len) != 0)) {
        f->bad++;
    }
    for (unsigned k = 0; k < pe->bufs_out; k++) {
        if (pe->given[k] == data) {
            pe->given[k] = pe->given[--pe->bufs_out];
            free((void *) data); /* a buffer from on_recv_buf: ours again */
            break;
        }
    }
}

/* Place the message in a buffer of its own, less its first bytes (kept by
 * the channel), as the BTL places a get's answer in the requester's memory. */
static void *on_recv_place(void *ctx, uint8_t tag, size_t len, const void *head, size_t head_len,
                           size_t *skip)
{
    peer_t *pe = ctx;
    flow_t *f = pe->in;
    unsigned i = f->nrecv;

    (void) tag;
    if (!pe->use_place) {
        return NULL;
    }
    /* Only the message due next, every earlier one delivered: so one at a
     * time, and none is published before an earlier one. */
    ck_assert_ptr_null(pe->dst);
    ck_assert_msg(i < f->nsent && f->lens[i] == len
                      && 0 == memcmp(head, src + f->offs[i], head_len < len ? head_len : len),
                  "recv_place asked for a message of %zu bytes before message %u was delivered",
                  len, i);
    *skip = head_len < 7 ? head_len : 7;
    pe->dst = malloc(len - *skip + 1);
    return pe->dst;
}

static void on_recv_placed(void *ctx, uint8_t tag, const void *head, size_t skip, size_t len)
{
    peer_t *pe = ctx;
    unsigned char *whole = malloc(len);

    memcpy(whole, head, skip);
    memcpy(whole + skip, pe->dst, len - skip);
    free(pe->dst);
    pe->dst = NULL;
    pe->placed++;
    on_recv(ctx, tag, whole, len);
    free(whole);
}

static void *on_recv_buf(void *ctx, uint8_t tag, size_t len)
{
    peer_t *pe = ctx;
    (void) tag;
    if (!pe->use_recv_buf) {
        return NULL;
    }
    ck_assert_uint_lt(pe->bufs_out, 64);
    pe->bufs_given++;
    return pe->given[pe->bufs_out++] = malloc(len);
}

static void on_recv_buf_drop(void *ctx, void *buf)
{
    peer_t *pe = ctx;
    pe->bufs_dropped++;
    for (unsigned k = 0; k < pe->bufs_out; k++) {
        if (pe->given[k] == buf) {
            pe->given[k] = pe->given[--pe->bufs_out];
            free(buf);
            return;
        }
    }
    ck_abort_msg("recv_buf_drop of a buffer never given");
}

static void on_send_done(void *ctx, void *cookie, int status)
{
    peer_t *pe = ctx;
    (void) cookie;
    if (status == TB_CHAN_OK) {
        pe->send_ok++;
    } else {
        pe->send_err++;
    }
    pe->last_send_status = status;
}

static void on_unsent(void *ctx, uint8_t tag, const struct iovec *iov, int iovcnt, size_t len)
{
    peer_t *pe = ctx;
    uint32_t crc = 0;
    size_t total = 0;

    ck_assert_uint_lt(pe->nunsent, MAX_MSGS);
    ck_assert_uint_eq(pe->errors, 0); /* before error, not after */
    if (NULL == iov) {
        crc = ~0u; /* larger than the window, and partly let go */
    }
    for (int i = 0; iov && i < iovcnt; i++) {
        crc = tb_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
        total += iov[i].iov_len;
    }
    ck_assert(NULL == iov || total == len);
    pe->unsent_len[pe->nunsent] = (uint32_t) len;
    pe->unsent_tag[pe->nunsent] = tag;
    pe->unsent_crc[pe->nunsent++] = crc;
}

static void on_error(void *ctx, int status, const char *why)
{
    peer_t *pe = ctx;
    snprintf(pe->why, sizeof(pe->why), "%s", why);
    pe->errors++;
    pe->error_status = status;
    pe->error_ns = pe->pair->now;
}

/* Channels made from now on take back what they did not deliver (unsent). */
static int hand_back;

static pair_t *pair_new(const tb_lossy_cfg_t *cfg, const tb_channel_params_t *params)
{
    pair_t *pr = calloc(1, sizeof(*pr));

    fill_src();
    tb_log_set_sink(log_quiet, NULL, TB_LOG_ERROR);
    ck_assert_ptr_nonnull(pr);
    pr->cfg = *cfg;
    pr->net = tb_lossy_net_create(cfg);
    ck_assert_ptr_nonnull(pr->net);
    for (int i = 0; i < 2; i++) {
        pr->params[i] = *params;
        pr->params[i].epoch = 0x1000 + (uint64_t) i;
        if (params->initial_seq[0] == 0) {
            pr->params[i].initial_seq[0] = 1000u * (unsigned) (i + 1);
            pr->params[i].initial_seq[1] = 7000u * (unsigned) (i + 1);
        }
        pr->p[i].in = &pr->flow[i];
        pr->p[i].pair = pr;
    }
    return pr;
}

static void pair_create_side(pair_t *pr, int i)
{
    tb_channel_callbacks_t cb = {
        .ctx = &pr->p[i],
        .recv = on_recv,
        .recv_buf = on_recv_buf,
        .recv_buf_drop = on_recv_buf_drop,
        .recv_place = on_recv_place,
        .recv_placed = on_recv_placed,
        .send_done = on_send_done,
        .unsent = hand_back ? on_unsent : NULL,
        .error = on_error,
    };
    ck_assert_int_eq(tb_channel_create(&pr->params[i], tb_lossy_link(pr->net, i), &cb,
                                       &pr->p[i].ch),
                     TB_CHAN_OK);
    tb_lossy_attach(pr->net, i, pr->p[i].ch);
}

static void pair_connect(pair_t *pr)
{
    tb_wire_addr_t a[2];
    for (int i = 0; i < 2; i++) {
        pair_create_side(pr, i);
        tb_channel_local_addr(pr->p[i].ch, &a[i]);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(tb_channel_connect(pr->p[i].ch, &a[1 - i], pr->now), TB_CHAN_OK);
    }
}

static void pair_step(pair_t *pr)
{
    pr->now += tb_lossy_idle(pr->net) ? 50000 : 2000;
    tb_lossy_step(pr->net, pr->now);
}

typedef int (*cond_fn)(pair_t *pr);

static int run_until(pair_t *pr, cond_fn cond, uint64_t limit_ns)
{
    uint64_t end = pr->now + limit_ns;
    while (pr->now < end) {
        if (cond(pr)) {
            return 1;
        }
        pair_step(pr);
    }
    return cond(pr);
}

static void run_for(pair_t *pr, uint64_t ns)
{
    uint64_t end = pr->now + ns;
    while (pr->now < end) {
        pair_step(pr);
    }
}

static int both_connected(pair_t *pr)
{
    return tb_channel_is_connected(pr->p[0].ch) && tb_channel_is_connected(pr->p[1].ch);
}

static int all_done(pair_t *pr)
{
    return pr->flow[0].nrecv == pr->flow[0].nsent && pr->flow[1].nrecv == pr->flow[1].nsent
           && tb_channel_pending_sends(pr->p[0].ch) == 0
           && tb_channel_pending_sends(pr->p[1].ch) == 0;
}

/* Queue message from side `from` (to 1 - from) of len bytes. */
/* Note the next message from side `from` (not counted as sent yet): where
 * in src its bytes come from. */
static uint32_t note_msg(pair_t *pr, int from, size_t len, uint8_t tag)
{
    flow_t *f = &pr->flow[1 - from];
    unsigned i = f->nsent;
    uint32_t off = (uint32_t) (((uint64_t) i * 40961u) % (SRC_SIZE - len + 1));

    ck_assert_uint_lt(i, MAX_MSGS);
    f->lens[i] = (uint32_t) len;
    f->offs[i] = off;
    f->tags[i] = tag;
    return off;
}

static int send_msg(pair_t *pr, int from, size_t len, uint8_t tag)
{
    flow_t *f = &pr->flow[1 - from];
    uint32_t off = note_msg(pr, from, len, tag);
    int rc = tb_channel_send(pr->p[from].ch, tag, src + off, len,
                             (void *) (uintptr_t) (f->nsent + 1));

    if (rc == TB_CHAN_OK) {
        f->nsent++;
    }
    return rc;
}

/* The same through the fast path: 1 if it went, 0 if begin declined. */
static int send_fast(pair_t *pr, int from, size_t len, uint8_t tag)
{
    void *slot = tb_channel_send_begin(pr->p[from].ch, tag, len);

    if (!slot) {
        return 0;
    }
    memcpy(slot, src + note_msg(pr, from, len, tag), len);
    pr->flow[1 - from].nsent++;
    ck_assert_int_eq(tb_channel_send_commit(pr->p[from].ch), TB_CHAN_OK);
    pr->p[from].send_ok++; /* complete at once: no send_done */
    return 1;
}

static void pair_free(pair_t *pr)
{
    for (int i = 0; i < 2; i++) {
        if (pr->p[i].ch) {
            tb_lossy_reset_side(pr->net, i);
            tb_channel_destroy(pr->p[i].ch);
            tb_lossy_attach(pr->net, i, NULL);
            ck_assert_uint_eq(tb_lossy_slots_out(pr->net, i), 0);
        }
    }
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->bad_puts, 0);
    tb_lossy_net_destroy(pr->net);
    free(pr);
}

static void std_setup(tb_lossy_cfg_t *cfg, tb_channel_params_t *p)
{
    tb_lossy_cfg_default(cfg);
    tb_channel_params_default(p);
    p->peer_timeout_ns = 1000 * MS;
    p->keepalive_ns = 50 * MS;
}

static pair_t *std_pair(double loss, double dup, double corrupt, double reorder, uint64_t seed)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    cfg.loss = loss;
    cfg.dup = dup;
    cfg.corrupt = corrupt;
    cfg.reorder = reorder;
    cfg.seed = seed;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 2000 * MS));
    return pr;
}

static void check_clean(pair_t *pr)
{
    ck_assert_uint_eq(pr->flow[0].bad, 0);
    ck_assert_uint_eq(pr->flow[1].bad, 0);
    ck_assert_uint_eq(pr->flow[0].nrecv, pr->flow[0].nsent);
    ck_assert_uint_eq(pr->flow[1].nrecv, pr->flow[1].nsent);
    ck_assert_uint_eq(pr->p[0].send_ok, pr->flow[1].nsent);
    ck_assert_uint_eq(pr->p[1].send_ok, pr->flow[0].nsent);
    ck_assert_uint_eq(pr->p[0].errors + pr->p[1].errors, 0);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->frame_mismatch, 0);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->bad_posts, 0);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->bad_puts, 0);
}

/* ------------------------------------------------------------------ */

START_TEST(test_crc32c)
{
    unsigned char buf[1000];
    ck_assert_uint_eq(tb_crc32c(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(tb_crc32c_sw(0, "123456789", 9), 0xe3069283u);
    memset(buf, 0, 32);
    ck_assert_uint_eq(tb_crc32c(0, buf, 32), 0x8a9136aau); /* RFC 3720 B.4 */
    for (unsigned i = 0; i < sizeof(buf); i++) {
        buf[i] = (unsigned char) (i * 37 + 11);
    }
    for (unsigned off = 0; off < 9; off++) {
        for (unsigned len = 0; len < 200; len += 7) {
            uint32_t a = tb_crc32c(0, buf + off, len);
            ck_assert_uint_eq(a, tb_crc32c_sw(0, buf + off, len));
            ck_assert_uint_eq(tb_crc32c(tb_crc32c(0, buf + off, len / 2), buf + off + len / 2,
                                        len - len / 2),
                              a);
        }
    }
}
END_TEST

START_TEST(test_wire_layout)
{
    ck_assert_uint_eq(sizeof(tb_wire_frame_hdr_t), 80);
    ck_assert_uint_eq(sizeof(tb_wire_addr_t), 64);
    ck_assert_uint_eq(tb_wire_hw_frames(0), 1);
    ck_assert_uint_eq(tb_wire_hw_frames(4096), 1);
    ck_assert_uint_eq(tb_wire_hw_frames(4097), 2);
    ck_assert(tb_seq_lt(0xfffffff0u, 5));
    ck_assert(!tb_seq_lt(5, 0xfffffff0u));
    ck_assert(tb_seq_le(7, 7));
}
END_TEST

static void expect_bad(const tb_channel_params_t *p, const char *word)
{
    char why[200] = "";
    ck_assert_int_eq(tb_channel_params_check(p, why, sizeof(why)), TB_CHAN_EINVAL);
    ck_assert_msg(strstr(why, word) != NULL, "'%s' does not name %s", why, word);
}

START_TEST(test_bad_params)
{
    tb_channel_params_t p, q;
    tb_lossy_cfg_t cfg;
    tb_lossy_net_t *net;
    tb_channel_t *ch = NULL;
    tb_channel_callbacks_t cb = {.recv = on_recv};

    tb_log_set_sink(log_quiet, NULL, TB_LOG_ERROR);
    tb_channel_params_default(&p);
    expect_bad(&p, "epoch");
    p.epoch = 42;
    ck_assert_int_eq(tb_channel_params_check(&p, NULL, 0), TB_CHAN_OK);
    q = p; q.nlanes = 3; expect_bad(&q, "nlanes");
    q = p; q.nlanes = 0; expect_bad(&q, "nlanes");
    q = p; q.frame_size[1] = 5000; expect_bad(&q, "frame_size[1]");
    q = p; q.frame_size[1] = 16773120 + 4096; expect_bad(&q, "16773120");
    q = p; q.frame_size[0] = 0; expect_bad(&q, "frame_size[0]");
    q = p; q.recv_depth[0] = 33; expect_bad(&q, "recv_depth_max");
    q = p; q.recv_depth[0] = 2; expect_bad(&q, "recv_depth[0]");
    q = p; q.recv_depth_max = 5000; expect_bad(&q, "4095");
    q = p; q.recv_depth_max = 64; q.recv_depth[1] = 64; q.frame_size[1] = 1 << 20;
    expect_bad(&q, "4095");
    q = p; q.send_window[0] = 0; expect_bad(&q, "send_window[0]");
    q = p; q.rto_max_ns = 1; expect_bad(&q, "rto");
    q = p; q.peer_timeout_ns = q.keepalive_ns; expect_bad(&q, "peer_timeout");
    q = p; q.max_frames_per_progress = 0; expect_bad(&q, "max_frames_per_progress");
    q = p; q.max_queued_msgs = 0; expect_bad(&q, "max_queued_msgs");
    q = p; q.max_queued_bytes = 0; expect_bad(&q, "max_queued_bytes");
    /* Only lane 0 is checked with one lane. */
    q = p; q.nlanes = 1; q.frame_size[1] = 3;
    ck_assert_int_eq(tb_channel_params_check(&q, NULL, 0), TB_CHAN_OK);

    tb_lossy_cfg_default(&cfg);
    net = tb_lossy_net_create(&cfg);
    q = p; q.frame_size[0] = 100;
    ck_assert_int_eq(tb_channel_create(&q, tb_lossy_link(net, 0), &cb, &ch), TB_CHAN_EINVAL);
    ck_assert_ptr_null(ch);
    cb.recv = NULL;
    ck_assert_int_eq(tb_channel_create(&p, tb_lossy_link(net, 0), &cb, &ch), TB_CHAN_EINVAL);
    tb_lossy_net_destroy(net);
}
END_TEST

START_TEST(test_bad_peer_addr)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    tb_wire_addr_t a;

    std_setup(&cfg, &p);
    pr = pair_new(&cfg, &p);
    pair_create_side(pr, 0);
    pair_create_side(pr, 1);
    tb_channel_local_addr(pr->p[1].ch, &a);
    a.qpn[0] ^= 1; /* corrupt: crc no longer matches */
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, 0), TB_CHAN_EPROTO);
    tb_channel_local_addr(pr->p[1].ch, &a);
    a.version = 9;
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, 0), TB_CHAN_EPROTO);
    tb_channel_local_addr(pr->p[1].ch, &a);
    a.frame_size[1] = tb_wire_le32(8192);
    a.crc = tb_wire_le32(tb_crc32c(0, &a, TB_WIRE_ADDR_SIZE - 4));
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, 0), TB_CHAN_EPROTO);
    tb_channel_local_addr(pr->p[1].ch, &a);
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, 0), TB_CHAN_OK);
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, 0), TB_CHAN_ESTATE);
    pair_free(pr);
}
END_TEST

static const size_t sizes[] = {0,     1,     2,     79,     80,      4015,    4016,
                               4017,  8032,  8033,  16383,  16384,   65455,   65456,
                               65457, 99999, 1 << 20, (3 << 20) + 5, 6 << 20};

START_TEST(test_sizes)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 1);
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        ck_assert_int_eq(send_msg(pr, 0, sizes[i], (uint8_t) i), TB_CHAN_OK);
        ck_assert_int_eq(send_msg(pr, 1, sizes[i], (uint8_t) (200 + i)), TB_CHAN_OK);
    }
    ck_assert(run_until(pr, all_done, 5000 * MS));
    check_clean(pr);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->no_recv_drops, 0);
    ck_assert_uint_eq(tb_channel_counters(pr->p[0].ch)->retransmits, 0);
    ck_assert_uint_eq(tb_channel_counters(pr->p[1].ch)->msgs_received,
                      sizeof(sizes) / sizeof(sizes[0]));
    pair_free(pr);
}
END_TEST

START_TEST(test_sizes_one_lane_recv_buf)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    p.nlanes = cfg.nlanes = 1;
    pr = pair_new(&cfg, &p);
    pr->p[1].use_recv_buf = 1;
    pair_connect(pr);
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        ck_assert_int_eq(send_msg(pr, 0, sizes[i], (uint8_t) i), TB_CHAN_OK);
    }
    ck_assert(run_until(pr, all_done, 5000 * MS));
    check_clean(pr);
    ck_assert_uint_eq(pr->p[1].bufs_given, 12); /* messages longer than one frame */
    ck_assert_uint_eq(pr->p[1].bufs_out, 0);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->no_recv_drops, 0);
    pair_free(pr);
}
END_TEST

START_TEST(test_iovec)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 2);
    flow_t *f = &pr->flow[1];
    struct iovec iov[4] = {
        {src + 100, 10}, {src + 110, 0}, {src + 110, 70000}, {src + 70110, 3}};
    f->lens[0] = 70013;
    f->offs[0] = 100;
    f->tags[0] = 9;
    f->nsent = 1;
    ck_assert_int_eq(tb_channel_sendv(pr->p[0].ch, 9, iov, 4, NULL), TB_CHAN_OK);
    ck_assert(run_until(pr, all_done, 100 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

static void mixed_traffic(pair_t *pr, unsigned n, uint64_t seed, int both)
{
    uint64_t x = seed;
    for (unsigned i = 0; i < n; i++) {
        size_t len;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        switch ((x >> 60) % 4) {
        case 0: len = (x >> 20) % 64; break;
        case 1: len = (x >> 20) % 4100; break;
        case 2: len = (x >> 20) % 70000; break;
        default: len = (x >> 20) % 300000; break;
        }
        ck_assert_int_eq(send_msg(pr, both ? (int) (i & 1) : 0, len, (uint8_t) x), TB_CHAN_OK);
    }
}

START_TEST(test_loss)
{
    pair_t *pr = std_pair(0.05, 0, 0, 0, 3);
    const tb_channel_counters_t *c = tb_channel_counters(pr->p[0].ch);
    mixed_traffic(pr, 300, 11, 1);
    ck_assert(run_until(pr, all_done, 20000 * MS));
    check_clean(pr);
    ck_assert_uint_gt(tb_lossy_stats(pr->net)->lost, 0);
    ck_assert_uint_gt(c->retransmits, 0);
    ck_assert_uint_gt(c->naks_received + c->timeouts, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[1].ch)->out_of_order, 0);
    pair_free(pr);
}
END_TEST

START_TEST(test_reorder)
{
    pair_t *pr = std_pair(0, 0, 0, 0.2, 4);
    mixed_traffic(pr, 300, 12, 1);
    ck_assert(run_until(pr, all_done, 20000 * MS));
    check_clean(pr);
    ck_assert_uint_gt(tb_lossy_stats(pr->net)->reordered, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[1].ch)->out_of_order
                          + tb_channel_counters(pr->p[0].ch)->out_of_order,
                      0);
    pair_free(pr);
}
END_TEST

START_TEST(test_duplication)
{
    pair_t *pr = std_pair(0, 0.2, 0, 0, 5);
    mixed_traffic(pr, 300, 13, 1);
    ck_assert(run_until(pr, all_done, 20000 * MS));
    check_clean(pr);
    ck_assert_uint_gt(tb_lossy_stats(pr->net)->duplicated, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[1].ch)->duplicates, 0);
    pair_free(pr);
}
END_TEST

START_TEST(test_corruption)
{
    pair_t *pr = std_pair(0, 0, 0.05, 0, 6);
    mixed_traffic(pr, 300, 14, 1);
    ck_assert(run_until(pr, all_done, 20000 * MS));
    check_clean(pr);
    ck_assert_uint_gt(tb_lossy_stats(pr->net)->corrupted, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->bad_checksum
                          + tb_channel_counters(pr->p[1].ch)->bad_checksum,
                      0);
    pair_free(pr);
}
END_TEST

START_TEST(test_everything_at_once)
{
    pair_t *pr = std_pair(0.03, 0.03, 0.03, 0.03, 7);
    mixed_traffic(pr, 500, 15, 1);
    ck_assert(run_until(pr, all_done, 30000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* The receiver polls one completion per step: data must wait for credit and
 * no frame may arrive without a receive posted for it, except the probes a
 * sender makes after a retransmit timeout without credit (a receiver that
 * stops polling for 100 ms looks like that). */
START_TEST(test_slow_receiver)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    cfg.poll_budget = 1;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 100 * MS));
    tb_lossy_set_dead(pr->net, 1, 1); /* pause the receiver for a while */
    mixed_traffic(pr, 400, 16, 0);
    run_for(pr, 100 * MS);
    ck_assert_uint_eq(pr->flow[1].nrecv, 0);
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, all_done, 30000 * MS));
    check_clean(pr);
    ck_assert_uint_le(tb_lossy_stats(pr->net)->no_recv_drops,
                      tb_channel_counters(pr->p[0].ch)->credit_probes
                          + tb_channel_counters(pr->p[1].ch)->credit_probes);
    ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->credit_probes, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->credit_stalls, 0);
    pair_free(pr);
}
END_TEST

/* Both sides saturate each other (credits exhausted both ways). */
START_TEST(test_bidirectional_saturation)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    p.nlanes = cfg.nlanes = 1;
    p.recv_depth[0] = cfg.recv_slots[0] = 8;
    cfg.poll_budget = 3;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    for (unsigned i = 0; i < 2000; i++) {
        ck_assert_int_eq(send_msg(pr, (int) (i & 1), 100 + i % 3000, (uint8_t) i), TB_CHAN_OK);
    }
    ck_assert(run_until(pr, all_done, 30000 * MS));
    check_clean(pr);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->no_recv_drops, 0);
    pair_free(pr);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Adaptive retransmit timeout                                         */

static pair_t *delay_pair(uint64_t delay_ns, double loss, uint64_t seed)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    cfg.delay_ns = delay_ns;
    cfg.loss = loss;
    cfg.seed = seed;
    p.peer_timeout_ns = 5000 * MS;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 2000 * MS));
    return pr;
}

/* Ping-pong of n messages of len bytes from side 0, one at a time. */
static void ping_pong(pair_t *pr, unsigned n, size_t len)
{
    for (unsigned i = 0; i < n; i++) {
        unsigned want = pr->flow[0].nrecv + 1;
        ck_assert_int_eq(send_msg(pr, 0, len, 1), TB_CHAN_OK);
        ck_assert(run_until(pr, all_done, 5000 * MS));
        ck_assert_int_eq(send_msg(pr, 1, len, 2), TB_CHAN_OK);
        ck_assert(run_until(pr, all_done, 5000 * MS));
        ck_assert_uint_eq(pr->flow[0].nrecv, want);
    }
}

static uint64_t retransmits(pair_t *pr)
{
    return tb_channel_counters(pr->p[0].ch)->retransmits
           + tb_channel_counters(pr->p[1].ch)->retransmits;
}

/* A round trip of 40 ms: 200 times the timeout's floor and 4 times the
 * initial timeout.  The HELLOs are retried (their answer takes longer than
 * the initial interval), the estimate is learnt from the traffic, and not a
 * single frame is sent twice: a fixed timeout at the floor would resend
 * every frame about 200 times. */
START_TEST(test_rtt_long_delay)
{
    pair_t *pr = delay_pair(20 * MS, 0, 30);
    const tb_channel_counters_t *c0 = tb_channel_counters(pr->p[0].ch);

    ck_assert_uint_gt(c0->ctrl_frames_sent, 1); /* HELLO retried */
    ping_pong(pr, 5, 8);
    mixed_traffic(pr, 200, 31, 1);
    ck_assert(run_until(pr, all_done, 60000 * MS));
    ping_pong(pr, 5, 100000);
    check_clean(pr);
    ck_assert_uint_eq(retransmits(pr), 0);
    ck_assert_uint_eq(c0->timeouts + tb_channel_counters(pr->p[1].ch)->timeouts, 0);
    ck_assert_uint_eq(tb_channel_counters(pr->p[1].ch)->duplicates, 0);
    ck_assert_uint_ge(c0->rtt_samples, 10);
    /* Lane 0 round trips: 40 ms plus at most the ack delay and a few steps. */
    ck_assert_uint_ge(c0->srtt_ns[0], 40 * MS);
    ck_assert_uint_le(c0->srtt_ns[0], 41 * MS);
    ck_assert_uint_ge(c0->srtt_ns[1], 39900000); /* 40 ms less the shorter bulk frames */
    ck_assert_uint_ge(c0->rto_ns[0], c0->srtt_ns[0]);
    ck_assert_uint_le(c0->rto_ns[0], pr->params[0].rto_max_ns);
    pair_free(pr);
}
END_TEST

/* One HELLO answered: the handshake alone gives lane 0 its round trip, so
 * even the first message cannot time out early; and on a fast wire the
 * timeout sits at its floor. */
START_TEST(test_rtt_hello_sample)
{
    pair_t *pr;
    const tb_channel_counters_t *c;
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    tb_wire_addr_t a[2];

    /* Side 1 connects after side 0's HELLO reached it before it had posted
     * receives (lost), so side 1's own HELLO is answered by an ACK. */
    std_setup(&cfg, &p);
    cfg.delay_ns = 3 * MS; /* round trip 6 ms, under the 10 ms initial timeout */
    pr = pair_new(&cfg, &p);
    pair_create_side(pr, 0);
    pair_create_side(pr, 1);
    tb_channel_local_addr(pr->p[0].ch, &a[0]);
    tb_channel_local_addr(pr->p[1].ch, &a[1]);
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a[1], pr->now), TB_CHAN_OK);
    run_for(pr, 4 * MS);
    ck_assert_uint_eq(tb_lossy_stats(pr->net)->no_recv_drops, 1);
    ck_assert_int_eq(tb_channel_connect(pr->p[1].ch, &a[0], pr->now), TB_CHAN_OK);
    ck_assert(run_until(pr, both_connected, 100 * MS));
    c = tb_channel_counters(pr->p[1].ch);
    ck_assert_uint_eq(c->rtt_samples, 1);
    ck_assert_uint_ge(c->srtt_ns[0], 6 * MS - 10000);
    ck_assert_uint_le(c->srtt_ns[0], 6 * MS + 200000);
    ck_assert_uint_eq(c->rto_ns[0], 3 * c->srtt_ns[0]);
    pair_free(pr);

    pr = std_pair(0, 0, 0, 0, 32);
    mixed_traffic(pr, 50, 33, 1);
    ck_assert(run_until(pr, all_done, 1000 * MS));
    c = tb_channel_counters(pr->p[0].ch);
    ck_assert_uint_gt(c->srtt_ns[0], 0);
    ck_assert_uint_lt(c->srtt_ns[0], 100000);
    ck_assert_uint_eq(c->rto_ns[0], pr->params[0].rto_min_ns);
    pair_free(pr);
}
END_TEST

/* The wire slows down 300-fold mid-connection: the first frames after the
 * change time out (the estimate was 30 us), the timeout backs off until a
 * frame is acked unambiguously, and from then on nothing is resent. */
START_TEST(test_rtt_adapts)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 34);
    tb_lossy_cfg_t cfg = pr->cfg;
    uint64_t r1, r2;

    ping_pong(pr, 20, 8);
    ck_assert_uint_eq(retransmits(pr), 0);
    cfg.delay_ns = 5 * MS;
    tb_lossy_set_cfg(pr->net, &cfg);
    ping_pong(pr, 20, 8);
    r1 = retransmits(pr);
    ck_assert_uint_gt(r1, 0);  /* the first few after the change */
    ck_assert_uint_le(r1, 16); /* backoff: ~6 expiries per side */
    mixed_traffic(pr, 100, 35, 1);
    ck_assert(run_until(pr, all_done, 60000 * MS));
    ping_pong(pr, 20, 8);
    r2 = retransmits(pr);
    ck_assert_uint_eq(r2, r1);
    check_clean(pr);
    ck_assert_uint_ge(tb_channel_counters(pr->p[0].ch)->srtt_ns[0], 9 * MS);
    pair_free(pr);
}
END_TEST

/* Loss on a slow wire: recovery still works (NAKs, selective resends,
 * timeouts), repairs do not inflate the round-trip estimate (an ack that
 * covers a resent frame gives no sample), and timeouts stay rarer than
 * losses: NAKs repair most gaps within a round trip. */
START_TEST(test_rtt_loss_long_delay)
{
    pair_t *pr = delay_pair(2 * MS, 0.02, 36);
    uint64_t lost, timeouts = 0;

    mixed_traffic(pr, 300, 37, 1);
    ck_assert(run_until(pr, all_done, 120000 * MS));
    check_clean(pr);
    lost = tb_lossy_stats(pr->net)->lost;
    ck_assert_uint_gt(lost, 0);
    ck_assert_uint_gt(retransmits(pr), 0);
    for (int i = 0; i < 2; i++) {
        const tb_channel_counters_t *c = tb_channel_counters(pr->p[i].ch);
        timeouts += c->timeouts;
        ck_assert_uint_gt(c->naks_received, 0);
        ck_assert_uint_ge(c->srtt_ns[0], 4 * MS - 10000);
        ck_assert_uint_le(c->srtt_ns[0], 4 * MS + 200000);
    }
    ck_assert_uint_le(timeouts, lost / 2);
    pair_free(pr);
}
END_TEST

/* Selective repeat: frames after a gap are held and acknowledged selectively,
 * so a loss costs about one resend, not the window behind it (go-back-N
 * resends up to 31 frames per loss here). */
START_TEST(test_selective_repeat)
{
    pair_t *pr = std_pair(0.05, 0, 0, 0, 38);
    uint64_t lost;

    mixed_traffic(pr, 400, 39, 0);
    ck_assert(run_until(pr, all_done, 20000 * MS));
    check_clean(pr);
    lost = tb_lossy_stats(pr->net)->lost;
    ck_assert_uint_gt(lost, 20);
    ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->naks_received, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[1].ch)->out_of_order, 0);
    ck_assert_uint_le(retransmits(pr), 2 * lost);
    pair_free(pr);
}
END_TEST

/* Heavy loss on small bulk frames, both ways, with many single-frame
 * messages on both lanes: frames held after gaps and messages waiting for
 * the other lane must never take every receive of a lane, or the frames
 * they wait for could never be resent (the lanes would wait for each other
 * until the peer timeout). */
START_TEST(test_held_slots_bounded)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    uint64_t x = 40;

    std_setup(&cfg, &p);
    cfg.loss = 0.3;
    cfg.seed = 41;
    cfg.frame_size[1] = p.frame_size[1] = 8192;
    p.peer_timeout_ns = 10000 * MS; /* ample for many backed-off resends */
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 2000 * MS));
    for (unsigned i = 0; i < 3000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        /* single lane-0 frames, single bulk frames (4017..8112 B), and a
         * few multi-frame messages */
        size_t len = (x >> 60) < 7 ? (x >> 20) % 4000 : (x >> 60) < 14 ? 4017 + (x >> 20) % 4096
                                                                         : (x >> 20) % 40000;
        ck_assert_int_eq(send_msg(pr, (int) (i & 1), len, (uint8_t) x), TB_CHAN_OK);
        while (tb_channel_pending_sends(pr->p[0].ch) + tb_channel_pending_sends(pr->p[1].ch)
               > 200) {
            pair_step(pr);
        }
    }
    ck_assert(run_until(pr, all_done, 60000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* Everything is lost for a while: retransmit timeouts back off
 * exponentially (1, 2, 4 ... ms) instead of firing every ms.  The round trip
 * is ~30 us, so the timeout starts at its floor, set to 1 ms here. */
START_TEST(test_backoff)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    const tb_channel_counters_t *c;
    uint64_t t0, rtx0, pr0;

    std_setup(&cfg, &p);
    cfg.seed = 8;
    p.rto_min_ns = 1 * MS;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 100 * MS));
    ping_pong(pr, 3, 8);
    c = tb_channel_counters(pr->p[0].ch);
    ck_assert_uint_eq(c->rto_ns[0], 1 * MS);
    cfg.loss = 1.0;
    tb_lossy_set_cfg(pr->net, &cfg);
    ck_assert_int_eq(send_msg(pr, 0, 1000, 1), TB_CHAN_OK);
    t0 = c->timeouts;
    rtx0 = c->retransmits;
    pr0 = c->probes;
    run_for(pr, 200 * MS);
    /* An expiry sends a probe, the next one (the probe unanswered) resends
     * and doubles the timeout: expiries at about 1, 2 (resend), 4, 6, 10, 14,
     * 22, 30, 46, 62, 94, 126, 190 ms. */
    ck_assert_uint_ge(c->timeouts - t0, 12);
    ck_assert_uint_le(c->timeouts - t0, 14);
    ck_assert_uint_eq(c->retransmits - rtx0 + c->probes - pr0, c->timeouts - t0);
    ck_assert_uint_ge(c->retransmits - rtx0, 6);
    run_for(pr, 400 * MS); /* the bound: 128 ms apart: 254, 382, 510 ms */
    ck_assert_uint_ge(c->timeouts - t0, 15);
    ck_assert_uint_le(c->timeouts - t0, 17);
    cfg.loss = 0;
    tb_lossy_set_cfg(pr->net, &cfg);
    ck_assert(run_until(pr, all_done, 300 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST


static int p0_failed(pair_t *pr)
{
    return pr->p[0].errors > 0;
}

static int p1_failed(pair_t *pr)
{
    return pr->p[1].errors > 0;
}

/* A peer that keeps answering (its keepalives and acks arrive on lane 0)
 * but acknowledges none of the data sent to it (lane 1 a black hole) fails
 * after stall_timeout_ns, not after the shorter silence deadline; with none
 * set, after peer_timeout_ns as before. */
START_TEST(test_stall_timeout)
{
    for (int round = 0; round < 2; round++) {
        tb_lossy_cfg_t cfg;
        tb_channel_params_t p;
        pair_t *pr;
        uint64_t t0, want;

        std_setup(&cfg, &p);
        p.peer_timeout_ns = 500 * MS;
        p.stall_timeout_ns = round ? 0 : 2000 * MS;
        want = round ? p.peer_timeout_ns : p.stall_timeout_ns;
        pr = pair_new(&cfg, &p);
        pair_connect(pr);
        ck_assert(run_until(pr, both_connected, 100 * MS));
        cfg.lane_loss[1] = 1.0;
        tb_lossy_set_cfg(pr->net, &cfg);
        t0 = pr->now;
        ck_assert_int_eq(send_msg(pr, 0, 150000, 1), TB_CHAN_OK); /* bulk frames */
        ck_assert(run_until(pr, p0_failed, 5000 * MS));
        ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_EPEERDEAD);
        ck_assert_msg(strstr(pr->p[0].why, "acknowledged nothing on lane 1") != NULL, "%s",
                      pr->p[0].why);
        /* Counted from the last acknowledged progress: the send itself. */
        ck_assert_uint_ge(pr->p[0].error_ns - t0, want - 5 * MS);
        ck_assert_uint_le(pr->p[0].error_ns - t0, want + 50 * MS);
        ck_assert_uint_eq(pr->p[1].errors, 0);
        pair_free(pr);
    }
}
END_TEST

START_TEST(test_peer_death_pending)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 9);
    uint64_t t_dead;
    unsigned queued = 0;

    pr->p[1].use_recv_buf = 1;
    mixed_traffic(pr, 50, 17, 0);
    run_for(pr, 200 * 1000);
    tb_lossy_set_dead(pr->net, 1, 1);
    t_dead = pr->now;
    for (unsigned i = 0; i < 20; i++) {
        queued += send_msg(pr, 0, 150000, 1) == TB_CHAN_OK; /* 3 bulk frames */
    }
    ck_assert_uint_eq(queued, 20);
    ck_assert(run_until(pr, p0_failed, 5000 * MS));
    ck_assert_uint_eq(pr->p[0].errors, 1);
    ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_EPEERDEAD);
    ck_assert_uint_ge(pr->p[0].error_ns - t_dead, pr->params[0].peer_timeout_ns - 5 * MS);
    ck_assert_uint_le(pr->p[0].error_ns - t_dead, pr->params[0].peer_timeout_ns + 5 * MS);
    ck_assert_uint_eq(pr->p[0].send_ok + pr->p[0].send_err, 70);
    ck_assert_uint_gt(pr->p[0].send_err, 0);
    ck_assert_int_eq(pr->p[0].last_send_status, TB_CHAN_EPEERDEAD);
    ck_assert_uint_eq(tb_channel_pending_sends(pr->p[0].ch), 0);
    ck_assert_int_eq(send_msg(pr, 0, 10, 1), TB_CHAN_EPEERDEAD);
    ck_assert_int_eq(tb_channel_status(pr->p[0].ch), TB_CHAN_EPEERDEAD);
    /* The dead side wakes up: it sees the silence too and drops partial
     * messages it was assembling into caller buffers. */
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, p1_failed, 2000 * MS));
    ck_assert_int_eq(pr->p[1].error_status, TB_CHAN_EPEERDEAD);
    ck_assert_uint_gt(pr->p[1].bufs_dropped, 0);
    ck_assert_uint_eq(pr->p[1].bufs_out, 0);
    ck_assert_uint_eq(pr->flow[1].bad, 0);
    pair_free(pr);
}
END_TEST

/* A channel whose peer dies mid-traffic hands back, whole and in order,
 * every message from the first the peer did not deliver on: what the peer
 * delivered and what comes back cover everything sent, with no gap, so an
 * owner can send the rest again elsewhere and drop duplicates by a number of
 * its own.  Both lanes, messages of one to five frames, loss, and sends
 * still queued when it fails. */
START_TEST(test_hand_back)
{
    hand_back = 1;
    for (uint64_t seed = 1; seed <= 24; seed++) {
        tb_lossy_cfg_t cfg;
        tb_channel_params_t p;
        pair_t *pr;
        flow_t *f;
        unsigned delivered, first;

        /* The bulk lane loses more, so its messages lag behind later small
         * ones that are acked already: those must come back too. */
        std_setup(&cfg, &p);
        cfg.loss = 0.02;
        cfg.lane_loss[1] = 0.25;
        cfg.seed = 40 + seed;
        pr = pair_new(&cfg, &p);
        pair_connect(pr);
        ck_assert(run_until(pr, both_connected, 2000 * MS));
        f = &pr->flow[1];

        /* Kept whole, acked frames wait for older messages: nothing stalls. */
        mixed_traffic(pr, 200, 90 + seed, 1);
        ck_assert(run_until(pr, all_done, 20000 * MS));
        check_clean(pr);
        mixed_traffic(pr, 120, 70 + seed, 0);
        run_for(pr, (1 + seed) * 300 * 1000);
        tb_lossy_set_dead(pr->net, 1, 1);
        delivered = f->nrecv;
        for (unsigned i = 0; i < 10; i++) {
            ck_assert_int_eq(send_msg(pr, 0, 5000 + 20000 * i, 3), TB_CHAN_OK);
        }
        ck_assert(run_until(pr, p0_failed, 5000 * MS));
        ck_assert_uint_eq(f->bad, 0);
        ck_assert_uint_gt(pr->p[0].nunsent, 0);
        ck_assert_uint_le(pr->p[0].nunsent, f->nsent);
        first = f->nsent - pr->p[0].nunsent;
        ck_assert_msg(first <= delivered, "seed %llu: message %u on were handed back, but the "
                      "peer delivered only %u", (unsigned long long) seed, first, delivered);
        for (unsigned j = 0; j < pr->p[0].nunsent; j++) {
            unsigned i = first + j;
            ck_assert_uint_eq(pr->p[0].unsent_len[j], f->lens[i]);
            ck_assert_uint_eq(pr->p[0].unsent_tag[j], f->tags[i]);
            ck_assert_uint_eq(pr->p[0].unsent_crc[j], tb_crc32c(0, src + f->offs[i], f->lens[i]));
        }
        pair_free(pr);
    }
    hand_back = 0;
}
END_TEST

/* A message of more frames than its lane's window cannot be kept whole: its
 * frames go as they are acked, and a channel that fails mid-way hands it back
 * as lost (no bytes), never cut short; the whole messages around it come back
 * intact. */
START_TEST(test_hand_back_large)
{
    unsigned lost = 0;

    hand_back = 1;
    for (unsigned k = 1; k <= 48; k++) {
        tb_lossy_cfg_t cfg;
        tb_channel_params_t p;
        pair_t *pr;
        flow_t *f;
        unsigned first;

        /* Half the runs lose small frames, so a whole bulk message waits
         * for an older small one while the large one behind it goes on. */
        std_setup(&cfg, &p);
        p.send_window[1] = k % 2 ? 2 : 4;
        cfg.delay_ns = k % 2 ? 100 * 1000 : 0;
        cfg.lane_loss[0] = k % 2 ? 0 : 0.5;
        cfg.poll_budget = k % 2 ? cfg.poll_budget : 1;
        cfg.seed = k;
        pr = pair_new(&cfg, &p);
        pair_connect(pr);
        ck_assert(run_until(pr, both_connected, 2000 * MS));
        f = &pr->flow[1];
        ck_assert_int_eq(send_msg(pr, 0, 100, 1), TB_CHAN_OK);
        ck_assert_int_eq(send_msg(pr, 0, 70000, 4), TB_CHAN_OK);  /* 2 bulk frames */
        ck_assert_int_eq(send_msg(pr, 0, 300000, 2), TB_CHAN_OK); /* 5 */
        ck_assert_int_eq(send_msg(pr, 0, 100, 3), TB_CHAN_OK);
        run_for(pr, (k + 1) / 2 * 30 * 1000);
        tb_lossy_set_dead(pr->net, 1, 1);
        ck_assert(run_until(pr, p0_failed, 5000 * MS));
        first = f->nsent - pr->p[0].nunsent;
        ck_assert_uint_le(first, f->nrecv);
        for (unsigned j = 0; j < pr->p[0].nunsent; j++) {
            unsigned i = first + j;
            ck_assert_uint_eq(pr->p[0].unsent_len[j], f->lens[i]);
            if (~0u == pr->p[0].unsent_crc[j]) {
                ck_assert_uint_eq(f->lens[i], 300000);
                lost++;
            } else {
                ck_assert_uint_eq(pr->p[0].unsent_crc[j],
                                  tb_crc32c(0, src + f->offs[i], f->lens[i]));
            }
        }
        pair_free(pr);
    }
    ck_assert_uint_gt(lost, 0);
    hand_back = 0;
}
END_TEST

/* Idle: keepalives keep the channel up; then the peer dies. */
START_TEST(test_peer_death_idle)
{
    pair_t *pr = std_pair(0.05, 0, 0, 0, 10);
    uint64_t t_dead;

    run_for(pr, 3000 * MS);
    ck_assert_uint_eq(pr->p[0].errors + pr->p[1].errors, 0);
    ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->keepalives_sent, 40);
    tb_lossy_set_dead(pr->net, 1, 1);
    t_dead = pr->now;
    ck_assert(run_until(pr, p0_failed, 5000 * MS));
    ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_EPEERDEAD);
    ck_assert_uint_le(pr->p[0].error_ns - t_dead, pr->params[0].peer_timeout_ns + 5 * MS);
    ck_assert_uint_ge(pr->p[0].error_ns - t_dead,
                      pr->params[0].peer_timeout_ns - pr->params[0].keepalive_ns - 5 * MS);
    pair_free(pr);
}
END_TEST

START_TEST(test_connect_timeout)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    tb_wire_addr_t a;

    std_setup(&cfg, &p);
    pr = pair_new(&cfg, &p);
    pair_create_side(pr, 0);
    pair_create_side(pr, 1);
    tb_channel_local_addr(pr->p[1].ch, &a);
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, 0), TB_CHAN_OK);
    ck_assert_int_eq(send_msg(pr, 0, 10, 1), TB_CHAN_OK); /* queued before connect */
    ck_assert(run_until(pr, p0_failed, 3000 * MS));
    ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_EPEERDEAD);
    ck_assert_uint_ge(pr->p[0].error_ns, p.peer_timeout_ns);
    ck_assert_uint_le(pr->p[0].error_ns, p.peer_timeout_ns + 1 * MS);
    ck_assert_uint_eq(pr->p[0].send_err, 1);
    pair_free(pr);
}
END_TEST

START_TEST(test_late_peer)
{
    /* One side connects much later: HELLOs are retried until it answers,
     * and a message queued early still arrives. */
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    tb_wire_addr_t a[2];

    std_setup(&cfg, &p);
    pr = pair_new(&cfg, &p);
    pair_create_side(pr, 0);
    pair_create_side(pr, 1);
    tb_channel_local_addr(pr->p[0].ch, &a[0]);
    tb_channel_local_addr(pr->p[1].ch, &a[1]);
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a[1], 0), TB_CHAN_OK);
    ck_assert_int_eq(send_msg(pr, 0, 5000, 3), TB_CHAN_OK);
    run_for(pr, 300 * MS);
    ck_assert_int_eq(tb_channel_connect(pr->p[1].ch, &a[0], pr->now), TB_CHAN_OK);
    ck_assert(run_until(pr, all_done, 500 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

START_TEST(test_restarted_peer)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 11);
    tb_wire_addr_t a;

    mixed_traffic(pr, 20, 18, 1);
    ck_assert(run_until(pr, all_done, 1000 * MS));
    /* Side 1 restarts: new incarnation, same link, connects to side 0 again. */
    tb_lossy_reset_side(pr->net, 1);
    tb_channel_destroy(pr->p[1].ch);
    pr->p[1].ch = NULL;
    tb_lossy_attach(pr->net, 1, NULL);
    ck_assert_uint_eq(tb_lossy_slots_out(pr->net, 1), 0);
    pr->params[1].epoch = 0x9999;
    pair_create_side(pr, 1);
    tb_channel_local_addr(pr->p[0].ch, &a);
    ck_assert_int_eq(tb_channel_connect(pr->p[1].ch, &a, pr->now), TB_CHAN_OK);
    ck_assert(run_until(pr, p0_failed, 100 * MS));
    ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_ERESTARTED);
    ck_assert_uint_lt(pr->p[0].error_ns - pr->now, 10 * MS);
    pair_free(pr);
}
END_TEST

/* A connect stamped later than the progress calls that follow it (as when
 * it is made from a connection manager's callback inside a progress loop
 * that read the clock first) must not look like a peer silent for ages. */
START_TEST(test_clock_skew)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    tb_wire_addr_t a[2];
    pair_t *pr;

    std_setup(&cfg, &p);
    pr = pair_new(&cfg, &p);
    for (int i = 0; i < 2; i++) {
        pair_create_side(pr, i);
        tb_channel_local_addr(pr->p[i].ch, &a[i]);
    }
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a[1], pr->now + 5 * MS), TB_CHAN_OK);
    ck_assert_int_eq(tb_channel_connect(pr->p[1].ch, &a[0], pr->now), TB_CHAN_OK);
    ck_assert(run_until(pr, both_connected, 2000 * MS));
    ck_assert_int_eq(pr->p[0].errors + pr->p[1].errors, 0);
    ck_assert_int_eq(send_msg(pr, 0, 10000, 42), TB_CHAN_OK);
    ck_assert_int_eq(send_msg(pr, 1, 100, 43), TB_CHAN_OK);
    ck_assert(run_until(pr, all_done, 2000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

START_TEST(test_wraparound)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    cfg.loss = 0.02;
    cfg.seed = 12;
    p.initial_seq[0] = 0xffffff00u;
    p.initial_seq[1] = 0xfffffff0u;
    pr = pair_new(&cfg, &p);
    pr->params[1].initial_seq[0] = 0xfffffff8u;
    pr->params[1].initial_seq[1] = 0x7ffffff0u;
    pair_connect(pr);
    mixed_traffic(pr, 1500, 19, 1);
    ck_assert(run_until(pr, all_done, 60000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

static void make_frame(unsigned char *buf, pair_t *pr, uint8_t type, uint32_t seq,
                       uint32_t msg_len, uint32_t off, uint32_t plen)
{
    tb_wire_frame_hdr_t *h = (tb_wire_frame_hdr_t *) buf;
    memset(buf, 0, TB_WIRE_HDR_SIZE + plen);
    h->magic = tb_wire_le32(TB_WIRE_FRAME_MAGIC);
    h->version = TB_WIRE_VERSION;
    h->type = type;
    h->lane = 0;
    h->src_epoch = tb_wire_le64(pr->params[1].epoch);
    h->dst_epoch = tb_wire_le64(pr->params[0].epoch);
    h->tsn = tb_wire_le32(pr->params[1].initial_seq[0]); /* old: harmless */
    h->seq = tb_wire_le32(seq);
    h->ack[0] = tb_wire_le32(pr->params[0].initial_seq[0] - 1);
    h->ack[1] = tb_wire_le32(pr->params[0].initial_seq[1] - 1);
    h->msg_len = tb_wire_le32(msg_len);
    h->frag_offset = tb_wire_le32(off);
    h->payload_len = tb_wire_le32(plen);
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
}

/* Frames dropped before they are trusted (an in-sequence DATA frame that
 * breaks the protocol fails the channel instead: test_violations). */
START_TEST(test_malformed)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 13);
    const tb_channel_counters_t *c = tb_channel_counters(pr->p[0].ch);
    unsigned char buf[4096];
    uint32_t next_seq = pr->params[1].initial_seq[0]; /* nothing sent yet */
    tb_wire_frame_hdr_t *h = (tb_wire_frame_hdr_t *) buf;
    uint64_t m0 = c->malformed;

    make_frame(buf, pr, TB_FRAME_DATA, next_seq, 10, 0, 10);
    tb_lossy_inject(pr->net, 0, 0, buf, 40); /* shorter than a header */
    h->magic ^= 1;
    tb_lossy_inject(pr->net, 0, 0, buf, 90);
    make_frame(buf, pr, TB_FRAME_DATA, next_seq, 10, 0, 10);
    h->version = TB_WIRE_VERSION + 1;
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
    tb_lossy_inject(pr->net, 0, 0, buf, 90);
    make_frame(buf, pr, 77, next_seq, 0, 0, 0); /* unknown type */
    tb_lossy_inject(pr->net, 0, 0, buf, 80);
    make_frame(buf, pr, TB_FRAME_DATA, next_seq, 4000, 0, 4000); /* payload beyond frame */
    tb_lossy_inject(pr->net, 0, 0, buf, 200);
    make_frame(buf, pr, TB_FRAME_ACK, 0, 0, 0, 0);
    h->ack[0] = tb_wire_le32(pr->params[0].initial_seq[0] + 50); /* acks unsent data */
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
    tb_lossy_inject(pr->net, 0, 0, buf, 80);
    make_frame(buf, pr, TB_FRAME_DATA, next_seq, 10, 0, 10);
    h->lane = 1; /* arrived on lane 0 */
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
    tb_lossy_inject(pr->net, 0, 0, buf, 90);
    make_frame(buf, pr, TB_FRAME_DATA, next_seq, 10, 0, 10);
    h->hdr_crc ^= 4;
    tb_lossy_inject(pr->net, 0, 0, buf, 90);
    make_frame(buf, pr, TB_FRAME_DATA, next_seq, 10, 0, 10);
    h->src_epoch = tb_wire_le64(77); /* another incarnation, not a HELLO */
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
    tb_lossy_inject(pr->net, 0, 0, buf, 90);
    run_for(pr, 1 * MS);
    ck_assert_uint_eq(c->malformed - m0, 7);
    ck_assert_uint_eq(c->bad_checksum, 1);
    ck_assert_uint_eq(c->stale, 1);
    ck_assert_uint_eq(pr->flow[0].nrecv, 0);
    ck_assert_uint_eq(pr->p[0].errors, 0);
    /* Still works. */
    mixed_traffic(pr, 50, 20, 1);
    ck_assert(run_until(pr, all_done, 1000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

START_TEST(test_close)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 14);
    pr->flow[1].nsent = 0;
    tb_lossy_set_dead(pr->net, 1, 1);
    /* More than the window: it stays incomplete (a send completes once all
     * of it is in send slots). */
    ck_assert_int_eq(send_msg(pr, 0, 4u << 20, 1), TB_CHAN_OK);
    run_for(pr, 1 * MS);
    tb_channel_close(pr->p[0].ch);
    ck_assert_uint_eq(pr->p[0].send_err, 1);
    ck_assert_int_eq(pr->p[0].last_send_status, TB_CHAN_ECANCELED);
    ck_assert_uint_eq(pr->p[0].errors, 0);
    ck_assert_int_eq(send_msg(pr, 0, 1, 1), TB_CHAN_ECANCELED);
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, p1_failed, 100 * MS));
    ck_assert_int_eq(pr->p[1].error_status, TB_CHAN_ECLOSED);
    pair_free(pr);
}
END_TEST

START_TEST(test_destroy_pending)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 15);
    mixed_traffic(pr, 100, 21, 1);
    run_for(pr, 100 * 1000);
    tb_lossy_reset_side(pr->net, 0);
    tb_channel_destroy(pr->p[0].ch);
    pr->p[0].ch = NULL;
    tb_lossy_attach(pr->net, 0, NULL);
    ck_assert_uint_eq(pr->p[0].send_ok + pr->p[0].send_err, pr->flow[1].nsent);
    ck_assert_uint_eq(tb_lossy_slots_out(pr->net, 0), 0);
    pair_free(pr);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Protocol violations, windows, backpressure, keepalives, cancellation */

/* An in-sequence DATA frame from side 1 to side 0 on lane 0. */
static void make_data(unsigned char *buf, pair_t *pr, uint32_t seq, uint32_t msg_id,
                      uint32_t msg_len, uint32_t off, uint32_t plen)
{
    tb_wire_frame_hdr_t *h = (tb_wire_frame_hdr_t *) buf;
    make_frame(buf, pr, TB_FRAME_DATA, seq, msg_len, off, plen);
    h->msg_id = tb_wire_le32(msg_id);
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
}

static void expect_violation(pair_t *pr, const char *word)
{
    run_for(pr, 1 * MS);
    ck_assert_uint_eq(pr->p[0].errors, 1);
    ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_EPROTO);
    ck_assert_msg(strstr(pr->p[0].why, word) != NULL, "'%s' does not say %s", pr->p[0].why,
                  word);
    ck_assert_int_eq(tb_channel_status(pr->p[0].ch), TB_CHAN_EPROTO);
}

/* A frame in sequence, with the right checksum and epochs, that does not fit
 * the message stream is a broken peer: the channel fails at once (dropping
 * it, as before, left the peer resending it until the peer timeout). */
START_TEST(test_violations)
{
    static const struct {
        uint32_t msg_id_delta, msg_len, off, plen;
        const char *word;
    } cases[] = {
        {0, 10, 8, 10, "runs past"},
        {0, 100, 40, 10, "starts at offset"},
        {0, 100u << 20, 0, 10, "max_msg_size"},
        {(uint32_t) -1, 10, 0, 10, "out of order"},
    };
    unsigned char buf[TB_WIRE_HW_FRAME];

    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pair_t *pr = std_pair(0, 0, 0, 0, 70 + i);
        uint32_t seq = pr->params[1].initial_seq[0], nd = seq;
        make_data(buf, pr, seq, nd + cases[i].msg_id_delta, cases[i].msg_len, cases[i].off,
                  cases[i].plen);
        tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE + cases[i].plen);
        expect_violation(pr, cases[i].word);
        pair_free(pr);
    }
    /* A fragment that does not continue the message under way. */
    {
        pair_t *pr = std_pair(0, 0, 0, 0, 75);
        uint32_t seq = pr->params[1].initial_seq[0];
        make_data(buf, pr, seq, seq, 8000, 0, 3000);
        tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE + 3000);
        make_data(buf, pr, seq + 1, seq, 8000, 2000, 3000);
        tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE + 3000);
        expect_violation(pr, "does not continue");
        pair_free(pr);
    }
}
END_TEST

/* The same when the bad frame was held after a gap (and so acked
 * selectively: the peer will never resend it) and is accepted only once the
 * gap fills: it used to be dropped there, and the lane hung. */
START_TEST(test_violation_held)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 76);
    const tb_channel_counters_t *c = tb_channel_counters(pr->p[0].ch);
    unsigned char buf[TB_WIRE_HW_FRAME];
    uint32_t seq = pr->params[1].initial_seq[0];

    make_data(buf, pr, seq + 1, seq + 1, 100, 40, 10); /* starts mid-message */
    tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE + 10);
    run_for(pr, 1 * MS);
    ck_assert_uint_eq(c->out_of_order, 1);
    ck_assert_uint_eq(pr->p[0].errors, 0);
    make_data(buf, pr, seq, seq, 10, 0, 10); /* fills the gap */
    tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE + 10);
    expect_violation(pr, "starts at offset");
    ck_assert_uint_eq(c->msgs_received, 1);
    pair_free(pr);
}
END_TEST

/* A peer that skips one message and sends thousands of later ones: they are
 * held (acked, in slots or copies) while the window allows, then the channel
 * fails instead of holding without bound. */
START_TEST(test_reassembly_window)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 77);
    unsigned char buf[TB_WIRE_HW_FRAME];
    uint32_t seq = pr->params[1].initial_seq[0], nd = seq;
    unsigned i;

    for (i = 0; i < 5000 && pr->p[0].errors == 0; i++) {
        make_data(buf, pr, seq + i, nd + 1 + i, 10, 0, 10);
        tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE + 10);
        pair_step(pr);
    }
    ck_assert_uint_eq(i, TB_CHAN_MAX_AHEAD); /* message nd + 64 failed it */
    expect_violation(pr, "beyond the next one due");
    ck_assert_uint_eq(tb_channel_counters(pr->p[0].ch)->msgs_received, 0);
    pair_free(pr);
}
END_TEST

/* Regression (found by fuzz_frame): a frame granting credit 2^31 - 1 beyond
 * the next tsn made the credit count overflow (undefined; in practice the
 * lane then had no credit and stalled for good).  A limit beyond what the
 * peer can have posted is clamped, and traffic goes on. */
START_TEST(test_credit_lie)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 78);
    unsigned char buf[TB_WIRE_HW_FRAME];
    tb_wire_frame_hdr_t *h = (tb_wire_frame_hdr_t *) buf;

    run_for(pr, 50 * MS); /* let the HELLO exchange settle */
    /* Nothing has gone out on lane 1 yet, and everything on lane 0: the
     * limits below are exactly INT32_MAX past each lane's next tsn. */
    uint32_t sent0 = (uint32_t) tb_channel_counters(pr->p[0].ch)->frames_sent;

    make_frame(buf, pr, TB_FRAME_ACK, 0, 0, 0, 0);
    h->credit[0] = tb_wire_le32(pr->params[0].initial_seq[0] + sent0 + 0x7fffffffu);
    h->credit[1] = tb_wire_le32(pr->params[0].initial_seq[1] + 0x7fffffffu);
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
    tb_lossy_inject(pr->net, 0, 0, buf, TB_WIRE_HDR_SIZE);
    pair_step(pr);
    for (unsigned i = 0; i < 200; i++) {
        send_msg(pr, 0, i % 3 ? 100 : 70000, 0x20);
    }
    ck_assert(run_until(pr, all_done, 10000 * MS));
    ck_assert_uint_eq(pr->p[0].errors, 0);
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* The fast path: single-frame messages written straight into a send slot,
 * mixed with queued sends, with loss: delivered once, intact, in order.
 * begin declines while sends are queued on the lane, for a message larger
 * than a frame, and between begin and commit nothing else may be sent. */
START_TEST(test_send_fast_path)
{
    pair_t *pr = std_pair(0.02, 0, 0, 0, 79);
    unsigned fast = 0, declined = 0;
    void *slot;

    for (unsigned i = 0; i < 3000; i++) {
        size_t len = i % 7 == 0 ? 40000 : i % 5;
        if (i % 3 == 0 || !send_fast(pr, 0, len, 0x30)) {
            declined += i % 3 != 0;
            ck_assert_int_eq(send_msg(pr, 0, i % 11 == 0 ? 200000 : len, 0x31), TB_CHAN_OK);
        } else {
            fast++;
        }
        if (i % 4 == 0) {
            pair_step(pr);
        }
    }
    ck_assert(run_until(pr, all_done, 20000 * MS));
    ck_assert_uint_gt(fast, 50);
    ck_assert_uint_gt(declined, 10);
    ck_assert_ptr_null(tb_channel_send_begin(pr->p[0].ch, 1, 70000)); /* two frames */
    slot = tb_channel_send_begin(pr->p[0].ch, 1, 10);
    ck_assert_ptr_nonnull(slot);
    ck_assert_int_eq(send_msg(pr, 0, 10, 1), TB_CHAN_ESTATE);
    tb_channel_send_cancel(pr->p[0].ch);
    ck_assert_int_eq(tb_channel_send_commit(pr->p[0].ch), TB_CHAN_ESTATE);
    mixed_traffic(pr, 100, 80, 1);
    ck_assert(run_until(pr, all_done, 20000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* Messages placed straight in the receiver's memory, with loss, duplication
 * and reordering: every byte lands where it belongs and the first bytes come
 * back through recv_placed. */
START_TEST(test_recv_place)
{
    pair_t *pr = std_pair(0.03, 0.01, 0, 0.01, 81);
    unsigned multi = 0;

    pr->p[1].use_place = 1;
    for (unsigned i = 0; i < 60; i++) {
        size_t len = 5000 + i * 1237;
        /* Placed: messages of more than one frame (one bulk frame carries
         * 32 KiB up to its payload). */
        multi += len < 32768 || len > TB_WIRE_HW_FRAME * 16 - TB_WIRE_HDR_SIZE;
        ck_assert_int_eq(send_msg(pr, 0, len, 0x41), TB_CHAN_OK);
        ck_assert(run_until(pr, all_done, 20000 * MS));
    }
    ck_assert_uint_eq(pr->p[1].placed, multi);
    ck_assert_uint_eq(pr->flow[1].bad, 0);
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* Messages of several frames on both lanes at once, with loss and
 * reordering: a bulk message's first frame often arrives while a message
 * before it on lane 0 is still incomplete.  The channel must not ask to place
 * it until that one is delivered (on_recv_place checks): the engine publishes
 * a placed message in the order it reserved its room, and placing ahead
 * published it before the earlier one (replies then came out of order). */
START_TEST(test_recv_place_in_turn)
{
    pair_t *pr = std_pair(0.03, 0, 0, 0.05, 82);

    pr->p[1].use_place = 1;
    for (unsigned round = 0; round < 6; round++) {
        for (unsigned i = 0; i < 8; i++) {
            ck_assert_int_eq(send_msg(pr, 0, 5000 + i * 101, 0x42), TB_CHAN_OK); /* lane 0 */
            ck_assert_int_eq(send_msg(pr, 0, 100000 + i * 4099, 0x43), TB_CHAN_OK); /* bulk */
            ck_assert_int_eq(send_msg(pr, 0, 64 + i, 0x44), TB_CHAN_OK);
        }
        ck_assert(run_until(pr, all_done, 20000 * MS));
    }
    ck_assert_uint_gt(pr->p[1].placed, 0);
    check_clean(pr);
    pair_free(pr);
}
END_TEST

static int requests_in(pair_t *pr)
{
    return pr->flow[1].nrecv == pr->flow[1].nsent;
}

/* Requests and large answers, one at a time, as a put/get or a rendezvous
 * makes them, with 1 % loss: every lost tail frame is found by a probe and
 * resent; requests take the fast path when they can, answers are placed. */
START_TEST(test_request_response_loss)
{
    pair_t *pr = std_pair(0.01, 0, 0, 0, 90);
    const tb_channel_counters_t *c0 = tb_channel_counters(pr->p[0].ch);
    const tb_channel_counters_t *c1 = tb_channel_counters(pr->p[1].ch);

    pr->p[0].use_place = 1;
    for (unsigned i = 0; i < 300; i++) {
        if (!send_fast(pr, 0, 40, 0x42)) {
            ck_assert_int_eq(send_msg(pr, 0, 40, 0x42), TB_CHAN_OK);
        }
        ck_assert(run_until(pr, requests_in, 5000 * MS));
        ck_assert_int_eq(send_msg(pr, 1, 100000 + i * 977, 0x43), TB_CHAN_OK);
        ck_assert(run_until(pr, all_done, 5000 * MS));
    }
    ck_assert_uint_eq(pr->p[0].placed, 300);
    ck_assert_uint_gt(c0->probes + c1->probes, 0);
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* A slow, lossy link (10 % loss, 30 ms each way, one bulk frame in flight):
 * a put or get's answer comes long after the peer timeout, but the channel
 * keeps moving, so the requester's deadline (tb_rma_answers_overdue) never
 * trips.  The deadline before it (from the request, the peer timeout plus the
 * data at 1 MB/s) would have failed both. */
static pair_t *slow_pair(uint64_t seed)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    cfg.loss = 0.10;
    cfg.delay_ns = 30 * MS;
    cfg.seed = seed;
    p.send_window[1] = 1;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 5000 * MS));
    return pr;
}

/* Run until side 0 received every message sent to it, checking at every step
 * that its answers never count as overdue; the time it took. */
static uint64_t wait_answer(pair_t *pr, uint64_t asked_ns, uint64_t limit_ns)
{
    uint64_t timeout = pr->params[0].peer_timeout_ns;

    while (pr->flow[0].nrecv < pr->flow[0].nsent) {
        ck_assert_uint_lt(pr->now - asked_ns, limit_ns);
        ck_assert_msg(!tb_rma_answers_overdue(pr->now, asked_ns,
                                              tb_channel_progress_ns(pr->p[0].ch), timeout),
                      "answer overdue %llu ms after the request, channel moving",
                      (unsigned long long) ((pr->now - asked_ns) / MS));
        pair_step(pr);
    }
    return pr->now - asked_ns;
}

START_TEST(test_slow_answer_not_overdue)
{
    pair_t *pr = slow_pair(120);
    uint64_t timeout = pr->params[0].peer_timeout_ns, t0, took;
    size_t big = 4u << 20;

    /* A get: a small request, a large answer. */
    pr->p[0].use_place = 1;
    t0 = pr->now;
    ck_assert_int_eq(send_msg(pr, 0, 40, 0x42), TB_CHAN_OK);
    ck_assert(run_until(pr, requests_in, 5000 * MS));
    ck_assert_int_eq(send_msg(pr, 1, big, 0x43), TB_CHAN_OK);
    took = wait_answer(pr, t0, 120000 * MS);
    if (getenv("TB_CHECK_VERBOSE")) {
        printf("slow link: a 4 MiB get's answer took %llu ms\n", (unsigned long long) (took / MS));
    }
    ck_assert_uint_gt(took, timeout + big * 1000u);
    /* A put: a large request, a small answer once it is all in. */
    t0 = pr->now;
    ck_assert_int_eq(send_msg(pr, 0, big, 0x44), TB_CHAN_OK);
    while (pr->flow[1].nrecv < pr->flow[1].nsent) {
        ck_assert(!tb_rma_answers_overdue(pr->now, t0, tb_channel_progress_ns(pr->p[0].ch),
                                          timeout));
        ck_assert_uint_lt(pr->now - t0, 120000 * MS);
        pair_step(pr);
    }
    ck_assert_int_eq(send_msg(pr, 1, 40, 0x45), TB_CHAN_OK);
    took = wait_answer(pr, t0, 120000 * MS);
    ck_assert_uint_gt(took, timeout + big * 1000u);
    ck_assert(run_until(pr, all_done, 5000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* A peer that takes a request (its channel acknowledges it and answers
 * keepalives) but never answers: overdue one peer timeout after the channel
 * last moved, while the channel itself stays up. */
START_TEST(test_unanswered_overdue)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    uint64_t timeout, t0, acked = 0;

    std_setup(&cfg, &p);
    p.peer_timeout_ns = 3000 * MS; /* longer than the deadline tested below */
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 100 * MS));
    timeout = 1000 * MS;
    t0 = pr->now;
    ck_assert_int_eq(send_msg(pr, 0, 40, 0x42), TB_CHAN_OK);
    while (!tb_rma_answers_overdue(pr->now, t0, tb_channel_progress_ns(pr->p[0].ch), timeout)) {
        if (!acked && tb_channel_unacked(pr->p[0].ch) == 0) {
            acked = pr->now;
        }
        ck_assert_uint_lt(pr->now - t0, 2 * timeout);
        pair_step(pr);
    }
    /* The request's acknowledgement was the last progress. */
    ck_assert_uint_gt(acked, 0);
    ck_assert_uint_gt(tb_channel_progress_ns(pr->p[0].ch), t0);
    ck_assert_uint_le(tb_channel_progress_ns(pr->p[0].ch), acked);
    ck_assert_uint_lt(pr->now - acked, timeout + 60 * MS);
    ck_assert_int_eq(tb_channel_status(pr->p[0].ch), TB_CHAN_OK);
    ck_assert_uint_eq(pr->p[0].errors + pr->p[1].errors, 0);
    /* Data arriving from the peer is progress too. */
    ck_assert_int_eq(send_msg(pr, 1, 100000, 0x43), TB_CHAN_OK);
    ck_assert(run_until(pr, all_done, 1000 * MS));
    ck_assert(!tb_rma_answers_overdue(pr->now, t0, tb_channel_progress_ns(pr->p[0].ch), timeout));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* Many small messages on lane 0 while large ones take lane 1: the small ones
 * would run ahead of a large one past the receiver's window; the sender holds
 * them back instead, with and without loss. */
START_TEST(test_order_window_two_lanes)
{
    for (int round = 0; round < 2; round++) {
        pair_t *pr = std_pair(round ? 0.02 : 0, 0, 0, 0, 78 + (uint64_t) round);
        for (unsigned k = 0; k < 4; k++) {
            ck_assert_int_eq(send_msg(pr, 0, (5u << 20) + k, 1), TB_CHAN_OK);
            for (unsigned i = 0; i < 400; i++) {
                ck_assert_int_eq(send_msg(pr, 0, 1 + i % 200, 2), TB_CHAN_OK);
            }
            ck_assert_int_eq(send_msg(pr, 1, 100 + k, 3), TB_CHAN_OK);
        }
        ck_assert(run_until(pr, all_done, 20000 * MS));
        check_clean(pr);
        ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->order_stalls, 0);
        pair_free(pr);
    }
}
END_TEST

/* A send completes with an error while other frames are in flight: the
 * channel fails, and every frame goes back to the link exactly once (the
 * failed one used to go back twice, the second time as NULL). */
START_TEST(test_send_error_completion)
{
    for (int ctrl = 0; ctrl < 2; ctrl++) {
        pair_t *pr = std_pair(0, 0, 0, 0, 80 + (uint64_t) ctrl);
        unsigned sent;

        ck_assert_int_eq(send_msg(pr, 0, 300000, 1), TB_CHAN_OK); /* lane 1, 5 frames */
        ck_assert_int_eq(send_msg(pr, 0, 100, 2), TB_CHAN_OK);
        if (ctrl) {
            ck_assert(run_until(pr, all_done, 100 * MS));
            tb_lossy_fail_next_send(pr->net, 0); /* the next keepalive */
        } else {
            tb_lossy_fail_next_send(pr->net, 0);
            ck_assert_int_eq(send_msg(pr, 0, 200, 3), TB_CHAN_OK);
            ck_assert_int_eq(send_msg(pr, 0, 70000, 4), TB_CHAN_OK);
        }
        sent = pr->flow[1].nsent;
        ck_assert(run_until(pr, p0_failed, 200 * MS));
        ck_assert_uint_eq(pr->p[0].errors, 1);
        ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_ELINK);
        ck_assert_uint_eq(pr->p[0].send_ok + pr->p[0].send_err, sent);
        ck_assert_uint_eq(pr->p[0].send_err, ctrl ? 0 : sent);
        ck_assert_uint_eq(tb_channel_pending_sends(pr->p[0].ch), 0);
        run_for(pr, 1 * MS); /* the completions of the frames still in flight */
        ck_assert_uint_eq(tb_lossy_stats(pr->net)->bad_puts, 0);
        ck_assert_int_eq(send_msg(pr, 0, 10, 1), TB_CHAN_ELINK);
        pair_free(pr); /* every slot back in its pool */
    }
}
END_TEST

/* Backpressure: against a peer that does not answer, sends are refused with
 * TB_CHAN_EAGAIN (and no callback) once the queue holds max_queued_msgs or
 * would pass max_queued_bytes; a message larger than the byte limit still
 * goes when it is alone; once acks flow, sends are accepted again.  (A send
 * leaves the queue once it is all in send slots: a window of one frame keeps
 * the rest queued.) */
START_TEST(test_backpressure)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    p.max_queued_msgs = 8;
    p.max_queued_bytes = 100000;
    p.send_window[0] = p.send_window[1] = 1;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 100 * MS));

    tb_lossy_set_dead(pr->net, 1, 1);
    for (unsigned i = 0; i < 8; i++) {
        ck_assert_int_eq(send_msg(pr, 0, 1000, 1), TB_CHAN_OK);
    }
    ck_assert_int_eq(send_msg(pr, 0, 1, 1), TB_CHAN_EAGAIN);
    run_for(pr, 5 * MS); /* the first is in the window: complete */
    ck_assert_uint_eq(pr->p[0].send_ok, 1);
    ck_assert_uint_eq(tb_channel_pending_sends(pr->p[0].ch), 7);
    ck_assert_int_eq(send_msg(pr, 0, 1, 1), TB_CHAN_OK);
    ck_assert_int_eq(send_msg(pr, 0, 1, 1), TB_CHAN_EAGAIN);
    ck_assert_uint_eq(pr->p[0].send_err, 0);
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, all_done, 100 * MS));

    tb_lossy_set_dead(pr->net, 1, 1);
    ck_assert_int_eq(send_msg(pr, 0, 90000, 1), TB_CHAN_OK);
    ck_assert_int_eq(send_msg(pr, 0, 10001, 1), TB_CHAN_EAGAIN);
    ck_assert_int_eq(send_msg(pr, 0, 10000, 1), TB_CHAN_OK); /* exactly the limit */
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, all_done, 100 * MS));

    tb_lossy_set_dead(pr->net, 1, 1);
    ck_assert_int_eq(send_msg(pr, 0, 300000, 1), TB_CHAN_OK); /* alone: accepted */
    ck_assert_int_eq(send_msg(pr, 0, 0, 1), TB_CHAN_EAGAIN);
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, all_done, 100 * MS));
    ck_assert_int_eq(send_msg(pr, 0, 0, 1), TB_CHAN_OK);
    ck_assert(run_until(pr, all_done, 100 * MS));
    check_clean(pr);
    ck_assert_uint_eq(pr->p[0].send_err, 0);
    pair_free(pr);
}
END_TEST

static uint64_t keepalives(pair_t *pr, int side)
{
    return tb_channel_counters(pr->p[side].ch)->keepalives_sent;
}

/* A peer that stops polling (busy computing) gets one keepalive, not one per
 * interval: each would take one of its receives until it polls again. */
START_TEST(test_keepalive_silent_peer)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    uint64_t k0;

    std_setup(&cfg, &p);
    p.keepalive_ns = 10 * MS; /* peer timeout 1 s: a retry after 250 ms */
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 100 * MS));
    k0 = keepalives(pr, 0);
    run_for(pr, 100 * MS);
    ck_assert_uint_ge(keepalives(pr, 0) - k0, 8); /* both up: one per interval */
    tb_lossy_set_dead(pr->net, 1, 1);
    k0 = keepalives(pr, 0);
    run_for(pr, 240 * MS);
    ck_assert_uint_eq(keepalives(pr, 0) - k0, 1);
    run_for(pr, 200 * MS); /* an unanswered keepalive is repeated after 250 ms */
    ck_assert_uint_eq(keepalives(pr, 0) - k0, 2);
    tb_lossy_set_dead(pr->net, 1, 0);
    k0 = keepalives(pr, 0);
    run_for(pr, 100 * MS);
    ck_assert_uint_ge(keepalives(pr, 0) - k0, 8);
    ck_assert_uint_eq(pr->p[0].errors + pr->p[1].errors, 0);
    pair_free(pr);
}
END_TEST

static char silence_log[2048];

static void log_silence(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) level;
    (void) ctx;
    if (strstr(msg, "went silent")) {
        snprintf(silence_log, sizeof(silence_log), "%s", msg);
    }
}

/* A peer that falls silent fails the channel, and the log says what the
 * channel held: frames received and refused, and the receives still posted
 * (a silent peer and a deaf channel look alike otherwise). */
START_TEST(test_silence_reported)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 9);

    mixed_traffic(pr, 20, 17, 0);
    run_for(pr, 200 * MS);
    tb_log_set_sink(log_silence, NULL, TB_LOG_WARN);
    silence_log[0] = '\0';
    tb_lossy_set_dead(pr->net, 1, 1);
    ck_assert(run_until(pr, p0_failed, 5000 * MS));
    ck_assert_int_eq(pr->p[0].error_status, TB_CHAN_EPEERDEAD);
    ck_assert_msg(strstr(silence_log, "frames received in all"), "log: '%s'", silence_log);
    ck_assert_msg(strstr(silence_log, "posted"), "log: '%s'", silence_log);
    tb_log_set_sink(log_quiet, NULL, TB_LOG_ERROR);
    pair_free(pr);
}
END_TEST

/* Idle under heavy loss: both sides' keepalives are often lost at once, and
 * neither then hears from the other; the repeat keeps such a pair alive. */
START_TEST(test_keepalive_loss)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;

    std_setup(&cfg, &p);
    p.keepalive_ns = 10 * MS;
    cfg.loss = 0.3;
    cfg.seed = 82;
    pr = pair_new(&cfg, &p);
    pair_connect(pr);
    ck_assert(run_until(pr, both_connected, 1000 * MS));
    run_for(pr, 20000 * MS);
    ck_assert_uint_eq(pr->p[0].errors + pr->p[1].errors, 0);
    mixed_traffic(pr, 20, 83, 1);
    ck_assert(run_until(pr, all_done, 5000 * MS));
    check_clean(pr);
    pair_free(pr);
}
END_TEST

/* Connection setup fails before the channel connected: abort completes every
 * queued send with the given status at once, without the error callback
 * (tb_channel_close ignores a channel that never connected). */
START_TEST(test_abort)
{
    tb_lossy_cfg_t cfg;
    tb_channel_params_t p;
    pair_t *pr;
    tb_wire_addr_t a;

    std_setup(&cfg, &p);
    pr = pair_new(&cfg, &p);
    pair_create_side(pr, 0);
    pair_create_side(pr, 1);
    for (unsigned i = 0; i < 5; i++) {
        ck_assert_int_eq(send_msg(pr, 0, 1000 * i, 1), TB_CHAN_OK); /* idle: queued */
    }
    tb_channel_abort(pr->p[0].ch, TB_CHAN_ELINK, "the connection manager gave up");
    ck_assert_uint_eq(pr->p[0].send_err, 5);
    ck_assert_int_eq(pr->p[0].last_send_status, TB_CHAN_ELINK);
    ck_assert_uint_eq(pr->p[0].errors, 0);
    ck_assert_uint_eq(tb_channel_pending_sends(pr->p[0].ch), 0);
    ck_assert_int_eq(tb_channel_status(pr->p[0].ch), TB_CHAN_ELINK);
    ck_assert_int_eq(send_msg(pr, 0, 10, 1), TB_CHAN_ELINK);
    tb_channel_local_addr(pr->p[1].ch, &a);
    ck_assert_int_eq(tb_channel_connect(pr->p[0].ch, &a, pr->now), TB_CHAN_ESTATE);
    tb_channel_abort(pr->p[0].ch, TB_CHAN_ECANCELED, NULL); /* no-op once failed */
    ck_assert_int_eq(tb_channel_status(pr->p[0].ch), TB_CHAN_ELINK);

    /* Connecting (HELLO out, no answer): status 0 means canceled. */
    tb_channel_local_addr(pr->p[0].ch, &a);
    ck_assert_int_eq(tb_channel_connect(pr->p[1].ch, &a, pr->now), TB_CHAN_OK);
    ck_assert_int_eq(send_msg(pr, 1, 100000, 1), TB_CHAN_OK);
    tb_channel_abort(pr->p[1].ch, 0, NULL);
    ck_assert_uint_eq(pr->p[1].send_err, 1);
    ck_assert_int_eq(pr->p[1].last_send_status, TB_CHAN_ECANCELED);
    ck_assert_uint_eq(pr->p[1].errors, 0);
    run_for(pr, 10 * MS);
    ck_assert_uint_eq(pr->p[1].errors, 0);
    pair_free(pr);
}
END_TEST

/* A send stops referencing the caller's memory mid-message (as before the
 * memory is deregistered): what was not yet copied into link slots is
 * copied, and the caller's buffer may be scribbled on and freed. */
START_TEST(test_send_detach)
{
    pair_t *pr = std_pair(0, 0, 0, 0, 84);
    flow_t *f = &pr->flow[1];
    const size_t len = 4u << 20;
    const uint32_t off = 12345;
    unsigned char *mine = malloc(len);
    struct iovec iov[3];
    uint64_t frames;

    ck_assert_ptr_nonnull(mine);
    memcpy(mine, src + off, len);
    iov[0] = (struct iovec){mine, 1500000};
    iov[1] = (struct iovec){mine + 1500000, 2000000};
    iov[2] = (struct iovec){mine + 3500000, len - 3500000};
    f->lens[0] = (uint32_t) len;
    f->offs[0] = off;
    f->tags[0] = 7;
    f->nsent = 1;
    ck_assert_int_eq(tb_channel_send_detach(pr->p[0].ch, iov), 1); /* nothing pending */
    tb_lossy_set_dead(pr->net, 1, 1); /* its credit runs out part way */
    ck_assert_int_eq(tb_channel_sendv(pr->p[0].ch, 7, iov, 3, iov), TB_CHAN_OK);
    run_for(pr, 5 * MS);
    frames = tb_channel_counters(pr->p[0].ch)->data_frames_sent;
    ck_assert_uint_gt(frames, 16);             /* into the second iovec */
    ck_assert_uint_lt(frames, len / 65456 - 10);
    ck_assert_int_eq(tb_channel_send_detach(pr->p[0].ch, iov), TB_CHAN_OK);
    ck_assert_int_eq(tb_channel_send_detach(pr->p[0].ch, iov), TB_CHAN_OK);
    ck_assert_int_eq(tb_channel_send_detach(pr->p[0].ch, src), 1);
    memset(mine, 0x5a, len);
    free(mine);
    tb_lossy_set_dead(pr->net, 1, 0);
    ck_assert(run_until(pr, all_done, 1000 * MS));
    check_clean(pr);
    ck_assert_int_eq(tb_channel_send_detach(pr->p[0].ch, iov), 1); /* completed */
    pair_free(pr);
}
END_TEST

/* Soak: 64 MiB of mixed sizes each way at a given loss, every byte checked. */
static void soak(double loss, uint64_t seed)
{
    pair_t *pr = std_pair(loss, loss / 4, loss / 4, loss / 4, seed);
    uint64_t x = seed, bytes[2] = {0, 0};
    int side = 0;

    while (bytes[0] < (64u << 20) || bytes[1] < (64u << 20)) {
        size_t len;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        switch ((x >> 61) % 8) {
        case 0: case 1: case 2: len = (x >> 20) % 256; break;
        case 3: case 4: len = (x >> 20) % 8192; break;
        case 5: len = (x >> 20) % 131072; break;
        case 6: len = (x >> 20) % (1u << 20); break;
        default: len = (x >> 20) % (5u << 20); break;
        }
        if (bytes[side] >= (64u << 20)) {
            side = 1 - side;
        }
        ck_assert_int_eq(send_msg(pr, side, len, (uint8_t) (x >> 8)), TB_CHAN_OK);
        bytes[side] += len;
        side = (int) ((x >> 40) & 1);
        /* Keep a bounded backlog, as a real sender would. */
        while (tb_channel_pending_sends(pr->p[0].ch) + tb_channel_pending_sends(pr->p[1].ch)
               > 64) {
            pair_step(pr);
        }
    }
    ck_assert(run_until(pr, all_done, 60000 * MS));
    check_clean(pr);
    if (getenv("TB_CHECK_VERBOSE")) {
        for (int i = 0; i < 2; i++) {
            const tb_channel_counters_t *c = tb_channel_counters(pr->p[i].ch);
            fprintf(stderr,
                    "soak loss %.2f side %d: %llu msgs %llu bytes received, %llu frames sent, "
                    "%llu retransmits, %llu timeouts, %llu naks, %llu dups, %llu bad crc, "
                    "%llu credit stalls, virtual time %.3f s\n",
                    loss, i, (unsigned long long) c->msgs_received,
                    (unsigned long long) c->bytes_received, (unsigned long long) c->frames_sent,
                    (unsigned long long) c->retransmits, (unsigned long long) c->timeouts,
                    (unsigned long long) c->naks_received, (unsigned long long) c->duplicates,
                    (unsigned long long) c->bad_checksum,
                    (unsigned long long) c->credit_stalls, (double) pr->now / 1e9);
        }
    }
    if (loss == 0) {
        ck_assert_uint_eq(tb_lossy_stats(pr->net)->no_recv_drops, 0);
        ck_assert_uint_eq(tb_channel_counters(pr->p[0].ch)->retransmits, 0);
    } else {
        ck_assert_uint_gt(tb_channel_counters(pr->p[0].ch)->retransmits, 0);
    }
    pair_free(pr);
}

START_TEST(test_soak_0) { soak(0, 100); }
END_TEST
START_TEST(test_soak_1) { soak(0.01, 101); }
END_TEST
START_TEST(test_soak_10) { soak(0.10, 102); }
END_TEST

static Suite *channel_suite(void)
{
    Suite *s = suite_create("channel");
    TCase *tc = tcase_create("unit");
    TCase *ts = tcase_create("soak");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_crc32c);
    tcase_add_test(tc, test_wire_layout);
    tcase_add_test(tc, test_bad_params);
    tcase_add_test(tc, test_bad_peer_addr);
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_sizes_one_lane_recv_buf);
    tcase_add_test(tc, test_iovec);
    tcase_add_test(tc, test_loss);
    tcase_add_test(tc, test_reorder);
    tcase_add_test(tc, test_duplication);
    tcase_add_test(tc, test_corruption);
    tcase_add_test(tc, test_everything_at_once);
    tcase_add_test(tc, test_slow_receiver);
    tcase_add_test(tc, test_bidirectional_saturation);
    tcase_add_test(tc, test_backoff);
    tcase_add_test(tc, test_rtt_long_delay);
    tcase_add_test(tc, test_rtt_hello_sample);
    tcase_add_test(tc, test_rtt_adapts);
    tcase_add_test(tc, test_rtt_loss_long_delay);
    tcase_add_test(tc, test_selective_repeat);
    tcase_add_test(tc, test_held_slots_bounded);
    tcase_add_test(tc, test_slow_answer_not_overdue);
    tcase_add_test(tc, test_unanswered_overdue);
    tcase_add_test(tc, test_stall_timeout);
    tcase_add_test(tc, test_peer_death_pending);
    tcase_add_test(tc, test_hand_back);
    tcase_add_test(tc, test_hand_back_large);
    tcase_add_test(tc, test_peer_death_idle);
    tcase_add_test(tc, test_connect_timeout);
    tcase_add_test(tc, test_late_peer);
    tcase_add_test(tc, test_restarted_peer);
    tcase_add_test(tc, test_clock_skew);
    tcase_add_test(tc, test_wraparound);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_close);
    tcase_add_test(tc, test_destroy_pending);
    tcase_add_test(tc, test_violations);
    tcase_add_test(tc, test_violation_held);
    tcase_add_test(tc, test_reassembly_window);
    tcase_add_test(tc, test_credit_lie);
    tcase_add_test(tc, test_send_fast_path);
    tcase_add_test(tc, test_recv_place);
    tcase_add_test(tc, test_recv_place_in_turn);
    tcase_add_test(tc, test_request_response_loss);
    tcase_add_test(tc, test_order_window_two_lanes);
    tcase_add_test(tc, test_send_error_completion);
    tcase_add_test(tc, test_backpressure);
    tcase_add_test(tc, test_keepalive_silent_peer);
    tcase_add_test(tc, test_silence_reported);
    tcase_add_test(tc, test_keepalive_loss);
    tcase_add_test(tc, test_abort);
    tcase_add_test(tc, test_send_detach);
    suite_add_tcase(s, tc);
    tcase_set_timeout(ts, 600);
    tcase_add_test(ts, test_soak_0);
    tcase_add_test(ts, test_soak_1);
    tcase_add_test(ts, test_soak_10);
    suite_add_tcase(s, ts);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(channel_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
