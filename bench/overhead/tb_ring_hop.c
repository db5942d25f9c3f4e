/*
 * What the host engine adds to a message's latency, measured natively: the
 * two shared-memory hops (sending rank -> its engine, far engine -> receiving
 * rank) that the direct path does not take.  Everything else on the engine
 * path (the channel, the post, the poll) the direct path pays as well, in
 * the rank instead of the engine.
 *
 * A "rank" thread and an "engine" thread, pinned to two cores, ping-pong
 * 8 B records over tbrdma's own rings (tb_shm_ring) in one shared mapping:
 * the rank commits a SEND record, the engine consumes it and commits a RECV
 * record back, the rank consumes that.  One round trip is one rank -> engine
 * hop and one engine -> rank hop: the engine path's added one-way latency.
 * With --ranks K the engine also watches K - 1 idle ranks' rings in each
 * pass, as an engine serving K ranks per host does.
 *
 * Prints, for each K, "hop_rtt_ns_K <median ns per round trip>",
 * "line_rtt_ns_K <ns>": the floor, one cache line's round trip between the
 * same two cores, measured in each batch just before the hops, and
 * "hop_ratio_K": the median of the batches' ratios of the two.  Also
 * "hop_cpu_ns_per_record <ns>": the rings' own CPU cost per record, written
 * and read on one thread; "hop_wake_rtt_ns <median ns>": a
 * round trip that finds the engine asleep (it set its ring's waiting flag and
 * blocks in poll() on a pipe, as the engine does on its socket after its
 * spin), so the rank's commit rings a doorbell that wakes it: what the first
 * message after idle adds on the sending host.  "hop_wake_busy_rtt_ns": the
 * same with the engine's core kept busy by a thread of the lowest priority
 * (SCHED_IDLE), which the woken engine preempts: the wake-up without the
 * core's own return from idle (in a virtual machine, a halted vCPU's).
 *
 *   tb_ring_hop [--trips N] [--ranks K]...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tb_shm_ring.h"

#define RING_SIZE (1u << 20)
#define BATCHES 9
#define MAX_RANKS 64

typedef struct seg {
    void *base;
    tb_shm_ring_t rank_tx, rank_rx; /* the rank's views: it produces ring 0, consumes ring 1 */
    tb_shm_ring_t eng_rx, eng_tx;   /* the engine's views of the same rings */
} seg_t;

typedef struct bench {
    seg_t segs[MAX_RANKS];
    unsigned nranks;
    atomic_int stop;
    int engine_failed;
} bench_t;

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static void pin(unsigned cpu)
{
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void) pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
#else
    (void) cpu;
#endif
}

/* -1 when the ring broke, else whether the commit asked for a doorbell. */
static int send_record(tb_shm_ring_t *r, uint8_t type, const void *payload, size_t len)
{
    tb_wire_erec_t *rec;
    while (NULL == (rec = tb_shm_ring_reserve(r, len))) {
        if (r->broken) {
            return -1;
        }
    }
    rec->type = type;
    rec->tag = 1;
    rec->link = 0;
    rec->vpid = 0;
    rec->pid = 0;
    memcpy(rec + 1, payload, len);
    return tb_shm_ring_commit(r) ? 1 : 0;
}

/* Each pass looks at every rank's ring once, as the engine's loop does. */
static void *engine_main(void *arg)
{
    bench_t *b = arg;
    pin(1);
    while (!atomic_load_explicit(&b->stop, memory_order_relaxed)) {
        for (unsigned i = 0; i < b->nranks; i++) {
            seg_t *s = &b->segs[i];
            tb_wire_erec_t hdr;
            uint64_t end;
            const void *p;
            if (!tb_shm_ring_ready(&s->eng_rx)
                || NULL == (p = tb_shm_ring_next(&s->eng_rx, &hdr, &end))) {
                continue;
            }
            if (send_record(&s->eng_tx, TB_EREC_RECV, p, hdr.len) < 0) {
                b->engine_failed = 1;
                return NULL;
            }
            tb_shm_ring_release_to(&s->eng_rx, end);
        }
    }
    return NULL;
}

static int trip(seg_t *s, uint64_t *payload)
{
    tb_wire_erec_t hdr;
    uint64_t end;
    const void *p;
    if (send_record(&s->rank_tx, TB_EREC_SEND, payload, sizeof(*payload)) < 0) {
        return -1;
    }
    while (NULL == (p = tb_shm_ring_next(&s->rank_rx, &hdr, &end))) {
        if (s->rank_rx.broken) {
            return -1;
        }
    }
    memcpy(payload, p, sizeof(*payload));
    tb_shm_ring_release_to(&s->rank_rx, end);
    (*payload)++;
    return 0;
}

