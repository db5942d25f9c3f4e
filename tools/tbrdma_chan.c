/*
 * tbrdma_chan: the reliable channel between two hosts over one cable.
 *
 *   host A:  tbrdma_chan --listen [--device NAME] [--port P]
 *   host B:  tbrdma_chan --connect IP:PORT [--device NAME] MODE
 *
 * MODE (chosen by the connecting side and sent to the listener first):
 *   stream  both sides send a seeded series of messages of mixed sizes
 *           (0 B..16 MiB) totalling --total MiB each way, and verify every
 *           byte, the order and the count of what they receive
 *   lat     ping-pong of --size bytes, --iters times: half round trip
 *           median and percentiles
 *   bw      --iters messages of --size bytes one way: bandwidth
 *   wait    connect, then idle until the channel fails (peer killed, cable
 *           cut): prints the time from the fault (read from --fault-file, a
 *           wall-clock time in seconds written by whoever made the fault) to
 *           the error
 * Both sides must be given the same channel options (lanes, frame sizes,
 * depth): the channel refuses a peer that differs.
 * Exit status: 0 success, 1 verification or channel failure, 2 setup error.
 */
#include "tb_config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tb_channel.h"
#include "tb_cm.h"
#include "tb_device.h"
#include "tb_domain.h"
#include "tb_log.h"
#include "tb_sha256.h"
#include "tb_tunables.h"

#define MIB (1024.0 * 1024.0)
#define MAX_MSG (16u << 20)
#define LISTENER_ID "tbrdma_chan-listener"
#define CONNECTOR_ID "tbrdma_chan-connector"

/* Connection setup is authenticated (tb_cm.h) with a secret both ends share:
 * SHA-256 of TBRDMA_CHAN_SECRET, the same on both hosts (empty when unset,
 * which authenticates nothing: a test tool on a private cable). */
static uint8_t chan_secret[TB_WIRE_SECRET_SIZE];

static void chan_secret_init(void)
{
    const char *s = getenv("TBRDMA_CHAN_SECRET");
    tb_sha256_t h;

    tb_sha256_init(&h);
    tb_sha256_update(&h, "tbrdma_chan", sizeof("tbrdma_chan"));
    if (s) {
        tb_sha256_update(&h, s, strlen(s));
    }
    tb_sha256_final(&h, chan_secret);
}

/* The only peers: the other end's role. */
static int cm_peer_secret(void *ctx, const void *id, size_t len, uint8_t *secret)
{
    (void) ctx;
    if ((len == strlen(LISTENER_ID) && !memcmp(id, LISTENER_ID, len))
        || (len == strlen(CONNECTOR_ID) && !memcmp(id, CONNECTOR_ID, len))) {
        memcpy(secret, chan_secret, sizeof(chan_secret));
        return 0;
    }
    return -1;
}

enum { TAG_CONFIG = 1, TAG_DATA, TAG_END, TAG_BYE, TAG_PING, TAG_PONG, TAG_BW_DONE };
enum { MODE_NONE, MODE_STREAM, MODE_LAT, MODE_BW, MODE_WAIT };

static const char *const mode_names[] = { "none", "stream", "lat", "bw", "wait" };

/* The first message: what the connecting side wants (little-endian). */
typedef struct __attribute__((packed)) run_config {
    uint32_t mode;
    uint32_t size;
    uint64_t seed;
    uint64_t total;
    uint64_t iters;
    uint32_t max_size;
} run_config_t;

typedef struct end_msg {
    uint64_t msgs;
    uint64_t bytes;
} end_msg_t;

typedef struct app {
    run_config_t cfg;
    int listener;
    tb_domain_t *domain;
    tb_conn_t *conn;
    tb_channel_t *ch;
    tb_cm_t *cm;
    int connected;    /* blobs exchanged, tb_conn_connect called */
    int setup_error;
    int chan_status;  /* 0, or the status the channel failed with */
    char chan_why[256];
    double fail_wall; /* wall-clock time of the failure */
    /* stream */
    uint64_t tx_seed, rx_seed;
    uint64_t tx_next, tx_bytes, tx_done, tx_inflight_bytes;
    int tx_end_queued, bye_queued, bye_acked;
    uint64_t rx_next, rx_bytes;
    int rx_end, rx_bye;
    uint64_t lost, dup, corrupt, bad_len;
    unsigned char *echo; /* lat: the pong's copy of the ping */
    size_t echo_len;
    /* lat / bw */
    uint64_t got_pong, got_bw_done, bw_recv, bw_bytes;
    int config_seen;
    uint64_t send_errors;
} app_t;

