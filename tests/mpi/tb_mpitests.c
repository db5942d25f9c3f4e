/*
 * tb_mpitests: MPI correctness tests for a transport, every byte verified.
 *
 * usage: tb_mpitests [-m MAX_BYTES] [-t SECONDS] [-c SECONDS] [TEST...]
 * TESTs: pingpong storm manytoone anysource noncontig coll osc atomics hold
 * compute stalled steady (default: all but osc, atomics, hold, compute, stalled and
 * steady); steady: see test_steady.  compute: rank 1
 * computes for -c SECONDS (default 75) between two verified ring exchanges.
 * stalled (4 ranks or more, placed round-robin on 2 hosts): rank 1 stops
 * reading for 20 s while rank 0 floods it; ranks 2 and 3 must finish their
 * own exchange before rank 1 reads again.  hold exchanges 64 KiB messages between ranks 0 and 1
 * for -t SECONDS (default 120), printing "hold: exchanging" once they flow: a
 * job for failure tests to break.  Rank 0 prints "ok: NAME" or "FAIL: NAME:
 * why" per test and a closing "N passed, N failed"; the exit status is
 * non-zero on any failure.
 */
#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank, nranks;
static size_t max_bytes = 4u << 20;
static double hold_seconds = 120;
static double compute_seconds = 75;
static char why[256];

static unsigned char pattern(size_t i, unsigned seed)
{
    return (unsigned char) ((i * 2654435761u + seed * 40503u) >> 11);
}

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    size_t i;
    for (i = 0; i < len; ++i) {
        buf[i] = pattern(i, seed);
    }
}

static int verify(const unsigned char *buf, size_t len, unsigned seed, const char *what)
{
    size_t i;
    for (i = 0; i < len; ++i) {
        if (buf[i] != pattern(i, seed)) {
            snprintf(why, sizeof(why), "%s: byte %zu of %zu differs", what, i, len);
            return 1;
        }
    }
    return 0;
}

/* Sizes 0, 1, then x4 up to max_bytes, plus sizes around frame edges. */
static size_t next_size(size_t s)
{
    return s == 0 ? 1 : s * 4;
}

