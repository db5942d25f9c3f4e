/*
 * tbrdma-engine: the host engine (tb_engine.h).  Started by the first
 * rank of a job on a host (engine/client/tb_eclient.c), never by hand; its options
 * are the BTL's parameters, passed on by that rank.
 */
#include "tb_config.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_SYS_PRCTL_H
#include <sys/prctl.h>
#endif

#include "tb_engine.h"
#include "tb_log.h"

static char host[256];

/* Each line with the wall-clock time: a job's engines and ranks log to
 * different places, and a fault is followed across them by time. */
static void log_to_stderr(tb_log_level_t level, const char *msg, void *ctx)
{
    struct timespec ts;
    struct tm tm;

    (void) ctx;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld tbrdma-engine on %s (pid %d)%s: %s\n", tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, host, (int) getpid(),
            level <= TB_LOG_ERROR ? " error" : "", msg);
}

static int parse_u64(const char *name, const char *arg, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(arg, &end, 10);
    if (0 != errno || end == arg || '\0' != *end || v > max) {
        fprintf(stderr, "tbrdma-engine: --%s %s: not a number up to %llu\n", name, arg,
                (unsigned long long) max);
        return -1;
    }
    *out = v;
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: tbrdma-engine --dir DIR [--dir-fd FD] [--verbs-library PATH]\n"
            "         [--if-include PATTERNS] [--if-exclude PATTERNS] [--lanes 1|2]\n"
            "         [--small-frame-size BYTES]\n"
            "         [--bulk-frame-size BYTES] [--recv-depth N] [--peer-timeout-ms MS]\n"
            "         [--rto-min-us US] [--checksum full|header] [--credit-window BYTES]\n"
            "         [--spin-us US] [--events 0|1] [--yield 0|1]\n"
            "         [--verbose 0..4]\n"
            "The host engine of tbrdma: started by the first rank of an MPI job on a host.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, NULL, 'd'},
        {"dir-fd", required_argument, NULL, 'D'},
        {"verbs-library", required_argument, NULL, 'L'},
        {"if-include", required_argument, NULL, 'i'},
        {"if-exclude", required_argument, NULL, 'x'},
        {"lanes", required_argument, NULL, 'l'},
        {"small-frame-size", required_argument, NULL, 's'},
        {"bulk-frame-size", required_argument, NULL, 'b'},
        {"recv-depth", required_argument, NULL, 'r'},
        {"peer-timeout-ms", required_argument, NULL, 'p'},
        {"rto-min-us", required_argument, NULL, 'o'},
        {"checksum", required_argument, NULL, 'c'},
        {"credit-window", required_argument, NULL, 'w'},
        {"spin-us", required_argument, NULL, 'S'},
        {"events", required_argument, NULL, 'E'},
        {"yield", required_argument, NULL, 'Y'},
        {"verbose", required_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    tb_engine_params_t p;
    tb_engine_t *e;
    uint64_t v, verbose = TB_LOG_WARN;
    char err[512];
    int c, rc;

    gethostname(host, sizeof(host) - 1);
    tb_engine_params_default(&p);
    while (-1 != (c = getopt_long(argc, argv, "", opts, NULL))) {
        switch (c) {
        case 'd': p.dir = optarg; break;
        case 'D':
            if (parse_u64("dir-fd", optarg, INT32_MAX, &v)) return 2;
            p.dir_fd = (int) v;
            break;
        case 'L': p.tunables.verbs_library = optarg; break;
        case 'i': p.tunables.if_include = optarg; break;
        case 'x': p.tunables.if_exclude = optarg; break;
        case 'l':
            if (parse_u64("lanes", optarg, 2, &v)) return 2;
            p.tunables.lanes = (int) v;
            break;
        case 's':
            if (parse_u64("small-frame-size", optarg, UINT32_MAX, &v)) return 2;
            p.tunables.small_frame_size = (uint32_t) v;
            break;
        case 'b':
            if (parse_u64("bulk-frame-size", optarg, UINT32_MAX, &v)) return 2;
            p.tunables.bulk_frame_size = (uint32_t) v;
            break;
        case 'r':
            if (parse_u64("recv-depth", optarg, 1024, &v)) return 2;
            p.tunables.recv_depth = (int) v;
            break;
        case 'p':
            if (parse_u64("peer-timeout-ms", optarg, UINT32_MAX, &v)) return 2;
            p.tunables.peer_timeout_ms = (uint32_t) v;
            break;
        case 'o':
            if (parse_u64("rto-min-us", optarg, UINT32_MAX, &v)) return 2;
            p.tunables.rto_min_us = (uint32_t) v;
            break;
        case 'c':
            rc = tb_checksum_mode_parse(optarg);
            if (rc < 0) {
                fprintf(stderr, "tbrdma-engine: --checksum %s: full or header\n", optarg);
                return 2;
            }
            p.tunables.checksum = rc;
            break;
        case 'w':
            if (parse_u64("credit-window", optarg, 1u << 30, &v)) return 2;
            p.credit_window = v;
            break;
        case 'E':
            if (parse_u64("events", optarg, 1, &v)) return 2;
            p.events = (int) v;
            break;
        case 'Y':
            if (parse_u64("yield", optarg, 1, &v)) return 2;
            p.yield = (int) v;
            break;
        case 'S':
            if (parse_u64("spin-us", optarg, 1000000, &v)) return 2;
            p.spin_ns = v * 1000u;
            break;
        case 'v':
            if (parse_u64("verbose", optarg, TB_LOG_TRACE, &verbose)) return 2;
            break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (NULL == p.dir || optind != argc) {
        usage();
        return 2;
    }
    tb_log_set_sink(log_to_stderr, NULL, (tb_log_level_t) verbose);
    if (0 != tb_tunables_validate(&p.tunables, "btl_tbrdma_", err, sizeof(err))) {
        TB_ERROR("%s", err);
        return 2;
    }
    if (p.credit_window < TB_ENGINE_MAX_MSG) {
        TB_ERROR("--credit-window %llu: at least %u (one message)",
                 (unsigned long long) p.credit_window, (unsigned) TB_ENGINE_MAX_MSG);
        return 2;
    }
    /* A rank that went away must not kill the engine through its pipe. */
    signal(SIGPIPE, SIG_IGN);
#ifdef PR_SET_THP_DISABLE
    /* No transparent huge pages for the engine: khugepaged collapses them
     * holding the process's memory-map lock, at the lowest priority, so on a
     * host whose cores are all busy (a rank per core) every allocation and
     * page fault of the engine waited seconds for it, and the peer engines
     * gave up on a loop that polled nothing.  Its buffers gain nothing from
     * huge pages. */
    if (0 != prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)) {
        TB_INFO("prctl(PR_SET_THP_DISABLE) failed: %s; the engine may stall while the kernel "
                "collapses its memory into huge pages",
                strerror(errno));
    }
#endif
    if (0 != tb_engine_create(&p, &e, err, sizeof(err))) {
        TB_ERROR("%s", err);
        return 1;
    }
    rc = tb_engine_run(e);
    tb_engine_destroy(e);
    return rc;
}