static app_t A;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((format(printf, 1, 2))) static void die(const char *fmt, ...)
{
    va_list ap;
    fputs("tbrdma_chan: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* ------------------------------------------------------------------ */
/* The seeded message series                                           */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Size of message k: the first two are the extremes, then a mix weighted
 * towards small messages with every size class present. */
static uint32_t msg_size(uint64_t seed, uint64_t k, uint32_t max)
{
    uint64_t r = mix64(seed ^ (k * 0x632be59bd9b4e019ull));
    uint32_t lo, hi, s;

    if (k == 0) {
        return 0;
    }
    if (k == 1) {
        return max;
    }
    switch ((r >> 32) % 20) {
    case 0: case 1: case 2: case 3: case 4: case 5: lo = 0; hi = 256; break;
    case 6: case 7: case 8: case 9: case 10: lo = 257; hi = 8192; break;
    case 11: case 12: case 13: case 14: lo = 8193; hi = 262144; break;
    case 15: case 16: case 17: lo = 262145; hi = 2u << 20; break;
    default: lo = (2u << 20) + 1; hi = max; break;
    }
    if (hi > max) {
        hi = max;
    }
    if (lo > hi) {
        lo = hi;
    }
    s = lo + (uint32_t) ((r & 0xffffffffu) % (hi - lo + 1));
    return s;
}

/* Message k's bytes: word 0 is k (so a misplaced message says which it
 * is), then a stream from a per-message generator. */
static void pattern_fill(uint64_t seed, uint64_t k, unsigned char *buf, size_t len)
{
    uint64_t x = mix64(seed ^ mix64(k)), w = k;
    size_t i = 0;

    for (; i + 8 <= len; i += 8) {
        memcpy(buf + i, &w, 8);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w = x ^ (x >> 29);
    }
    if (i < len) {
        memcpy(buf + i, &w, len - i);
    }
}

/* 0 if buf is message k, else the first bad offset + 1. */
static size_t pattern_check(uint64_t seed, uint64_t k, const unsigned char *buf, size_t len)
{
    uint64_t x = mix64(seed ^ mix64(k)), w = k, got;
    size_t i = 0;

    for (; i + 8 <= len; i += 8) {
        memcpy(&got, buf + i, 8);
        if (got != w) {
            return i + 1;
        }
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w = x ^ (x >> 29);
    }
    if (i < len && memcmp(buf + i, &w, len - i) != 0) {
        return i + 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Channel callbacks                                                   */

/* Messages arrive in order, so message k is expected next; its first word
 * names the message actually received, which tells a loss from a
 * duplicate or an overtaking message. */
static void stream_recv(const unsigned char *data, size_t len)
{
    uint64_t k = A.rx_next;
    size_t bad;

    if (len >= 8) {
        memcpy(&k, data, 8);
    }
    if (k < A.rx_next) {
        A.dup++;
        fprintf(stderr, "tbrdma_chan: message %llu arrived again (or late) while %llu was "
                "expected\n", (unsigned long long) k, (unsigned long long) A.rx_next);
        return;
    }
    if (k > A.rx_next) {
        fprintf(stderr, "tbrdma_chan: messages %llu..%llu missing\n",
                (unsigned long long) A.rx_next, (unsigned long long) k - 1);
        if (k - A.rx_next > 1000000) {
            A.corrupt++; /* not a message number: count the message once */
            A.rx_next++;
            return;
        }
        A.lost += k - A.rx_next;
        A.rx_next = k;
    }
    if (len != msg_size(A.rx_seed, k, A.cfg.max_size)) {
        A.bad_len++;
        fprintf(stderr, "tbrdma_chan: message %llu: %zu bytes, expected %u\n",
                (unsigned long long) k, len, msg_size(A.rx_seed, k, A.cfg.max_size));
    } else if ((bad = pattern_check(A.rx_seed, k, data, len)) != 0) {
        A.corrupt++;
        fprintf(stderr, "tbrdma_chan: message %llu (%zu bytes) differs at byte %zu\n",
                (unsigned long long) k, len, bad - 1);
    }
    A.rx_next++;
    A.rx_bytes += len;
}

static void on_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    (void) ctx;
    switch (tag) {
    case TAG_CONFIG:
        if (len == sizeof(run_config_t) && A.listener && !A.config_seen) {
            memcpy(&A.cfg, data, sizeof(A.cfg));
            A.config_seen = 1;
            A.tx_seed = A.cfg.seed + 1;
            A.rx_seed = A.cfg.seed;
        }
        break;
    case TAG_DATA:
        stream_recv(data, len);
        break;
    case TAG_END:
        if (len == sizeof(end_msg_t)) {
            end_msg_t e;
            memcpy(&e, data, sizeof(e));
            if (e.msgs != A.rx_next || e.bytes != A.rx_bytes) {
                fprintf(stderr, "tbrdma_chan: the peer sent %llu messages (%llu bytes), %llu "
                        "(%llu bytes) arrived\n", (unsigned long long) e.msgs,
                        (unsigned long long) e.bytes, (unsigned long long) A.rx_next,
                        (unsigned long long) A.rx_bytes);
                A.lost += e.msgs > A.rx_next ? e.msgs - A.rx_next : 0;
                A.dup += e.msgs < A.rx_next ? A.rx_next - e.msgs : 0;
            }
            A.rx_end = 1;
        }
        break;
    case TAG_BYE:
        A.rx_bye = 1;
        break;
    case TAG_PING:
        /* The channel reads the caller's memory after this call, as credits
         * allow: echo from a copy.  One ping at a time, and the next comes
         * only after the whole pong went out, so one buffer will do. */
        if (len > A.echo_len) {
            free(A.echo);
            A.echo = malloc(len);
            A.echo_len = A.echo ? len : 0;
        }
        if (len > A.echo_len) {
            A.send_errors++;
            break;
        }
        memcpy(A.echo, data, len);
        if (tb_channel_send(A.ch, TAG_PONG, A.echo, len, NULL) != 0) {
            A.send_errors++;
        }
        break;
    case TAG_PONG:
        A.got_pong++;
        break;
    case TAG_BW_DONE:
        A.got_bw_done = 1;
        break;
    default:
        if (tag >= 100) { /* bw payload */
            A.bw_recv++;
            A.bw_bytes += len;
        }
        break;
    }
}

/* Stream buffers are owned by their send; others are static. */
typedef struct stream_buf {
    uint64_t len;
    unsigned char data[];
} stream_buf_t;

static void on_send_done(void *ctx, void *cookie, int status)
{
    (void) ctx;
    if (status != 0) {
        A.send_errors++;
    }
    if (cookie == &A.bye_queued) {
        A.bye_acked = status == 0;
        return;
    }
    if (cookie) {
        stream_buf_t *b = cookie;
        A.tx_inflight_bytes -= b->len;
        A.tx_done++;
        free(b);
    }
}

static void on_error(void *ctx, int status, const char *why)
{
    (void) ctx;
    if (A.chan_status == 0) {
        A.chan_status = status;
        A.fail_wall = wall_now();
        snprintf(A.chan_why, sizeof(A.chan_why), "%s", why);
    }
}

/* ------------------------------------------------------------------ */
/* Connection setup                                                    */

static tb_channel_params_t chan_params;

static int cm_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                     tb_wire_addr_t *local, void **user)
{
    (void) ctx;
    (void) peer_id;
    (void) id_len;
    (void) peer;
    if (A.conn) {
        return -1; /* one peer per run */
    }
    tb_channel_callbacks_t cb = {
        .recv = on_recv, .send_done = on_send_done, .error = on_error,
    };
    if (tb_conn_create(A.domain, &chan_params, &cb, &A.conn) != 0) {
        A.setup_error = 1;
        return -1;
    }
    A.ch = tb_conn_channel(A.conn);
    tb_conn_local_addr(A.conn, local);
    *user = A.conn;
    return 0;
}

static void cm_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer,
                    const char *why)
{
    (void) ctx;
    (void) user;
    if (status != TB_CM_OK) {
        if (status == TB_CM_EUNREACH && !A.listener) {
            A.setup_error = -1; /* the listener may not be up yet: retry */
            return;
        }
        fprintf(stderr, "tbrdma_chan: connection setup failed: %s\n", why);
        A.setup_error = 1;
        return;
    }
    if (tb_conn_connect(A.conn, peer, now_ns()) != TB_CHAN_OK) {
        fprintf(stderr, "tbrdma_chan: connecting the channel failed (see above)\n");
        A.setup_error = 1;
        return;
    }
    A.connected = 1;
}

static void progress(void)
{
    if (A.cm) {
        tb_cm_progress(A.cm, now_ns());
    }
    /* Read the clock again: the channel times acks by it. */
    tb_domain_progress(A.domain, now_ns());
}

/* ------------------------------------------------------------------ */
/* Modes                                                               */

static void print_counters(const char *who)
{
    const tb_channel_counters_t *c = tb_channel_counters(A.ch);
    printf("%s counters: frames_sent=%llu frames_received=%llu retransmits=%llu timeouts=%llu "
           "naks_sent=%llu duplicates=%llu out_of_order=%llu bad_checksums=%llu malformed=%llu "
           "credit_stalls=%llu msgs_sent=%llu msgs_received=%llu rtt_samples=%llu "
           "srtt_us=%.1f/%.1f rto_us=%.1f/%.1f\n",
           who, (unsigned long long) c->frames_sent, (unsigned long long) c->frames_received,
           (unsigned long long) c->retransmits, (unsigned long long) c->timeouts,
           (unsigned long long) c->naks_sent, (unsigned long long) c->duplicates,
           (unsigned long long) c->out_of_order, (unsigned long long) c->bad_checksum,
           (unsigned long long) c->malformed, (unsigned long long) c->credit_stalls,
           (unsigned long long) c->msgs_sent, (unsigned long long) c->msgs_received,
           (unsigned long long) c->rtt_samples, c->srtt_ns[0] / 1e3, c->srtt_ns[1] / 1e3,
           c->rto_ns[0] / 1e3, c->rto_ns[1] / 1e3);
}

/* Queue stream messages while fewer than 4 (and < 40 MiB) are unacked. */
static void stream_push(void)
{
    while (!A.tx_end_queued && A.tx_next - A.tx_done < 4 && A.tx_inflight_bytes < (40u << 20)) {
        if (A.tx_bytes >= A.cfg.total) {
            static end_msg_t e;
            e.msgs = A.tx_next;
            e.bytes = A.tx_bytes;
            if (tb_channel_send(A.ch, TAG_END, &e, sizeof(e), NULL) != 0) {
                A.send_errors++;
            }
            A.tx_end_queued = 1;
            return;
        }
        uint32_t len = msg_size(A.tx_seed, A.tx_next, A.cfg.max_size);
        stream_buf_t *b = malloc(sizeof(*b) + (len ? len : 1));
        if (!b) {
            die("out of memory for a %u-byte message", len);
        }
        b->len = len;
        pattern_fill(A.tx_seed, A.tx_next, b->data, len);
        if (tb_channel_send(A.ch, TAG_DATA, b->data, len, b) != 0) {
            free(b);
            A.send_errors++;
            return;
        }
        A.tx_next++;
        A.tx_bytes += len;
        A.tx_inflight_bytes += len;
    }
}

static int run_stream(void)
{
    uint64_t start = now_ns(), linger_until = 0;
    int done = 0;

    while (!A.chan_status) {
        progress();
        stream_push();
        if (!A.bye_queued && A.tx_end_queued && A.tx_done == A.tx_next && A.rx_end
            && tb_channel_pending_sends(A.ch) == 0) {
            if (tb_channel_send(A.ch, TAG_BYE, "", 0, &A.bye_queued) != 0) {
                A.send_errors++;
            }
            A.bye_queued = 1;
        }
        /* A send completes once it is in the channel's slots: wait for the
         * peer's acknowledgement of everything too, BYE included. */
        if (!done && A.bye_acked && A.rx_bye && tb_channel_unacked(A.ch) == 0) {
            done = 1;
            /* Keep answering for a while: the peer may still wait for our ack
             * of its BYE. */
            linger_until = now_ns() + 300000000ull;
        }
        if (done && now_ns() >= linger_until) {
            break;
        }
    }
    /* The peer may close first once both BYEs are through. */
    if (A.chan_status == TB_CHAN_ECLOSED && A.rx_bye) {
        A.chan_status = 0;
    }
    {
        double secs = (now_ns() - start) / 1e9;
        printf("stream: sent %llu messages (%.1f MiB), received %llu messages (%.1f MiB) in "
               "%.1f s (%.1f MiB/s each way)\n",
               (unsigned long long) A.tx_next, A.tx_bytes / MIB, (unsigned long long) A.rx_next,
               A.rx_bytes / MIB, secs, (A.tx_bytes + A.rx_bytes) / 2 / MIB / secs);
        printf("stream: lost=%llu duplicated_or_reordered=%llu corrupted=%llu bad_length=%llu "
               "send_errors=%llu\n",
               (unsigned long long) A.lost, (unsigned long long) A.dup, (unsigned long long) A.corrupt,
               (unsigned long long) A.bad_len, (unsigned long long) A.send_errors);
    }
    if (A.chan_status) {
        printf("stream: FAILED: channel error: %s\n", A.chan_why);
        return 1;
    }
    if (A.lost || A.dup || A.corrupt || A.bad_len || A.send_errors
        || A.tx_bytes < A.cfg.total || !A.rx_end) {
        printf("stream: FAILED\n");
        return 1;
    }
    printf("stream: OK\n");
    return 0;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static int run_lat_client(void)
{
    uint64_t n = A.cfg.iters, warm = n / 10 + 10;
    double *samples = calloc(n, sizeof(double));
    unsigned char *buf = calloc(1, A.cfg.size ? A.cfg.size : 1);

    if (!samples || !buf) {
        die("out of memory");
    }
    for (uint64_t i = 0; i < n + warm && !A.chan_status; i++) {
        uint64_t want = A.got_pong + 1, t0 = now_ns();
        if (tb_channel_send(A.ch, TAG_PING, buf, A.cfg.size, NULL) != 0) {
            A.send_errors++;
            break;
        }
        while (A.got_pong < want && !A.chan_status) {
            progress();
        }
        if (i >= warm) {
            samples[i - warm] = (now_ns() - t0) / 2e3;
        }
    }
    if (A.chan_status) {
        printf("lat: FAILED: %s\n", A.chan_why);
        return 1;
    }
    qsort(samples, n, sizeof(double), dbl_cmp);
    printf("lat: size=%u iters=%llu half-round-trip usec: min=%.2f median=%.2f p90=%.2f "
           "p99=%.2f max=%.2f\n",
           A.cfg.size, (unsigned long long) n, samples[0], samples[n / 2],
           samples[(n * 9) / 10], samples[(n * 99) / 100], samples[n - 1]);
    free(samples);
    free(buf);
    return 0;
}

static int run_bw_client(void)
{
    uint64_t n = A.cfg.iters, queued = 0, t0, t1;
    unsigned char *buf = calloc(1, A.cfg.size ? A.cfg.size : 1);
    size_t depth = A.cfg.size >= (1u << 20) ? 16 : 64;

    if (!buf) {
        die("out of memory");
    }
    t0 = now_ns();
    while (!A.chan_status && !A.got_bw_done) {
        while (queued < n && tb_channel_pending_sends(A.ch) < depth) {
            if (tb_channel_send(A.ch, 100, buf, A.cfg.size, NULL) != 0) {
                A.send_errors++;
                break;
            }
            queued++;
        }
        progress();
    }
    t1 = now_ns();
    if (A.chan_status) {
        printf("bw: FAILED: %s\n", A.chan_why);
        return 1;
    }
    {
        double secs = (t1 - t0) / 1e9, bytes = (double) n * A.cfg.size;
        printf("bw: size=%u iters=%llu %.3f s %.2f MB/s %.3f Gb/s\n", A.cfg.size,
               (unsigned long long) n, secs, bytes / secs / 1e6, bytes * 8 / secs / 1e9);
    }
    free(buf);
    return 0;
}

static int run_wait(const char *fault_file)
{
    printf("wait: connected, idle until the channel fails\n");
    fflush(stdout);
    while (!A.chan_status) {
        progress();
        usleep(1000); /* idle: the channel's timers run in ms */
    }
    printf("wait: channel failed: %s (%s) at %.6f\n", tb_channel_strerror(A.chan_status),
           A.chan_why, A.fail_wall);
    if (fault_file) {
        FILE *f = fopen(fault_file, "r");
        double fault = 0;
        if (f && fscanf(f, "%lf", &fault) == 1 && fault > 0) {
            printf("wait: detected %.3f s after the fault\n", A.fail_wall - fault);
        } else {
            printf("wait: no fault time in %s\n", fault_file);
        }
        if (f) {
            fclose(f);
        }
    }
    return 0;
}

/* The listener serves whatever the connector asked for. */
static int serve(const char *fault_file)
{
    while (!A.config_seen && !A.chan_status) {
        progress();
    }
    if (A.chan_status) {
        printf("listener: channel failed before the run started: %s\n", A.chan_why);
        return 1;
    }
    printf("listener: mode %s\n", A.cfg.mode < 5 ? mode_names[A.cfg.mode] : "?");
    fflush(stdout);
    switch (A.cfg.mode) {
    case MODE_STREAM:
        return run_stream();
    case MODE_WAIT:
        return run_wait(fault_file);
    case MODE_LAT:
    case MODE_BW:
        while (!A.chan_status) {
            progress();
            if (A.cfg.mode == MODE_BW && A.bw_recv == A.cfg.iters && !A.got_bw_done) {
                A.got_bw_done = 1;
                tb_channel_send(A.ch, TAG_BW_DONE, "", 0, NULL);
            }
        }
        /* The client closing the channel is the normal end (its CLOSE frame
         * is best effort: silence after the run is one too). */
        printf("listener: %s\n", A.chan_why);
        return A.chan_status == TB_CHAN_ECLOSED || A.chan_status == TB_CHAN_EPEERDEAD ? 0 : 1;
    default:
        printf("listener: unknown mode %u\n", A.cfg.mode);
        return 1;
    }
}

/* ------------------------------------------------------------------ */
/* Main                                                                */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tbrdma_chan --listen [OPTIONS]\n"
            "       tbrdma_chan --connect IP:PORT [OPTIONS] stream|lat|bw|wait\n"
            "  --device NAME        RDMA device (default: the one whose subnet holds IP, or the\n"
            "                       first usable)\n"
            "  --port P             listening port (default 0: any; printed)\n"
            "  --lanes 1|2          queue pairs per connection (default 2)\n"
            "  --small-frame BYTES  lane-0 frame size (default 4096)\n"
            "  --bulk-frame BYTES   lane-1 frame size (default 65536)\n"
            "  --depth N            receives per lane (default 32; the bulk lane is held to\n"
            "                       4095 hardware frames)\n"
            "  --window N           unacked frames per lane (default: depth)\n"
            "  --peer-timeout MS    silence before the peer is dead (default 5000)\n"
            "  --rto-min US         floor of the adaptive retransmit timeout (default 2000)\n"
            "  --checksum full|header\n"
            "  --seed S --total MIB --max-size BYTES   stream (defaults 1, 256, 16 MiB)\n"
            "  --size BYTES --iters N                  lat, bw (defaults 8, 1000)\n"
            "  --fault-file PATH    wait: file holding the fault's wall-clock time (s)\n"
            "  --connect-timeout MS keep retrying an unreachable listener, or wait for a\n"
            "                       connection when listening (default 30000)\n"
            "  --verbose\n"
            "  environment: TBRDMA_CHAN_SECRET, the same on both hosts, authenticates the\n"
            "  connection setup\n");
}

