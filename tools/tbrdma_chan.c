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

#include "tbrdma_chan.h"

#include "tb_channel.h"
#include "tb_cm.h"
#include "tb_device.h"
#include "tb_domain.h"
#include "tb_log.h"
#include "tb_sha256.h"
#include "tb_tunables.h"

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

app_t A;

const char *const mode_names[MODE_COUNT] = { "none", "stream", "lat", "bw", "wait" };

__attribute__((format(printf, 1, 2))) void die(const char *fmt, ...)
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
        .recv = chan_on_recv, .send_done = chan_on_send_done, .error = chan_on_error,
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

void chan_progress(void)
{
    if (A.cm) {
        tb_cm_progress(A.cm, now_ns());
    }
    /* Read the clock again: the channel times acks by it. */
    tb_domain_progress(A.domain, now_ns());
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
        for (unsigned m = MODE_STREAM; m < MODE_COUNT; m++) {
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
            .recv = chan_on_recv, .send_done = chan_on_send_done, .error = chan_on_error,
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
                chan_progress();
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
            chan_progress();
            if (A.setup_error > 0) {
                die("connection setup failed (see above)");
            }
            if (now_ns() >= deadline) {
                die("nobody connected within %llu ms", (unsigned long long) connect_timeout_ms);
            }
        }
    }
    while (!tb_channel_is_connected(A.ch) && !A.chan_status) {
        chan_progress();
    }
    if (A.chan_status) {
        die("the channel did not come up: %s", A.chan_why);
    }
    fprintf(stderr, "tbrdma_chan: connected over %s (%u lanes, frames %u/%u, depth %u/%u)\n",
            dev->name, chan_params.nlanes, chan_params.frame_size[0], chan_params.frame_size[1],
            chan_params.recv_depth[0], chan_params.recv_depth[1]);

    if (A.listener) {
        rc = chan_serve(fault_file);
    } else {
        switch (A.cfg.mode) {
        case MODE_STREAM: rc = chan_run_stream(); break;
        case MODE_LAT: rc = chan_run_lat_client(); break;
        case MODE_BW: rc = chan_run_bw_client(); break;
        default: rc = chan_run_wait(fault_file); break;
        }
    }
    chan_print_counters(A.listener ? "listener" : "connector");
    if (!A.chan_status) {
        uint64_t end = now_ns() + 50000000ull;
        tb_channel_close(A.ch);
        while (now_ns() < end) {
            chan_progress();
        }
    }
    tb_cm_destroy(A.cm);
    tb_conn_destroy(A.conn);
    tb_domain_destroy(A.domain);
    tb_device_list_close(&list);
    return rc;
}
