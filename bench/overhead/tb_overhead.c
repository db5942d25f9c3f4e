/*
 * tbrdma's own software cost per message, measured natively: the reliable
 * channel over an in-memory link on this host, with no soft-RoCE, kernel or
 * emulator in the way.  It is the closest measure here of what a Mac pays
 * per message on top of Apple's verbs.
 *
 * The link behaves like a UC queue pair: a send lands in the oldest receive
 * the peer posted on that lane (copied, as the hardware would), or is lost
 * if none is posted; each post completes at once.  Reported:
 *  - floor: CPU time of one post, one poll and the frame's copy on this link
 *    alone (what any transport pays here);
 *  - ns of CPU per small message one way (sender and receiver together),
 *    link included, and the channel's share above the floor;
 *  - frames per message in an 8 B ping-pong;
 *  - ack frames per MiB and wire bytes per payload byte, streaming;
 *  - the channel's copies per payload byte (sender and receiver);
 *  - what a relaying engine's channels add per forwarded message: a stream
 *    through a middle side that takes each message off one channel and sends
 *    it on over another, as the engine's relay_out does, against the same
 *    stream over one channel; and the middle's copies per forwarded byte.
 *
 *   tb_overhead [--msgs N] [--stream-mib M] [--size BYTES]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tb_channel.h"
#include "tb_keeper.h"
#include "tb_log.h"
#include "tb_random.h"

#define RING 256
#define MAX_SLOTS 64

typedef struct comp {
    int recv; /* 1: a frame landed; 0: a send completed */
    unsigned lane;
    void *buf;
    size_t len;
    void *cookie;
} comp_t;

typedef struct pool {
    unsigned char *mem;
    uint32_t size;
    void *free[MAX_SLOTS];
    unsigned nfree, count;
} pool_t;

typedef struct side side_t;

typedef struct mlink {
    tb_link_t link; /* first: the channel sees this */
    side_t *side;
} mlink_t;

struct side {
    mlink_t ml;
    side_t *peer;
    tb_channel_t *ch;
    pool_t send[TB_WIRE_MAX_LANES], recv[TB_WIRE_MAX_LANES];
    void *posted[TB_WIRE_MAX_LANES][RING]; /* receives, oldest first */
    unsigned post_head[TB_WIRE_MAX_LANES], post_tail[TB_WIRE_MAX_LANES];
    comp_t cq[RING * 4];
    unsigned cq_head, cq_tail;
    /* accounting */
    uint64_t frames, wire_bytes, lost;
    uint64_t delivered, delivered_bytes, in_slot_bytes;
    unsigned outstanding; /* sends not completed */
    side_t *fwd;          /* a relay: what it receives goes on over fwd's channel */
    uint64_t fwd_copied;  /* bytes it copied into fwd's send slots */
};

static void pool_init(pool_t *p, uint32_t size, unsigned count)
{
    p->mem = aligned_alloc(4096, (size_t) size * count);
    p->size = size;
    p->count = p->nfree = count;
    for (unsigned i = 0; i < count; i++) {
        p->free[i] = p->mem + (size_t) i * size;
    }
}

static int in_pool(const pool_t *p, const void *ptr)
{
    const unsigned char *c = ptr;
    return c >= p->mem && c < p->mem + (size_t) p->size * p->count;
}

static side_t *side_of(tb_link_t *l)
{
    return ((mlink_t *) l)->side;
}

static void op_local_addr(tb_link_t *l, tb_wire_addr_t *a)
{
    (void) l;
    memset(a->gid, 0, sizeof(a->gid));
    a->mtu = tb_wire_le16(4096);
}

static int op_connect(tb_link_t *l, const tb_wire_addr_t *peer)
{
    (void) l;
    (void) peer;
    return 0;
}

static void *op_send_get(tb_link_t *l, unsigned lane)
{
    pool_t *p = &side_of(l)->send[lane];
    return p->nfree ? p->free[--p->nfree] : NULL;
}

static void op_send_put(tb_link_t *l, unsigned lane, void *buf)
{
    pool_t *p = &side_of(l)->send[lane];
    if (buf && in_pool(p, buf) && p->nfree < p->count) {
        p->free[p->nfree++] = buf;
    }
}

static void *op_recv_get(tb_link_t *l, unsigned lane)
{
    pool_t *p = &side_of(l)->recv[lane];
    return p->nfree ? p->free[--p->nfree] : NULL;
}

static void op_recv_put(tb_link_t *l, unsigned lane, void *buf)
{
    pool_t *p = &side_of(l)->recv[lane];
    if (buf && in_pool(p, buf) && p->nfree < p->count) {
        p->free[p->nfree++] = buf;
    }
}