static tb_device_t *pick_device(tb_device_list_t *list, const char *name, const char *ip)
{
    struct in_addr target = { 0 };
    tb_device_t *first = NULL;

    if (ip) {
        inet_pton(AF_INET, ip, &target);
    }
    for (int i = 0; i < list->count; i++) {
        tb_device_t *d = &list->devices[i];
        if (name) {
            if (strcmp(d->name, name) == 0) {
                if (!d->usable) {
                    die("device %s is not usable: %s", d->name, d->reason);
                }
                return d;
            }
            continue;
        }
        if (!d->usable) {
            continue;
        }
        if (!first) {
            first = d;
        }
        if (ip && d->netmask.s_addr
            && (d->ipv4.s_addr & d->netmask.s_addr) == (target.s_addr & d->netmask.s_addr)) {
            return d;
        }
    }
    if (name) {
        die("no RDMA device named %s (see tbrdma_devinfo)", name);
    }
    if (!first) {
        die("no usable RDMA device (see tbrdma_devinfo)");
    }
    return first;
}

static unsigned long parse_num(const char *opt, const char *s, unsigned long lo, unsigned long hi)
{
    char *end;
    unsigned long v;

    errno = 0;
    v = strtoul(s, &end, 0);
    if (errno || *end || v < lo || v > hi) {
        die("%s: '%s' is not a number between %lu and %lu", opt, s, lo, hi);
    }
    return v;
}