/* The rings' own CPU cost, with no other core involved: one record written
 * and read back on one thread (reserve, copy, commit, next, release). */
static int record_cost(unsigned long n)
{
    size_t seglen = tb_shm_ring_segment_size(RING_SIZE);
    void *base = mmap(NULL, seglen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    tb_shm_ring_t tx, rx;
    uint64_t payload = 0, t0;
    int rc = -1;

    if (MAP_FAILED == base) {
        fprintf(stderr, "tb_ring_hop: mmap %zu bytes: %s\n", seglen, strerror(errno));
        return -1;
    }
    tb_shm_ring_attach(&tx, base, RING_SIZE, 0, true);
    tb_shm_ring_attach(&rx, base, RING_SIZE, 0, false);
    t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (unsigned long i = 0; i < n; i++) {
        tb_wire_erec_t hdr;
        uint64_t end;
        const void *p;
        if (send_record(&tx, TB_EREC_SEND, &payload, sizeof(payload)) < 0 ||
            NULL == (p = tb_shm_ring_next(&rx, &hdr, &end))) {
            fprintf(stderr, "tb_ring_hop: a ring broke its rules\n");
            goto out;
        }
        memcpy(&payload, p, sizeof(payload));
        payload++;
        tb_shm_ring_release_to(&rx, end);
    }
    printf("hop_cpu_ns_per_record %.1f\n", (double) (clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / (double) n);
    rc = 0;
out:
    munmap(base, seglen);
    return rc;
}

/* The floor: one cache line bounced between the same two cores (a counter
 * each side increments in turn), what any shared-memory hop costs here. */
static atomic_ulong pingpong_line __attribute__((aligned(64)));

static void *pong_main(void *arg)
{
    unsigned long n = *(unsigned long *) arg;
    pin(1);
    for (unsigned long i = 0; i < n; i++) {
        while (atomic_load_explicit(&pingpong_line, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&pingpong_line, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* ns per round trip of the line over n round trips, or 0 on failure. */
static double line_floor(unsigned long n)
{
    pthread_t th;
    uint64_t t0, t;

    atomic_store(&pingpong_line, 0);
    pin(0);
    if (0 != pthread_create(&th, NULL, pong_main, &n)) {
        fprintf(stderr, "tb_ring_hop: pthread_create failed\n");
        return 0;
    }
    t0 = clock_ns(CLOCK_MONOTONIC);
    for (unsigned long i = 0; i < n; i++) {
        atomic_store_explicit(&pingpong_line, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&pingpong_line, memory_order_acquire) != 2 * i + 2) {
        }
    }
    t = clock_ns(CLOCK_MONOTONIC) - t0;
    pthread_join(th, NULL);
    return (double) t / (double) n;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
    return x < y ? -1 : x > y;
}

/* The engine that sleeps whenever its ring is empty: waiting flag, one more
 * look, then poll() on the doorbell pipe. */
typedef struct sleeper {
    seg_t seg;
    int bell[2];
    atomic_int stop;
    int failed;
} sleeper_t;

/* Keeps core 1 from idling, at a priority any woken thread preempts. */
static void *burner_main(void *arg)
{
    atomic_int *stop = arg;
#ifdef SCHED_IDLE
    struct sched_param sp = {0};
    (void) pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
#endif
    pin(1);
    while (!atomic_load_explicit(stop, memory_order_relaxed)) {
    }
    return NULL;
}

static void *sleepy_engine_main(void *arg)
{
    sleeper_t *z = arg;
    pin(1);
    while (!atomic_load_explicit(&z->stop, memory_order_relaxed)) {
        tb_wire_erec_t hdr;
        uint64_t end;
        const void *p = tb_shm_ring_next(&z->seg.eng_rx, &hdr, &end);
        if (NULL == p) {
            tb_shm_ring_set_waiting(&z->seg.eng_rx, true);
            if (!tb_shm_ring_readable(&z->seg.eng_rx)) {
                struct pollfd pfd = {.fd = z->bell[0], .events = POLLIN};
                char b[64];
                if (poll(&pfd, 1, 100) > 0) {
                    (void) read(z->bell[0], b, sizeof(b));
                }
            }
            tb_shm_ring_set_waiting(&z->seg.eng_rx, false);
            continue;
        }
        if (send_record(&z->seg.eng_tx, TB_EREC_RECV, p, hdr.len) < 0) {
            z->failed = 1;
            return NULL;
        }
        tb_shm_ring_release_to(&z->seg.eng_rx, end);
    }
    return NULL;
}

static int wake_cost(unsigned n, bool busy)
{
    size_t seglen = tb_shm_ring_segment_size(RING_SIZE);
    sleeper_t z;
    uint64_t *rtt = calloc(n, sizeof(*rtt)), payload = 0;
    pthread_t engine, burner;
    atomic_int burning = 0;
    int rc = -1;

    memset(&z, 0, sizeof(z));
    z.seg.base = mmap(NULL, seglen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (NULL == rtt || MAP_FAILED == z.seg.base || 0 != pipe(z.bell)) {
        fprintf(stderr, "tb_ring_hop: no memory or pipe for the wake-up test\n");
        goto out;
    }
    tb_shm_ring_attach(&z.seg.rank_tx, z.seg.base, RING_SIZE, 0, true);
    tb_shm_ring_attach(&z.seg.rank_rx, z.seg.base, RING_SIZE, 1, true);
    tb_shm_ring_attach(&z.seg.eng_rx, z.seg.base, RING_SIZE, 0, false);
    tb_shm_ring_attach(&z.seg.eng_tx, z.seg.base, RING_SIZE, 1, false);
    tb_shm_ring_consumer_spins(&z.seg.eng_tx);
    pin(0);
    if (0 != pthread_create(&engine, NULL, sleepy_engine_main, &z)) {
        fprintf(stderr, "tb_ring_hop: pthread_create failed\n");
        goto out;
    }
    if (busy && 0 != pthread_create(&burner, NULL, burner_main, &burning)) {
        busy = false;
    }
    for (unsigned i = 0; i < n; i++) {
        struct timespec idle = {0, 2000000}; /* long enough for the engine to be asleep */
        tb_wire_erec_t hdr;
        uint64_t t0, end;
        const void *p;
        int bell;
        nanosleep(&idle, NULL);
        t0 = clock_ns(CLOCK_MONOTONIC);
        bell = send_record(&z.seg.rank_tx, TB_EREC_SEND, &payload, sizeof(payload));
        if (bell < 0 || (bell > 0 && 1 != write(z.bell[1], "", 1))) {
            goto stop;
        }
        while (NULL == (p = tb_shm_ring_next(&z.seg.rank_rx, &hdr, &end))) {
            if (z.seg.rank_rx.broken) {
                goto stop;
            }
        }
        tb_shm_ring_release_to(&z.seg.rank_rx, end);
        rtt[i] = clock_ns(CLOCK_MONOTONIC) - t0;
        payload++;
    }
    qsort(rtt, n, sizeof(*rtt), cmp_u64);
    printf("%s %" PRIu64 "\n", busy ? "hop_wake_busy_rtt_ns" : "hop_wake_rtt_ns", rtt[n / 2]);
    rc = 0;
stop:
    atomic_store(&z.stop, 1);
    pthread_join(engine, NULL);
    if (busy) {
        atomic_store(&burning, 1);
        pthread_join(burner, NULL);
    }
    if (0 != rc || z.failed) {
        fprintf(stderr, "tb_ring_hop: the wake-up test failed\n");
        rc = -1;
    }
out:
    if (MAP_FAILED != z.seg.base && NULL != z.seg.base) {
        munmap(z.seg.base, seglen);
    }
    if (z.bell[0] > 0) {
        close(z.bell[0]);
        close(z.bell[1]);
    }
    free(rtt);
    return rc;
}

/* One batch of n round trips through a fresh engine thread: ns per round
 * trip, or 0 when a ring broke. */
static double hop_batch(bench_t *b, unsigned long n, uint64_t *payload)
{
    pthread_t engine;
    uint64_t t0, t = 0;
    bool ok = true;

    atomic_store(&b->stop, 0);
    pin(0);
    if (0 != pthread_create(&engine, NULL, engine_main, b)) {
        fprintf(stderr, "tb_ring_hop: pthread_create failed\n");
        return 0;
    }
    for (unsigned long i = 0; ok && i < n / 10; i++) { /* warm-up */
        ok = 0 == trip(&b->segs[0], payload);
    }
    t0 = clock_ns(CLOCK_MONOTONIC);
    for (unsigned long i = 0; ok && i < n; i++) {
        ok = 0 == trip(&b->segs[0], payload);
    }
    t = clock_ns(CLOCK_MONOTONIC) - t0;
    atomic_store(&b->stop, 1);
    pthread_join(engine, NULL);
    if (!ok || b->engine_failed) {
        fprintf(stderr, "tb_ring_hop: a ring broke its rules\n");
        return 0;
    }
    return (double) t / (double) n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

/* Each batch measures the floor and then the hops, so that their ratio is
 * taken at one moment: a virtual machine's two vCPUs may sit on cores that
 * share a cache or not, and the cost of a line between them changes
 * several-fold with that from one second to the next. */
static int run(unsigned nranks, unsigned long trips)
{
    size_t seglen = tb_shm_ring_segment_size(RING_SIZE);
    bench_t *b = calloc(1, sizeof(*b));
    double hop[BATCHES], line[BATCHES], ratio[BATCHES];
    uint64_t payload = 0;
    unsigned long n = trips / BATCHES;
    int rc = -1;

    if (NULL == b) {
        return -1;
    }
    b->nranks = nranks;
    for (unsigned i = 0; i < nranks; i++) {
        seg_t *s = &b->segs[i];
        s->base = mmap(NULL, seglen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (MAP_FAILED == s->base) {
            fprintf(stderr, "tb_ring_hop: mmap %zu bytes: %s\n", seglen, strerror(errno));
            s->base = NULL;
            goto out;
        }
        tb_shm_ring_attach(&s->rank_tx, s->base, RING_SIZE, 0, true);
        tb_shm_ring_attach(&s->rank_rx, s->base, RING_SIZE, 1, true);
        tb_shm_ring_attach(&s->eng_rx, s->base, RING_SIZE, 0, false);
        tb_shm_ring_attach(&s->eng_tx, s->base, RING_SIZE, 1, false);
        /* As the engine does: a rank never sleeps on its ring. */
        tb_shm_ring_consumer_spins(&s->eng_tx);
    }
    for (unsigned k = 0; k < BATCHES; k++) {
        line[k] = line_floor(n);
        hop[k] = hop_batch(b, n, &payload);
        if (0 == line[k] || 0 == hop[k]) {
            goto out;
        }
        ratio[k] = hop[k] / line[k];
    }
    qsort(hop, BATCHES, sizeof(hop[0]), cmp_double);
    qsort(line, BATCHES, sizeof(line[0]), cmp_double);
    qsort(ratio, BATCHES, sizeof(ratio[0]), cmp_double);
    printf("hop_rtt_ns_%u %.1f\n", nranks, hop[BATCHES / 2]);
    printf("line_rtt_ns_%u %.1f\n", nranks, line[BATCHES / 2]);
    printf("hop_ratio_%u %.2f\n", nranks, ratio[BATCHES / 2]);
    rc = 0;
out:
    for (unsigned i = 0; i < nranks; i++) {
        if (NULL != b->segs[i].base) {
            munmap(b->segs[i].base, seglen);
        }
    }
    free(b);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned long trips = 900000;
    unsigned ranks[8], nr = 0;

    for (int i = 1; i < argc; i++) {
        if (0 == strcmp(argv[i], "--trips") && i + 1 < argc) {
            trips = strtoul(argv[++i], NULL, 10);
        } else if (0 == strcmp(argv[i], "--ranks") && i + 1 < argc && nr < 8) {
            ranks[nr++] = (unsigned) strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: tb_ring_hop [--trips N] [--ranks K]...\n");
            return 2;
        }
    }
    if (0 == nr) {
        ranks[nr++] = 1;
    }
    if (trips < 10 * BATCHES) {
        fprintf(stderr, "tb_ring_hop: --trips must be at least %d\n", 10 * BATCHES);
        return 2;
    }
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        fprintf(stderr, "tb_ring_hop: needs two cores (the rank and the engine each spin on one)\n");
        return 2;
    }
    if (0 != record_cost(trips) || 0 != wake_cost(200, false)
        || 0 != wake_cost(200, true)) {
        return 1;
    }
    for (unsigned i = 0; i < nr; i++) {
        if (ranks[i] < 1 || ranks[i] > MAX_RANKS) {
            fprintf(stderr, "tb_ring_hop: --ranks takes 1..%d\n", MAX_RANKS);
            return 2;
        }
        if (0 != run(ranks[i], trips)) {
            return 1;
        }
    }
    return 0;
}