static void cq_push(side_t *s, comp_t c)
{
    s->cq[s->cq_tail++ % (RING * 4)] = c;
}

static int op_post_send(tb_link_t *l, unsigned lane, void *buf, size_t len, void *cookie)
{
    side_t *s = side_of(l), *d = s->peer;

    s->frames++;
    s->wire_bytes += len;
    if (d->post_head[lane] != d->post_tail[lane]) {
        void *rbuf = d->posted[lane][d->post_head[lane]++ % RING];
        memcpy(rbuf, buf, len);
        cq_push(d, (comp_t){.recv = 1, .lane = lane, .buf = rbuf, .len = len});
    } else {
        s->lost++;
    }
    cq_push(s, (comp_t){.recv = 0, .lane = lane, .cookie = cookie});
    return 0;
}

static int op_post_recv(tb_link_t *l, unsigned lane, void *buf)
{
    side_t *s = side_of(l);
    s->posted[lane][s->post_tail[lane]++ % RING] = buf;
    return 0;
}

static const tb_link_ops_t ops = {
    .local_addr = op_local_addr,
    .connect = op_connect,
    .send_buf_get = op_send_get,
    .send_buf_put = op_send_put,
    .recv_buf_get = op_recv_get,
    .recv_buf_put = op_recv_put,
    .post_send = op_post_send,
    .post_recv = op_post_recv,
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

/* Report s's completions to its channel, then progress it. */
static unsigned poll_side(side_t *s, uint64_t now)
{
    unsigned n = 0;

    if (s->cq_head != s->cq_tail) {
        tb_channel_clock(s->ch, now);
    }
    while (s->cq_head != s->cq_tail) {
        comp_t c = s->cq[s->cq_head++ % (RING * 4)];
        if (c.recv) {
            tb_channel_recv_done(s->ch, c.lane, c.buf, c.len, 0);
        } else {
            tb_channel_send_done(s->ch, c.cookie, 0);
        }
        n++;
    }
    tb_channel_progress(s->ch, now);
    return n;
}

static void on_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    side_t *s = ctx;
    s->delivered++;
    s->delivered_bytes += len;
    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        if (s->recv[l].mem && in_pool(&s->recv[l], data)) {
            s->in_slot_bytes += len;
        }
    }
    if (s->fwd) {
        /* As the engine relays: straight into a send slot of the next
         * channel when it can go at once, else queued by the channel. */
        void *slot = tb_channel_send_begin(s->fwd->ch, tag, len);
        if (slot) {
            memcpy(slot, data, len);
            tb_channel_send_commit(s->fwd->ch);
        } else if (tb_channel_send(s->fwd->ch, tag, data, len, NULL) == 0) {
            s->fwd->outstanding++;
        } else {
            fprintf(stderr, "tb_overhead: the relay's next channel refused a message\n");
            exit(1);
        }
        s->fwd_copied += len;
    }
}

static void on_send_done(void *ctx, void *cookie, int status)
{
    side_t *s = ctx;
    (void) cookie;
    if (status != 0) {
        fprintf(stderr, "tb_overhead: a send failed: %s\n", tb_channel_strerror(status));
        exit(1);
    }
    s->outstanding--;
}

static void on_error(void *ctx, int status, const char *why)
{
    (void) ctx;
    fprintf(stderr, "tb_overhead: channel failed (%s): %s\n", tb_channel_strerror(status), why);
    exit(1);
}

typedef struct pair {
    side_t s[2];
} pair_t;