int main(int argc, char **argv)
{
    enum { O_LISTEN = 256, O_CONNECT, O_DEVICE, O_PORT, O_LANES, O_SMALL, O_BULK, O_DEPTH,
           O_WINDOW, O_PTO, O_RTO, O_CSUM, O_SEED, O_TOTAL, O_MAXSIZE, O_SIZE, O_ITERS,
           O_FAULT, O_CTO, O_VERBOSE, O_HELP };
    static const struct option opts[] = {
        { "listen", no_argument, NULL, O_LISTEN },
        { "connect", required_argument, NULL, O_CONNECT },
        { "device", required_argument, NULL, O_DEVICE },
        { "port", required_argument, NULL, O_PORT },
        { "lanes", required_argument, NULL, O_LANES },
        { "small-frame", required_argument, NULL, O_SMALL },
        { "bulk-frame", required_argument, NULL, O_BULK },
        { "depth", required_argument, NULL, O_DEPTH },
        { "window", required_argument, NULL, O_WINDOW },
        { "peer-timeout", required_argument, NULL, O_PTO },
        { "rto-min", required_argument, NULL, O_RTO },
        { "checksum", required_argument, NULL, O_CSUM },
        { "seed", required_argument, NULL, O_SEED },
        { "total", required_argument, NULL, O_TOTAL },
        { "max-size", required_argument, NULL, O_MAXSIZE },
        { "size", required_argument, NULL, O_SIZE },
        { "iters", required_argument, NULL, O_ITERS },
        { "fault-file", required_argument, NULL, O_FAULT },
        { "connect-timeout", required_argument, NULL, O_CTO },
        { "verbose", no_argument, NULL, O_VERBOSE },
        { "help", no_argument, NULL, O_HELP },
        { NULL, 0, NULL, 0 },
    };
    tb_tunables_t tun;
    int rto_given = 0;
    const char *device = NULL, *connect_to = NULL, *fault_file = NULL;
    char ip[INET_ADDRSTRLEN] = "", err[256];
    unsigned port = 0, window = 0;
    uint64_t connect_timeout_ms = 30000;
    tb_log_level_t level = TB_LOG_WARN;
    tb_device_list_t list;
    tb_domain_params_t dp;
    tb_device_t *dev;
    int c, rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    tb_tunables_defaults(&tun);
    A.cfg.seed = 1;
    A.cfg.total = 256ull << 20;
    A.cfg.max_size = MAX_MSG;
    A.cfg.size = 8;
    A.cfg.iters = 1000;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_LISTEN: A.listener = 1; break;
        case O_CONNECT: connect_to = optarg; break;
        case O_DEVICE: device = optarg; break;
        case O_PORT: port = (unsigned) parse_num("--port", optarg, 0, 65535); break;
        case O_LANES: tun.lanes = (int) parse_num("--lanes", optarg, 1, 2); break;
        case O_SMALL: tun.small_frame_size = (uint32_t) parse_num("--small-frame", optarg, 1,
                                                                  TB_APPLE_MAX_MSG_SIZE); break;
        case O_BULK: tun.bulk_frame_size = (uint32_t) parse_num("--bulk-frame", optarg, 1,
                                                                TB_APPLE_MAX_MSG_SIZE); break;
        case O_DEPTH: tun.recv_depth = (int) parse_num("--depth", optarg, 2, 4095); break;
        case O_WINDOW: window = (unsigned) parse_num("--window", optarg, 1, 4096); break;
        case O_PTO: tun.peer_timeout_ms = (uint32_t) parse_num("--peer-timeout", optarg, 1,
                                                               86400000); break;
        case O_RTO:
            tun.rto_min_us = (uint32_t) parse_num("--rto-min", optarg, 1, 10000000);
            rto_given = 1;
            break;
        case O_CSUM:
            tun.checksum = tb_checksum_mode_parse(optarg);
            if (tun.checksum < 0) {
                die("--checksum: full or header, not '%s'", optarg);
            }
            break;
        case O_SEED: A.cfg.seed = parse_num("--seed", optarg, 0, ~0ul); break;
        case O_TOTAL: A.cfg.total = parse_num("--total", optarg, 0, 1ul << 30) << 20; break;
        case O_MAXSIZE: A.cfg.max_size = (uint32_t) parse_num("--max-size", optarg, 0, MAX_MSG);
            break;
        case O_SIZE: A.cfg.size = (uint32_t) parse_num("--size", optarg, 0, MAX_MSG); break;
        case O_ITERS: A.cfg.iters = parse_num("--iters", optarg, 1, 100000000); break;
        case O_FAULT: fault_file = optarg; break;
        case O_CTO: connect_timeout_ms = parse_num("--connect-timeout", optarg, 1, 3600000); break;
        case O_VERBOSE: level = TB_LOG_DEBUG; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (A.listener == !!connect_to) {
        usage(stderr);
        die("give exactly one of --listen and --connect IP:PORT");
    }
    if (connect_to) {
        const char *colon = strrchr(connect_to, ':');
        if (optind != argc - 1) {
            usage(stderr);
            die("--connect needs a MODE: stream, lat, bw or wait");
        }
        for (unsigned m = MODE_STREAM; m <= MODE_WAIT; m++) {
            if (strcmp(argv[optind], mode_names[m]) == 0) {
                A.cfg.mode = m;
            }
        }
        if (A.cfg.mode == MODE_NONE) {
            die("unknown mode '%s': stream, lat, bw or wait", argv[optind]);
        }
        if (!colon || colon - connect_to >= (long) sizeof(ip)) {
            die("--connect: IP:PORT, not '%s'", connect_to);
        }
        memcpy(ip, connect_to, (size_t) (colon - connect_to));
        ip[colon - connect_to] = 0;
        port = (unsigned) parse_num("--connect port", colon + 1, 1, 65535);
    } else if (optind != argc) {
        die("the listener takes no MODE: the connecting side chooses it");
    }
    tb_log_set_sink(NULL, NULL, level);
    if (tb_tunables_validate(&tun, "--", err, sizeof(err)) != 0) {
        die("%s", err);
    }

    /* Channel parameters from the tunables. */
    tb_channel_params_default(&chan_params);
    chan_params.nlanes = (unsigned) tun.lanes;
    chan_params.frame_size[0] = tun.small_frame_size;
    chan_params.frame_size[1] = tun.bulk_frame_size;
    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        unsigned depth = (unsigned) tun.recv_depth;
        unsigned cap = 4095 / (chan_params.frame_size[l] / TB_WIRE_HW_FRAME);
        if (depth > cap) {
            depth = cap;
        }
        chan_params.recv_depth[l] = depth;
        chan_params.send_window[l] = window ? window : depth;
    }
    chan_params.recv_depth_max = TB_APPLE_MAX_RECV_DEPTH;
    chan_params.payload_crc = tun.checksum == TB_CHECKSUM_FULL;
    chan_params.peer_timeout_ns = (uint64_t) tun.peer_timeout_ms * 1000000ull;
    /* The channel's floor, unless asked: the timeout adapts to the measured
     * round trip, so the tunables' older, longer default is not needed. */
    if (rto_given) {
        chan_params.rto_min_ns = (uint64_t) tun.rto_min_us * 1000ull;
        if (chan_params.rto_max_ns < chan_params.rto_min_ns) {
            chan_params.rto_max_ns = chan_params.rto_min_ns;
        }
    }
    if (chan_params.keepalive_ns * 2 > chan_params.peer_timeout_ns) {
        chan_params.keepalive_ns = chan_params.peer_timeout_ns / 4;
    }
    chan_params.max_msg_size = MAX_MSG;

    if (tb_device_list_open(&list, NULL, NULL, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    dev = pick_device(&list, device, ip[0] ? ip : NULL);
    tb_domain_params_default(&dp);
    dp.qp_budget = tun.qps_per_device;
    if (tb_domain_create(&list.verbs, dev, &dp, &A.domain) != 0) {
        die("cannot open device %s (see above)", dev->name);
    }

    {
        char self_ip[INET_ADDRSTRLEN];
        const char *id = A.listener ? LISTENER_ID : CONNECTOR_ID;
        tb_cm_params_t cp = {
            .bind_ip = self_ip,
            .port = (uint16_t) (A.listener ? port : 0),
            .id = id,
            .id_len = strlen(id),
            .secret = chan_secret,
            .timeout_ns = 10000000000ull,
            .max_sessions = 8,
        };
        tb_cm_callbacks_t cb = {
            .peer_secret = cm_peer_secret, .accept = cm_accept, .done = cm_done};
        inet_ntop(AF_INET, &dev->ipv4, self_ip, sizeof(self_ip));
        chan_secret_init();
        if (tb_cm_create(&cp, &cb, &A.cm) != 0) {
            die("cannot listen on %s (see above)", self_ip);
        }
        if (A.listener) {
            printf("listening on %s:%u device %s\n", self_ip, (unsigned) tb_cm_port(A.cm),
                   dev->name);
        }
    }
    if (!A.listener) {
        tb_channel_callbacks_t cb = {
            .recv = on_recv, .send_done = on_send_done, .error = on_error,
        };
        tb_wire_addr_t local;
        uint64_t deadline = now_ns() + connect_timeout_ms * 1000000ull;

        if (tb_conn_create(A.domain, &chan_params, &cb, &A.conn) != 0) {
            die("cannot create a connection on %s (see above)", dev->name);
        }
        A.ch = tb_conn_channel(A.conn);
        tb_conn_local_addr(A.conn, &local);
        for (;;) {
            A.setup_error = 0;
            if (tb_cm_connect(A.cm, ip, (uint16_t) port, LISTENER_ID, strlen(LISTENER_ID),
                              &local, A.conn, now_ns())
                != 0) {
                die("cannot start connecting to %s:%u", ip, port);
            }
            while (!A.connected && !A.setup_error) {
                progress();
            }
            if (A.setup_error != -1 || now_ns() >= deadline) {
                break;
            }
            usleep(200000);
        }
        if (!A.connected) {
            die("no connection to %s:%u", ip, port);
        }
        A.tx_seed = A.cfg.seed;
        A.rx_seed = A.cfg.seed + 1;
        A.config_seen = 1;
        if (tb_channel_send(A.ch, TAG_CONFIG, &A.cfg, sizeof(A.cfg), NULL) != 0) {
            die("cannot send the run configuration");
        }
    } else {
        uint64_t deadline = now_ns() + connect_timeout_ms * 1000000ull;
        while (!A.connected) {
            progress();
            if (A.setup_error > 0) {
                die("connection setup failed (see above)");
            }
            if (now_ns() >= deadline) {
                die("nobody connected within %llu ms", (unsigned long long) connect_timeout_ms);
            }
        }
    }
    while (!tb_channel_is_connected(A.ch) && !A.chan_status) {
        progress();
    }
    if (A.chan_status) {
        die("the channel did not come up: %s", A.chan_why);
    }
    fprintf(stderr, "tbrdma_chan: connected over %s (%u lanes, frames %u/%u, depth %u/%u)\n",
            dev->name, chan_params.nlanes, chan_params.frame_size[0], chan_params.frame_size[1],
            chan_params.recv_depth[0], chan_params.recv_depth[1]);

    if (A.listener) {
        rc = serve(fault_file);
    } else {
        switch (A.cfg.mode) {
        case MODE_STREAM: rc = run_stream(); break;
        case MODE_LAT: rc = run_lat_client(); break;
        case MODE_BW: rc = run_bw_client(); break;
        default: rc = run_wait(fault_file); break;
        }
    }
    print_counters(A.listener ? "listener" : "connector");
    if (!A.chan_status) {
        uint64_t end = now_ns() + 50000000ull;
        tb_channel_close(A.ch);
        while (now_ns() < end) {
            progress();
        }
    }
    tb_cm_destroy(A.cm);
    tb_conn_destroy(A.conn);
    tb_domain_destroy(A.domain);
    tb_device_list_close(&list);
    return rc;
}
