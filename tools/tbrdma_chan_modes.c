/*
 * tbrdma_chan's modes (see tbrdma_chan.c): the seeded message series, what
 * the channel delivers, and the stream, lat, bw and wait runs.
 */
#include "tb_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tbrdma_chan.h"

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

void chan_on_recv(void *ctx, uint8_t tag, const void *data, size_t len)
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

void chan_on_send_done(void *ctx, void *cookie, int status)
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

void chan_on_error(void *ctx, int status, const char *why)
{
    (void) ctx;
    if (A.chan_status == 0) {
        A.chan_status = status;
        A.fail_wall = wall_now();
        snprintf(A.chan_why, sizeof(A.chan_why), "%s", why);
    }
}

/* ------------------------------------------------------------------ */
/* Modes                                                               */

void chan_print_counters(const char *who)
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

int chan_run_stream(void)
{
    uint64_t start = now_ns(), linger_until = 0;
    int done = 0;

    while (!A.chan_status) {
        chan_progress();
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

int chan_run_lat_client(void)
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
            chan_progress();
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

int chan_run_bw_client(void)
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
        chan_progress();
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

int chan_run_wait(const char *fault_file)
{
    printf("wait: connected, idle until the channel fails\n");
    fflush(stdout);
    while (!A.chan_status) {
        chan_progress();
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
int chan_serve(const char *fault_file)
{
    while (!A.config_seen && !A.chan_status) {
        chan_progress();
    }
    if (A.chan_status) {
        printf("listener: channel failed before the run started: %s\n", A.chan_why);
        return 1;
    }
    printf("listener: mode %s\n", A.cfg.mode < MODE_COUNT ? mode_names[A.cfg.mode] : "?");
    fflush(stdout);
    switch (A.cfg.mode) {
    case MODE_STREAM:
        return chan_run_stream();
    case MODE_WAIT:
        return chan_run_wait(fault_file);
    case MODE_LAT:
    case MODE_BW:
        while (!A.chan_status) {
            chan_progress();
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