static void pair_open(pair_t *p)
{
    tb_channel_params_t prm;
    tb_channel_callbacks_t cb = {
        .recv = on_recv, .send_done = on_send_done, .error = on_error};
    tb_wire_addr_t addr[2];

    memset(p, 0, sizeof(*p));
    tb_channel_params_default(&prm);
    prm.payload_crc = 0; /* the BTL's default: header checksum only */
    for (int i = 0; i < 2; i++) {
        side_t *s = &p->s[i];
        s->peer = &p->s[1 - i];
        s->ml.link.ops = &ops;
        s->ml.side = s;
        for (unsigned l = 0; l < prm.nlanes; l++) {
            pool_init(&s->send[l], prm.frame_size[l], MAX_SLOTS);
            pool_init(&s->recv[l], prm.frame_size[l], MAX_SLOTS);
        }
        prm.epoch = tb_random64();
        for (unsigned l = 0; l < prm.nlanes; l++) {
            prm.initial_seq[l] = (uint32_t) tb_random64();
        }
        cb.ctx = s;
        if (tb_channel_create(&prm, &s->ml.link, &cb, &s->ch) != 0) {
            fprintf(stderr, "tb_overhead: tb_channel_create failed\n");
            exit(1);
        }
        tb_channel_local_addr(s->ch, &addr[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (tb_channel_connect(p->s[i].ch, &addr[1 - i], now_ns()) != 0) {
            fprintf(stderr, "tb_overhead: tb_channel_connect failed\n");
            exit(1);
        }
    }
    while (!tb_channel_is_connected(p->s[0].ch) || !tb_channel_is_connected(p->s[1].ch)) {
        uint64_t t = now_ns();
        poll_side(&p->s[0], t);
        poll_side(&p->s[1], t);
    }
}

static void pair_close(pair_t *p)
{
    while (p->s[0].outstanding || p->s[1].outstanding) {
        uint64_t t = now_ns();
        poll_side(&p->s[0], t);
        poll_side(&p->s[1], t);
    }
    for (int i = 0; i < 2; i++) {
        tb_channel_destroy(p->s[i].ch);
        for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
            free(p->s[i].send[l].mem);
            free(p->s[i].recv[l].mem);
        }
    }
}

/* Drive both sides until side 1 has received want messages in all. */
static void drive_until(pair_t *p, uint64_t want)
{
    while (p->s[1].delivered < want) {
        uint64_t t = now_ns();
        poll_side(&p->s[0], t);
        poll_side(&p->s[1], t);
    }
}

static uint64_t frames_sent(const pair_t *p)
{
    return tb_channel_counters(p->s[0].ch)->frames_sent
           + tb_channel_counters(p->s[1].ch)->frames_sent;
}

static void keeper_idle(void *ctx, uint64_t now)
{
    (void) ctx;
    (void) now;
}

/* The fast-path stream; with k, inside the gate and stamped as the BTL does.
 * Returns ns of CPU per message. */
static double fast_stream(pair_t *p, uint64_t msgs, uint64_t size, const unsigned char *payload,
                          tb_keeper_t *k)
{
    uint64_t t0, sent = 0;

    pair_open(p);
    t0 = cpu_ns();
    while (p->s[1].delivered < msgs) {
        uint64_t t = now_ns();
        while (sent < msgs) {
            void *slot;
            if (k) {
                tb_keeper_enter(k);
            }
            slot = tb_channel_send_begin(p->s[0].ch, 0x10, size);
            if (slot) {
                memcpy(slot, payload, size);
                tb_channel_send_commit(p->s[0].ch);
                sent++;
            }
            if (k) {
                tb_keeper_leave(k);
            }
            if (!slot) {
                break;
            }
        }
        for (int i = 0; i < 2; i++) {
            if (k) {
                tb_keeper_enter(k);
                tb_keeper_touch(k, t);
            }
            poll_side(&p->s[i], t);
            if (k) {
                tb_keeper_leave(k);
            }
        }
    }
    double ns = (double) (cpu_ns() - t0) / (double) msgs;
    if (!k) {
        printf("fast_frames_per_msg %.3f\n", (double) frames_sent(p) / (double) msgs);
    }
    pair_close(p);
    return ns;
}

/* A stream of msgs messages of size bytes, at most 16 in flight, over one
 * channel (relay NULL: p) or through a relay (p to its side 1, which sends
 * each on over relay to relay's side 1).  ns of CPU per message, all sides
 * together; *copies: the relay's copies per forwarded byte (its channel's
 * out of the receive slots, and its own into the next channel's). */
static double stream_through(pair_t *p, pair_t *relay, uint64_t msgs, uint64_t size,
                             const unsigned char *payload, double *copies)
{
    side_t *last;
    uint64_t t0, sent = 0;
    double ns;

    pair_open(p);
    last = &p->s[1];
    if (relay) {
        pair_open(relay);
        p->s[1].fwd = &relay->s[0];
        last = &relay->s[1];
    }
    t0 = cpu_ns();
    while (last->delivered < msgs) {
        uint64_t t = now_ns();
        while (sent < msgs && sent - last->delivered < 16) {
            if (tb_channel_send(p->s[0].ch, 0x10, payload, size, NULL) != 0) {
                break;
            }
            p->s[0].outstanding++;
            sent++;
        }
        poll_side(&p->s[0], t);
        poll_side(&p->s[1], t);
        if (relay) {
            poll_side(&relay->s[0], t);
            poll_side(&relay->s[1], t);
        }
    }
    ns = (double) (cpu_ns() - t0) / (double) msgs;
    if (relay && copies) {
        const side_t *r = &p->s[1];
        *copies = (double) (r->delivered_bytes - r->in_slot_bytes + r->fwd_copied)
                  / (double) r->delivered_bytes;
    }
    if (relay) {
        p->s[1].fwd = NULL;
        pair_close(relay);
    }
    pair_close(p);
    return ns;
}

/* What a relay adds per message of size bytes: streams through it against
 * streams over one channel, in the order ABBA. */
static void relay_cost(uint64_t msgs, uint64_t size, const unsigned char *payload,
                       const char *name)
{
    pair_t p, r;
    double direct, relayed, copies = 0.0;

    direct = stream_through(&p, NULL, msgs, size, payload, NULL);
    relayed = stream_through(&p, &r, msgs, size, payload, &copies);
    relayed += stream_through(&p, &r, msgs, size, payload, &copies);
    direct += stream_through(&p, NULL, msgs, size, payload, NULL);
    printf("relay_%s_direct_ns_per_msg %.1f\n", name, direct / 2);
    printf("relay_%s_relayed_ns_per_msg %.1f\n", name, relayed / 2);
    printf("relay_%s_added_ns_per_msg %.1f\n", name, (relayed - direct) / 2);
    printf("relay_%s_copies_per_byte %.2f\n", name, copies);
}

int main(int argc, char **argv)
{
    uint64_t msgs = 200000, stream_mib = 256, size = 8;
    static unsigned char payload[1 << 20];
    pair_t p;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--msgs")) {
            msgs = strtoull(argv[i + 1], NULL, 10);
        } else if (!strcmp(argv[i], "--stream-mib")) {
            stream_mib = strtoull(argv[i + 1], NULL, 10);
        } else if (!strcmp(argv[i], "--size")) {
            size = strtoull(argv[i + 1], NULL, 10);
        } else {
            fprintf(stderr, "usage: tb_overhead [--msgs N] [--stream-mib M] [--size BYTES]\n");
            return 2;
        }
    }
    if (msgs == 0 || stream_mib == 0 || size > 4000) {
        fprintf(stderr, "tb_overhead: --msgs and --stream-mib must be positive, --size at most "
                        "4000\n");
        return 2;
    }
    tb_log_set_sink(NULL, NULL, TB_LOG_ERROR);
    memset(payload, 0x5a, sizeof(payload));

    /* Floor: the link alone, a small frame posted, landed and both
     * completions polled. */
    {
        side_t a, b;
        unsigned char frame[128], rbuf[128];
        uint64_t t0, n = msgs * 4;
        volatile uint64_t sink = 0; /* keeps the polls from being optimized away */
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        a.peer = &b;
        b.peer = &a;
        a.ml.side = &a;
        b.ml.side = &b;
        a.ml.link.ops = &ops;
        memset(frame, 1, sizeof(frame));
        t0 = cpu_ns();
        for (uint64_t i = 0; i < n; i++) {
            op_post_recv(&b.ml.link, 0, rbuf);
            op_post_send(&a.ml.link, 0, frame, TB_WIRE_HDR_SIZE + size, frame);
            while (b.cq_head != b.cq_tail) {
                sink += b.cq[b.cq_head++ % (RING * 4)].len;
            }
            while (a.cq_head != a.cq_tail) {
                sink += (uintptr_t) a.cq[a.cq_head++ % (RING * 4)].cookie & 1;
            }
        }
        printf("floor_ns_per_frame %.1f\n", (double) (cpu_ns() - t0) / (double) n);
        (void) sink;
    }

    /* One way: side 0 streams small messages, up to 32 in flight. */
    {
        uint64_t t0, sent = 0;
        pair_open(&p);
        t0 = cpu_ns();
        while (p.s[1].delivered < msgs) {
            uint64_t t = now_ns();
            while (sent < msgs && p.s[0].outstanding < 32) {
                if (tb_channel_send(p.s[0].ch, 0x10, payload, size, NULL) != 0) {
                    break;
                }
                p.s[0].outstanding++;
                sent++;
            }
            poll_side(&p.s[0], t);
            poll_side(&p.s[1], t);
        }
        printf("oneway_ns_per_msg %.1f\n", (double) (cpu_ns() - t0) / (double) msgs);
        printf("oneway_frames_per_msg %.3f\n",
               (double) frames_sent(&p) / (double) msgs);
        pair_close(&p);
    }

    /* One way again through the fast path the BTL's sendi takes: written
     * straight into a send slot, complete at once.  When the path declines
     * (window full), the sender waits for acks rather than queueing.  Then
     * the same as the BTL's direct path runs it: each send and each progress
     * call inside the keeper's gate, progress stamping the time, the keeper
     * thread awake every 10 ms (its CPU time counts).  In the order ABBA, so
     * that warming up favours neither. */
    {
        tb_keeper_t *k;
        double fast, kept;
        if (tb_keeper_create(10000000ull, keeper_idle, NULL, 0, &k) != 0) {
            fprintf(stderr, "tb_overhead: tb_keeper_create failed\n");
            return 1;
        }
        fast = fast_stream(&p, msgs, size, payload, NULL);
        kept = fast_stream(&p, msgs, size, payload, k);
        kept += fast_stream(&p, msgs, size, payload, k);
        fast += fast_stream(&p, msgs, size, payload, NULL);
        printf("fast_ns_per_msg %.1f\n", fast / 2);
        printf("keeper_ns_per_msg %.1f\n", kept / 2);
        printf("keeper_fenced %d\n", tb_keeper_fenced(k));
        tb_keeper_destroy(k);
    }

    /* Ping-pong: frames of both sides per message. */
    {
        uint64_t rounds = msgs / 4 ? msgs / 4 : 1;
        pair_open(&p);
        for (uint64_t i = 0; i < rounds; i++) {
            uint64_t want0 = p.s[0].delivered + 1;
            p.s[0].outstanding++;
            tb_channel_send(p.s[0].ch, 0x10, payload, size, NULL);
            drive_until(&p, i + 1);
            p.s[1].outstanding++;
            tb_channel_send(p.s[1].ch, 0x10, payload, size, NULL);
            while (p.s[0].delivered < want0) {
                uint64_t t = now_ns();
                poll_side(&p.s[1], t);
                poll_side(&p.s[0], t);
            }
        }
        printf("pingpong_frames_per_msg %.3f\n",
               (double) frames_sent(&p) / (double) (2 * rounds));
        pair_close(&p);
    }

    /* Through a relay: 8 B messages, and 64 KiB ones (several frames). */
    relay_cost(msgs, size, payload, "small");
    relay_cost(msgs / 64 ? msgs / 64 : 1, 65536, payload, "64k");

    /* Streaming 1 MiB messages: acks per MiB, wire bytes, copies, and the CPU
     * per MiB of both ends against one memcpy of a MiB on this core (the
     * link's own copy, which a device does by DMA, is one of them). */
    {
        static unsigned char copy[1 << 20];
        uint64_t sent = 0, wire0, t0, reps = 64;
        memcpy(copy, payload, sizeof(payload)); /* its pages first */
        t0 = cpu_ns();
        for (uint64_t i = 0; i < reps; ++i) {
            payload[i % sizeof(payload)] = (unsigned char) i;
            memcpy(copy, payload, sizeof(payload));
            __asm__ volatile("" : : "r"(copy) : "memory");
        }
        printf("memcpy_ns_per_mib %.0f\n", (double) (cpu_ns() - t0) / (double) reps);
        pair_open(&p);
        wire0 = p.s[0].wire_bytes;
        t0 = cpu_ns();
        while (p.s[1].delivered < stream_mib) {
            uint64_t t = now_ns();
            while (sent < stream_mib && p.s[0].outstanding < 4) {
                if (tb_channel_send(p.s[0].ch, 0x10, payload, sizeof(payload), NULL) != 0) {
                    break;
                }
                p.s[0].outstanding++;
                sent++;
            }
            poll_side(&p.s[0], t);
            poll_side(&p.s[1], t);
        }
        printf("stream_ns_per_mib %.0f\n", (double) (cpu_ns() - t0) / (double) stream_mib);
        printf("stream_ack_frames_per_mib %.2f\n",
               (double) tb_channel_counters(p.s[1].ch)->ctrl_frames_sent / (double) stream_mib);
        printf("stream_wire_bytes_per_payload_byte %.4f\n",
               (double) (p.s[0].wire_bytes - wire0) / (double) (stream_mib << 20));
        /* The sender always copies into send slots; the receiver copies
         * unless the message is handed over in its receive slot. */
        printf("stream_copies_per_byte %.2f\n",
               1.0 + (double) (p.s[1].delivered_bytes - p.s[1].in_slot_bytes)
                         / (double) p.s[1].delivered_bytes);
        printf("stream_retransmits %" PRIu64 "\n", tb_channel_counters(p.s[0].ch)->retransmits);
        pair_close(&p);
    }
    return 0;
}