static int test_pingpong(void)
{
    static const size_t edges[] = {4015, 4016, 4017, 4096, 65455, 65456, 65457, 65536};
    unsigned char *buf = malloc(max_bytes ? max_bytes : 1);
    int bad = 0, peer = rank ^ 1;
    size_t s, e;

    if (peer >= nranks) {
        peer = MPI_PROC_NULL;
    }
    for (s = 0; s <= max_bytes && !bad; s = next_size(s)) {
        for (e = 0; e <= sizeof(edges) / sizeof(edges[0]) && !bad; ++e) {
            size_t len = e == 0 ? s : edges[e - 1];
            unsigned seed = (unsigned) (len * 7 + 1);
            if (e > 0 && (s != 1 || len > max_bytes)) {
                continue;
            }
            if (0 == rank % 2) {
                fill(buf, len, seed);
                MPI_Send(buf, (int) len, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                memset(buf, 0, len);
                MPI_Recv(buf, (int) len, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                bad = peer != MPI_PROC_NULL && verify(buf, len, seed + 1, "pong");
            } else {
                MPI_Recv(buf, (int) len, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                bad = verify(buf, len, seed, "ping");
                fill(buf, len, seed + 1);
                MPI_Send(buf, (int) len, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            }
        }
    }
    free(buf);
    return bad;
}

/* Every rank posts many receives from and sends to every other rank at once. */
static int test_storm(void)
{
    enum { PER_PEER = 16 };
    size_t len = max_bytes < 200000 ? max_bytes : 200000;
    int n = (nranks - 1) * PER_PEER, i, p, k = 0, bad = 0;
    MPI_Request *reqs = malloc(sizeof(*reqs) * 2 * (size_t) (n ? n : 1));
    unsigned char **rbufs = malloc(sizeof(*rbufs) * (size_t) (n ? n : 1));
    unsigned char **sbufs = malloc(sizeof(*sbufs) * (size_t) (n ? n : 1));

    for (p = 0; p < nranks; ++p) {
        if (p == rank) {
            continue;
        }
        for (i = 0; i < PER_PEER; ++i, ++k) {
            size_t l = (len * (size_t) (i + 1)) / PER_PEER;
            rbufs[k] = malloc(l + 1);
            sbufs[k] = malloc(l + 1);
            fill(sbufs[k], l, (unsigned) (rank * 1000 + p * 37 + i));
            MPI_Irecv(rbufs[k], (int) l, MPI_BYTE, p, 100 + i, MPI_COMM_WORLD, &reqs[2 * k]);
            MPI_Isend(sbufs[k], (int) l, MPI_BYTE, p, 100 + i, MPI_COMM_WORLD, &reqs[2 * k + 1]);
        }
    }
    MPI_Waitall(2 * n, reqs, MPI_STATUSES_IGNORE);
    for (p = 0, k = 0; p < nranks; ++p) {
        if (p == rank) {
            continue;
        }
        for (i = 0; i < PER_PEER; ++i, ++k) {
            size_t l = (len * (size_t) (i + 1)) / PER_PEER;
            bad = bad || verify(rbufs[k], l, (unsigned) (p * 1000 + rank * 37 + i), "storm");
            free(rbufs[k]);
            free(sbufs[k]);
        }
    }
    free(reqs);
    free(rbufs);
    free(sbufs);
    return bad;
}

/* All ranks send to rank 0, which receives from MPI_ANY_SOURCE and checks
 * that each sender's messages arrive complete and in order. */
static int test_manytoone(void)
{
    enum { MSGS = 50 };
    unsigned char buf[8192];
    int bad = 0, i;

    if (0 == rank) {
        int *next = calloc((size_t) nranks, sizeof(int));
        for (i = 0; i < MSGS * (nranks - 1) && !bad; ++i) {
            MPI_Status st;
            int count, src, seq;
            MPI_Recv(buf, sizeof(buf), MPI_BYTE, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_BYTE, &count);
            src = st.MPI_SOURCE;
            memcpy(&seq, buf, sizeof(seq));
            if (seq != next[src]) {
                snprintf(why, sizeof(why), "from rank %d: message %d came as number %d", src,
                         seq, next[src]);
                bad = 1;
            } else {
                bad = verify(buf + 4, (size_t) count - 4, (unsigned) (src * 100 + seq), "m2o");
            }
            next[src]++;
        }
        free(next);
    } else {
        for (i = 0; i < MSGS; ++i) {
            size_t len = 4 + (size_t) ((i * 977) % (sizeof(buf) - 4));
            memcpy(buf, &i, sizeof(i));
            fill(buf + 4, len - 4, (unsigned) (rank * 100 + i));
            MPI_Send(buf, (int) len, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
        }
    }
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return bad;
}

/* MPI_ANY_SOURCE with MPI_ANY_TAG and probes, in a ring. */
static int test_anysource(void)
{
    int right = (rank + 1) % nranks, bad = 0, i;
    double out[1000], in[1000];
    MPI_Status st;

    for (i = 0; i < 1000; ++i) {
        out[i] = rank * 1e6 + i;
    }
    MPI_Sendrecv(out, 1000, MPI_DOUBLE, right, rank, in, 1000, MPI_DOUBLE, MPI_ANY_SOURCE,
                 MPI_ANY_TAG, MPI_COMM_WORLD, &st);
    for (i = 0; i < 1000 && !bad; ++i) {
        if (in[i] != st.MPI_SOURCE * 1e6 + i || st.MPI_TAG != st.MPI_SOURCE) {
            snprintf(why, sizeof(why), "value %d from %d wrong", i, st.MPI_SOURCE);
            bad = 1;
        }
    }
    return bad;
}

/* A strided vector type: the transport sees packed, non-contiguous data. */
static int test_noncontig(void)
{
    enum { COUNT = 20000, STRIDE = 3 };
    int *sbuf = malloc(sizeof(int) * COUNT * STRIDE), *rbuf = malloc(sizeof(int) * COUNT);
    int peer = rank ^ 1, bad = 0, i;
    MPI_Datatype vec;

    MPI_Type_vector(COUNT, 1, STRIDE, MPI_INT, &vec);
    MPI_Type_commit(&vec);
    for (i = 0; i < COUNT * STRIDE; ++i) {
        sbuf[i] = rank * 7919 + i;
    }
    if (peer < nranks) {
        MPI_Sendrecv(sbuf, 1, vec, peer, 9, rbuf, COUNT, MPI_INT, peer, 9, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (i = 0; i < COUNT && !bad; ++i) {
            if (rbuf[i] != peer * 7919 + i * STRIDE) {
                snprintf(why, sizeof(why), "element %d is %d", i, rbuf[i]);
                bad = 1;
            }
        }
    }
    MPI_Type_free(&vec);
    free(sbuf);
    free(rbuf);
    return bad;
}

static int test_coll(void)
{
    size_t n = max_bytes / sizeof(int) < 262144 ? max_bytes / sizeof(int) : 262144;
    int *a = malloc(sizeof(int) * n * (size_t) nranks), *b = malloc(sizeof(int) * n * (size_t) nranks);
    size_t i, chunk = n / (size_t) nranks ? n / (size_t) nranks : 1;
    int bad = 0, r;

    MPI_Barrier(MPI_COMM_WORLD);
    for (i = 0; i < n; ++i) {
        a[i] = 0 == rank ? (int) (i * 31 + 5) : -1;
    }
    MPI_Bcast(a, (int) n, MPI_INT, 0, MPI_COMM_WORLD);
    for (i = 0; i < n && !bad; ++i) {
        if (a[i] != (int) (i * 31 + 5)) {
            snprintf(why, sizeof(why), "bcast element %zu", i);
            bad = 1;
        }
    }
    for (i = 0; i < n; ++i) {
        a[i] = rank + (int) i;
    }
    MPI_Allreduce(a, b, (int) n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (i = 0; i < n && !bad; ++i) {
        if (b[i] != nranks * (nranks - 1) / 2 + nranks * (int) i) {
            snprintf(why, sizeof(why), "allreduce element %zu is %d", i, b[i]);
            bad = 1;
        }
    }
    for (r = 0; r < nranks; ++r) {
        for (i = 0; i < chunk; ++i) {
            a[(size_t) r * chunk + i] = rank * 100000 + r * 1000 + (int) (i % 1000);
        }
    }
    MPI_Alltoall(a, (int) chunk, MPI_INT, b, (int) chunk, MPI_INT, MPI_COMM_WORLD);
    for (r = 0; r < nranks && !bad; ++r) {
        for (i = 0; i < chunk && !bad; ++i) {
            if (b[(size_t) r * chunk + i] != r * 100000 + rank * 1000 + (int) (i % 1000)) {
                snprintf(why, sizeof(why), "alltoall from %d element %zu", r, i);
                bad = 1;
            }
        }
    }
    for (i = 0; i < chunk; ++i) {
        a[i] = rank * 1000003 + (int) i;
    }
    MPI_Allgather(a, (int) chunk, MPI_INT, b, (int) chunk, MPI_INT, MPI_COMM_WORLD);
    for (r = 0; r < nranks && !bad; ++r) {
        for (i = 0; i < chunk && !bad; ++i) {
            if (b[(size_t) r * chunk + i] != r * 1000003 + (int) i) {
                snprintf(why, sizeof(why), "allgather from %d element %zu", r, i);
                bad = 1;
            }
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free(a);
    free(b);
    return bad;
}

/* One-sided: a window made with MPI_Win_create (so it goes through the
 * transport, not shared memory), fences, Put, Get and Accumulate. */
static int test_osc(void)
{
    enum { N = 4096 };
    long *win_buf = calloc(N * (size_t) nranks, sizeof(long)), *got = malloc(N * sizeof(long));
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks, bad = 0, i;
    long *mine = malloc(N * sizeof(long));
    MPI_Win win;

    MPI_Win_create(win_buf, (MPI_Aint) (N * (size_t) nranks * sizeof(long)), sizeof(long),
                   MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    for (i = 0; i < N; ++i) {
        mine[i] = rank * 1000000L + i;
    }
    MPI_Win_fence(0, win);
    MPI_Put(mine, N, MPI_LONG, right, (MPI_Aint) rank * N, N, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (i = 0; i < N && !bad; ++i) {
        if (win_buf[(size_t) left * N + i] != left * 1000000L + i) {
            snprintf(why, sizeof(why), "put: element %d from %d", i, left);
            bad = 1;
        }
    }
    MPI_Get(got, N, MPI_LONG, right, (MPI_Aint) rank * N, N, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (i = 0; i < N && !bad; ++i) {
        if (got[i] != rank * 1000000L + i) {
            snprintf(why, sizeof(why), "get: element %d", i);
            bad = 1;
        }
    }
    MPI_Accumulate(mine, N, MPI_LONG, right, (MPI_Aint) rank * N, N, MPI_LONG, MPI_SUM, win);
    MPI_Win_fence(0, win);
    for (i = 0; i < N && !bad; ++i) {
        if (win_buf[(size_t) left * N + i] != 2 * (left * 1000000L + i)) {
            snprintf(why, sizeof(why), "accumulate: element %d from %d", i, left);
            bad = 1;
        }
    }
    MPI_Win_free(&win);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free(win_buf);
    free(got);
    free(mine);
    return bad;
}

/* Many small one-sided operations to one target in one epoch: rank 0 puts
 * then gets 100000 separate longs at rank 1.  The requester keeps within the
 * window of unanswered requests its target holds answers for
 * (TB_WIRE_RMA_WINDOW); a correct program is never failed for it. */
static int test_manyrma(void)
{
    enum { N = 100000 };
    long *win_buf = calloc(N, sizeof(long)), *got = calloc(N, sizeof(long));
    long *mine = malloc(N * sizeof(long));
    int bad = 0, i;
    MPI_Win win;

    MPI_Win_create(win_buf, (MPI_Aint) (N * sizeof(long)), sizeof(long), MPI_INFO_NULL,
                   MPI_COMM_WORLD, &win);
    for (i = 0; i < N; ++i) {
        mine[i] = 7000000L + i;
    }
    MPI_Win_fence(0, win);
    if (0 == rank) {
        for (i = 0; i < N; ++i) {
            MPI_Put(&mine[i], 1, MPI_LONG, 1, i, 1, MPI_LONG, win);
        }
    }
    MPI_Win_fence(0, win);
    for (i = 0; 1 == rank && i < N && !bad; ++i) {
        if (win_buf[i] != 7000000L + i) {
            snprintf(why, sizeof(why), "put %d: %ld", i, win_buf[i]);
            bad = 1;
        }
    }
    if (0 == rank) {
        for (i = 0; i < N; ++i) {
            MPI_Get(&got[i], 1, MPI_LONG, 1, i, 1, MPI_LONG, win);
        }
    }
    MPI_Win_fence(0, win);
    for (i = 0; 0 == rank && i < N && !bad; ++i) {
        if (got[i] != 7000000L + i) {
            snprintf(why, sizeof(why), "get %d: %ld", i, got[i]);
            bad = 1;
        }
    }
    MPI_Win_free(&win);
    free(win_buf);
    free(got);
    free(mine);
    return bad;
}

/* Passive target: atomics (64- and 32-bit fetch-and-op, compare-and-swap),
 * a lock-protected read-modify-write, and every operation on this rank's
 * own memory too; osc/rdma runs these on its BTL's atomics, locks included. */
static int test_atomics(void)
{
    enum { K = 50, SLOTS = 8 };
    /* [0] fetch-and-op counter, [1] CAS slot, [2] lock-protected count,
     * [3] MPI_MAX, [4..] this rank's own (self) area; then 32-bit counter. */
    long *win_buf;
    long fetched, prev = -1, one = 1, minus = -1, me = rank, old, v, got;
    int *ctr32, one32 = 1, old32, bad = 0, i, won;
    MPI_Win win;

    MPI_Alloc_mem((MPI_Aint) (SLOTS * sizeof(long) + sizeof(int)), MPI_INFO_NULL, &win_buf);
    memset(win_buf, 0, SLOTS * sizeof(long) + sizeof(int));
    win_buf[1] = -1;
    ctr32 = (int *) (win_buf + SLOTS);
    MPI_Win_create(win_buf, (MPI_Aint) (SLOTS * sizeof(long) + sizeof(int)), 1, MPI_INFO_NULL,
                   MPI_COMM_WORLD, &win);
    MPI_Barrier(MPI_COMM_WORLD);

    MPI_Win_lock_all(0, win);
    for (i = 0; i < K && !bad; ++i) {
        MPI_Fetch_and_op(&one, &fetched, MPI_LONG, 0, 0, MPI_SUM, win);
        MPI_Win_flush(0, win);
        if (fetched <= prev || fetched >= (long) nranks * K) {
            snprintf(why, sizeof(why), "fetch-and-op %d fetched %ld after %ld", i, fetched, prev);
            bad = 1;
        }
        prev = fetched;
        MPI_Fetch_and_op(&one32, &old32, MPI_INT, nranks - 1, SLOTS * sizeof(long), MPI_SUM,
                         win);
    }
    MPI_Compare_and_swap(&me, &minus, &old, MPI_LONG, 0, sizeof(long), win);
    MPI_Win_flush(0, win);
    won = -1 == old;
    v = (long) rank * 7 - 3;
    MPI_Accumulate(&v, 1, MPI_LONG, 0, 3 * sizeof(long), 1, MPI_LONG, MPI_MAX, win);
    /* This rank's own memory, through the same window. */
    v = 1000L + rank;
    MPI_Put(&v, 1, MPI_LONG, rank, 4 * sizeof(long), 1, MPI_LONG, win);
    MPI_Win_flush(rank, win);
    MPI_Fetch_and_op(&one, &fetched, MPI_LONG, rank, 4 * sizeof(long), MPI_SUM, win);
    MPI_Win_flush(rank, win);
    MPI_Get(&got, 1, MPI_LONG, rank, 4 * sizeof(long), 1, MPI_LONG, win);
    MPI_Win_flush(rank, win);
    if (!bad && (fetched != 1000L + rank || got != 1001L + rank)) {
        snprintf(why, sizeof(why), "on itself: fetched %ld, got %ld", fetched, got);
        bad = 1;
    }
    MPI_Win_unlock_all(win);

    /* A read-modify-write that only an exclusive lock keeps whole. */
    for (i = 0; i < K; ++i) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        MPI_Get(&got, 1, MPI_LONG, 0, 2 * sizeof(long), 1, MPI_LONG, win);
        MPI_Win_flush(0, win);
        got += 1;
        MPI_Put(&got, 1, MPI_LONG, 0, 2 * sizeof(long), 1, MPI_LONG, win);
        MPI_Win_unlock(0, win);
    }
    MPI_Allreduce(MPI_IN_PLACE, &won, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    if (!bad && 0 == rank
        && (win_buf[0] != (long) nranks * K || win_buf[2] != (long) nranks * K
            || win_buf[3] != (long) (nranks - 1) * 7 - 3 || won != 1 || win_buf[1] < 0
            || win_buf[1] >= nranks)) {
        snprintf(why, sizeof(why),
                 "counter %ld, locked count %ld (want %ld), max %ld, CAS winners %d (slot %ld)",
                 win_buf[0], win_buf[2], (long) nranks * K, win_buf[3], won, win_buf[1]);
        bad = 1;
    }
    if (!bad && nranks - 1 == rank && *ctr32 != nranks * K) {
        snprintf(why, sizeof(why), "32-bit counter %d, want %d", *ctr32, nranks * K);
        bad = 1;
    }
    MPI_Win_unlock(rank, win);
    MPI_Win_free(&win);
    MPI_Free_mem(win_buf);
    return bad;
}

static int test_hold(void)
{
    enum { LEN = 64 * 1024 };
    unsigned char *out = malloc(LEN), *in = malloc(LEN);
    double end = MPI_Wtime() + hold_seconds;
    int peer = rank ^ 1, bad = 0, round = 0, more = 1;

    fill(out, LEN, (unsigned) rank);
    while (rank < 2 && more && !bad) {
        MPI_Sendrecv(out, LEN, MPI_BYTE, peer, 7, in, LEN, MPI_BYTE, peer, 7, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        bad = verify(in, LEN, (unsigned) peer, "hold");
        if (0 == rank && 0 == round++) {
            printf("hold: exchanging\n");
            fflush(stdout);
        }
        /* Rank 0 keeps the clock so both ranks stop after the same round. */
        if (0 == rank) {
            more = MPI_Wtime() < end;
            MPI_Send(&more, 1, MPI_INT, 1, 8, MPI_COMM_WORLD);
        } else {
            MPI_Recv(&more, 1, MPI_INT, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    }
    free(out);
    free(in);
    return bad;
}

/* Every rank exchanges with every other, round after round, for -t SECONDS:
 * messages of 8 B to 300 KiB, each one's bytes from its sender, receiver and
 * round, so a message lost, repeated or out of order fails (or hangs).  Prints
 * "steady: exchanging" after the first round: a job for reroute tests to
 * break a cable under. */
static int test_steady(void)
{
    static const size_t sizes[] = {8, 4000, 65536, 300000};
    size_t max = sizes[sizeof(sizes) / sizeof(sizes[0]) - 1];
    unsigned char **out = calloc((size_t) nranks, sizeof(*out));
    unsigned char **in = calloc((size_t) nranks, sizeof(*in));
    MPI_Request *req = calloc(2 * (size_t) nranks, sizeof(*req));
    double end = MPI_Wtime() + hold_seconds;
    int bad = 0, more = 1, round;

    for (int p = 0; p < nranks; ++p) {
        out[p] = malloc(max);
        in[p] = malloc(max);
    }
    for (round = 0; more && !bad; ++round) {
        size_t len = sizes[round % (sizeof(sizes) / sizeof(sizes[0]))];
        int n = 0;
        for (int p = 0; p < nranks; ++p) {
            if (p == rank) {
                continue;
            }
            fill(out[p], len, (unsigned) (rank * 7919 + p * 104729 + round * 31));
            MPI_Irecv(in[p], (int) len, MPI_BYTE, p, round % 1000, MPI_COMM_WORLD, &req[n++]);
            MPI_Isend(out[p], (int) len, MPI_BYTE, p, round % 1000, MPI_COMM_WORLD, &req[n++]);
        }
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        for (int p = 0; p < nranks && !bad; ++p) {
            if (p != rank) {
                bad = verify(in[p], len, (unsigned) (p * 7919 + rank * 104729 + round * 31),
                             "steady");
            }
        }
        if (0 == rank && 0 == round) {
            printf("steady: exchanging\n");
            fflush(stdout);
        }
        more = MPI_Wtime() < end;
        MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    if (0 == rank) {
        printf("steady: %d rounds\n", round);
        fflush(stdout);
    }
    for (int p = 0; p < nranks; ++p) {
        free(out[p]);
        free(in[p]);
    }
    free(out);
    free(in);
    free(req);
    return bad;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

/* A ring exchange, then rank 1 computes for -c SECONDS without calling MPI while
 * rank 2 (or 0) waits for its next message and rank 0 sends it a large one, then the
 * ring again: a healthy rank that computes long must not be taken for dead. */
static int test_compute(void)
{
    enum { LEN = 256 * 1024 };
    unsigned char *out = malloc(LEN), *in = malloc(LEN);
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks, bad = 0, round;

    for (round = 0; round < 2 && !bad; ++round) {
        fill(out, LEN, (unsigned) (rank + 100 * round));
        MPI_Sendrecv(out, LEN, MPI_BYTE, next, 9, in, LEN, MPI_BYTE, prev, 9, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        bad = verify(in, LEN, (unsigned) (prev + 100 * round), "compute");
        if (0 == round && 1 == rank) {
            volatile double x = 0;
            double end = now_s() + compute_seconds;
            printf("compute: rank 1 computes for %.0f s\n", compute_seconds);
            fflush(stdout);
            while (now_s() < end) {
                for (int i = 0; i < 1000000; ++i) {
                    x += i * 0.5;
                }
            }
        }
    }
    free(out);
    free(in);
    return bad;
}

/* Ranks 0 and 2 on one host, 1 and 3 on the other (mpirun --map-by node):
 * rank 0 sends rank 1 STALL_MSGS eager messages while rank 1 calls no MPI for
 * STALL_S seconds; meanwhile ranks 2 and 3 exchange over the same hosts.
 * Their exchange must end before rank 1 reads again (rank 3 tells rank 1
 * when it ended, by its clock, which rank 1 shares): a receiver that stops
 * reading holds back only what is sent to it. */
static int test_stalled(void)
{
    enum { STALL_S = 20, STALL_MSGS = 512, STALL_LEN = 32 * 1024, ROUNDS = 50, LEN = 64 * 1024 };
    unsigned char *buf = malloc((size_t) STALL_MSGS * STALL_LEN), *in = malloc(LEN);
    MPI_Request *req = malloc(STALL_MSGS * sizeof(*req));
    double done = 0, woke;
    int bad = 0, go = 1, i;

    if (nranks < 4) {
        snprintf(why, sizeof(why), "needs 4 ranks");
        bad = 1;
        goto out;
    }
    switch (rank) {
    case 0:
        for (i = 0; i < STALL_MSGS; ++i) {
            fill(buf + (size_t) i * STALL_LEN, STALL_LEN, (unsigned) i);
            MPI_Isend(buf + (size_t) i * STALL_LEN, STALL_LEN, MPI_BYTE, 1, 20, MPI_COMM_WORLD,
                      &req[i]);
        }
        /* The flood is under way: rank 2 may start. */
        MPI_Send(&go, 1, MPI_INT, 2, 21, MPI_COMM_WORLD);
        MPI_Waitall(STALL_MSGS, req, MPI_STATUSES_IGNORE);
        break;
    case 1: {
        double end = now_s() + STALL_S;
        while (now_s() < end) {
            usleep(100000);
        }
        woke = now_s();
        for (i = 0; i < STALL_MSGS && !bad; ++i) {
            MPI_Recv(buf, STALL_LEN, MPI_BYTE, 0, 20, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad = verify(buf, STALL_LEN, (unsigned) i, "stalled: the flood");
        }
        MPI_Recv(&done, 1, MPI_DOUBLE, 3, 22, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (!bad && done >= woke) {
            snprintf(why, sizeof(why), "ranks 2 and 3 finished %.1f s after rank 1 read again: "
                     "head-of-line blocking behind a stalled receiver", done - woke);
            bad = 1;
        }
        break;
    }
    case 2:
    case 3:
        if (2 == rank) {
            MPI_Recv(&go, 1, MPI_INT, 0, 21, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        for (i = 0; i < ROUNDS && !bad; ++i) {
            fill(buf, LEN, (unsigned) (rank + 10 * i));
            MPI_Sendrecv(buf, LEN, MPI_BYTE, rank ^ 1, 23, in, LEN, MPI_BYTE, rank ^ 1, 23,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad = verify(in, LEN, (unsigned) ((rank ^ 1) + 10 * i), "stalled: the exchange");
        }
        if (3 == rank) {
            done = now_s();
            MPI_Send(&done, 1, MPI_DOUBLE, 1, 22, MPI_COMM_WORLD);
        }
        break;
    default:
        break;
    }
out:
    free(buf);
    free(in);
    free(req);
    return bad;
}

static const struct {
    const char *name;
    int (*fn)(void);
    int by_default;
} tests[] = {
    {"pingpong", test_pingpong, 1}, {"storm", test_storm, 1},   {"manytoone", test_manytoone, 1},
    {"anysource", test_anysource, 1}, {"noncontig", test_noncontig, 1}, {"coll", test_coll, 1},
    {"osc", test_osc, 0},           {"hold", test_hold, 0},       {"compute", test_compute, 0},
    {"stalled", test_stalled, 0},   {"atomics", test_atomics, 0},   {"manyrma", test_manyrma, 0},
    {"steady", test_steady, 0},
};

static void run(int t, int *passed, int *failed)
{
    int bad;
    char msg[256];

    why[0] = '\0';
    bad = tests[t].fn();
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (why[0]) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, tests[t].name, why);
    }
    snprintf(msg, sizeof(msg), "%s: %s", bad ? "FAIL" : "ok", tests[t].name);
    if (0 == rank) {
        printf("%s\n", msg);
        fflush(stdout);
    }
    *(bad ? failed : passed) += 1;
}

int main(int argc, char **argv)
{
    int opt, passed = 0, failed = 0, i, t;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    while ((opt = getopt(argc, argv, "m:t:c:")) != -1) {
        if ('m' == opt) {
            max_bytes = strtoull(optarg, NULL, 0);
        } else if ('t' == opt) {
            hold_seconds = strtod(optarg, NULL);
        } else if ('c' == opt) {
            compute_seconds = strtod(optarg, NULL);
        } else {
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nranks < 2) {
        if (0 == rank) {
            fprintf(stderr, "tb_mpitests: needs at least 2 ranks\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (t = 0; t < (int) (sizeof(tests) / sizeof(tests[0])); ++t) {
        int wanted = optind == argc && tests[t].by_default;
        for (i = optind; i < argc; ++i) {
            wanted = wanted || 0 == strcmp(argv[i], tests[t].name);
        }
        if (wanted) {
            run(t, &passed, &failed);
        }
    }
    if (0 == rank) {
        printf("%d passed, %d failed\n", passed, failed);
    }
    MPI_Finalize();
    return failed ? 1 : 0;
}
