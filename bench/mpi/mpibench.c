/*
 * mpibench: the two measurements bench/mpi/run needs that NetPIPE lacks.
 *
 *   mpibench msgrate [-w WINDOW] [-i ITERATIONS] [-s BYTES]
 *       every pair of ranks (2k, 2k+1) at once: 2k sends windows of WINDOW
 *       non-blocking BYTES-byte messages (default 64 x 8 B), 2k+1 pre-posts as
 *       many receives and answers each window with a 0-byte message.  Prints
 *       "msgrate BYTES WINDOW ITERATIONS MSGS_PER_SEC", the sum over the pairs.
 *   mpibench idle [-i SECONDS]
 *       ranks 0 and 1: a warm 8 B ping-pong, then every rank sleeps SECONDS
 *       (default 20) without calling MPI, then one round trip.  Prints "idle
 *       SECONDS first FIRST_USEC warm MEDIAN_USEC" (half round trips).
 *   mpibench pingpong [-i ITERATIONS] [-s BYTES]
 *       ranks 0 and 1: ITERATIONS round trips of one BYTES-byte message (default
 *       8 B).  Prints "pingpong BYTES ITERATIONS MEAN_USEC MEDIAN_USEC", half
 *       the mean and half the median round trip.
 *   mpibench put|get [-w WINDOW] [-i ITERATIONS] [-s BYTES]
 *       one-sided, rank 0 to rank 1: each iteration one passive-target epoch
 *       (MPI_Win_lock shared .. unlock) of WINDOW MPI_Put or MPI_Get calls of
 *       BYTES each (default 8 x 1 MiB) into or from a window MPI_Win_allocate'd
 *       on rank 1; the data is checked after the last.  Prints "put|get BYTES
 *       WINDOW ITERATIONS MB_PER_SEC" (10^6 bytes), comparable with msgrate's
 *       rate times BYTES.
 *   mpibench allreduce [-i ITERATIONS] [-s BYTES]...
 *       every rank: MPI_Allreduce (MPI_SUM over doubles) of each size given
 *       (default 8 and 1048576 bytes).  Prints "allreduce BYTES ITERATIONS USEC"
 *       per size, the mean time of one call on the slowest rank.
 *   mpibench gaps [-i SECONDS] [-s BYTES]
 *       ranks 0 and 1: round trips of one BYTES-byte message (default 8 B),
 *       checked, for SECONDS (default 30); rank 0 prints "gaps ready" once
 *       they flow, then, at the end, "gap START_MS LENGTH_MS" for each time
 *       between two round trips' ends longer than 100 ms (START_MS: the first
 *       one's end, in ms of the Unix epoch, for a fault's time beside it),
 *       "rt SECOND_MS MEDIAN_USEC TRIPS" for each second of the run (the
 *       median round trip of those that ended in it, SECOND_MS its start in ms
 *       of the epoch: the cost of a way round beside the cable's) and "gaps
 *       TRIPS MEDIAN_USEC" (the median round trip).
 */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(int rank)
{
    if (0 == rank) {
        fprintf(stderr, "usage: mpibench msgrate [-w WINDOW] [-i ITERATIONS] [-s BYTES]\n"
                        "       mpibench pingpong [-i ITERATIONS] [-s BYTES]\n"
                        "       mpibench put|get [-w WINDOW] [-i ITERATIONS] [-s BYTES]\n"
                        "       mpibench allreduce [-i ITERATIONS] [-s BYTES]...\n"
                        "       mpibench idle [-i SECONDS]\n"
                        "       mpibench gaps [-i SECONDS] [-s BYTES]\n");
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static double epoch_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

/* When traffic stops and flows again (a cable cut, then gone round): round
 * trips between ranks 0 and 1 for a while, each reply checked, and the
 * gaps between their ends.  The other ranks wait in the final barrier. */
#define GAPS_MAX 64
#define GAPS_TRIPS (1 << 20)
static int gaps(int rank, int seconds, size_t bytes)
{
    unsigned char *buf = calloc(1, bytes ? bytes : 1);
    double *rt = NULL, *ends = NULL, t_end, t_prev, t, gap_at[GAPS_MAX], gap_len[GAPS_MAX];
    int stop = 0, ngaps = 0, trips = 0, bad = 0;

    if (NULL == buf
        || (0 == rank
            && (NULL == (rt = calloc(GAPS_TRIPS, sizeof(*rt)))
                || NULL == (ends = calloc(GAPS_TRIPS, sizeof(*ends)))))) {
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (0 == rank) {
        t_end = MPI_Wtime() + seconds;
        t_prev = epoch_ms();
        while (!stop) {
            double t0 = MPI_Wtime();
            stop = t0 > t_end;
            memset(buf, (unsigned char) trips, bytes);
            buf[0] = (unsigned char) stop;
            MPI_Send(buf, (int) bytes, MPI_BYTE, 1, 6, MPI_COMM_WORLD);
            MPI_Recv(buf, (int) bytes, MPI_BYTE, 1, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (size_t i = 1; i < bytes; ++i) {
                bad += buf[i] != (unsigned char) (trips + 1);
            }
            t = epoch_ms();
            if (t - t_prev > 100.0 && ngaps < GAPS_MAX) {
                gap_at[ngaps] = t_prev;
                gap_len[ngaps++] = t - t_prev;
            }
            t_prev = t;
            if (trips < GAPS_TRIPS) {
                rt[trips] = MPI_Wtime() - t0;
                ends[trips] = t;
            }
            if (1 == ++trips) {
                printf("gaps ready\n");
                fflush(stdout);
            }
        }
    } else if (1 == rank) {
        while (!stop) {
            MPI_Recv(buf, (int) bytes, MPI_BYTE, 0, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            stop = buf[0];
            for (size_t i = 1; i < bytes; ++i) {
                buf[i]++;
            }
            MPI_Send(buf, (int) bytes, MPI_BYTE, 0, 6, MPI_COMM_WORLD);
        }
    }
    if (0 == rank) {
        int n = trips < GAPS_TRIPS ? trips : GAPS_TRIPS;
        for (int i = 0; i < ngaps; ++i) {
            printf("gap %.0f %.1f\n", gap_at[i], gap_len[i]);
        }
        /* Per second, in order (ends only grow): sorted in place, once
         * printed the round trips are not needed in order again. */
        for (int i = 0, j; i < n; i = j) {
            double second = (double) ((long long) (ends[i] / 1000.0) * 1000LL);
            for (j = i; j < n && ends[j] < second + 1000.0; ++j) {
            }
            qsort(rt + i, (size_t) (j - i), sizeof(*rt), cmp_double);
            printf("rt %.0f %.2f %d\n", second, rt[i + (j - i) / 2] * 1e6, j - i);
        }
        qsort(rt, (size_t) n, sizeof(*rt), cmp_double);
        printf("gaps %d %.2f%s\n", trips, n ? rt[n / 2] * 1e6 : 0.0,
               bad ? " (replies with wrong bytes)" : "");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(ends);
    free(rt);
    free(buf);
    return bad ? 1 : 0;
}

/* Every pair of ranks (2k, 2k+1) at once, 2k sending: with the ranks mapped by
 * node, each pair spans two hosts.  The rate printed is the sum. */
static int msgrate(int rank, int nranks, int window, int iters, size_t bytes)
{
    char *buf = calloc((size_t) window, bytes ? bytes : 1);
    MPI_Request *req = calloc((size_t) window, sizeof(*req));
    double t0 = 0.0, dt, rate = 0.0, total = 0.0;
    int it, k, warmup = iters / 10 + 1, peer = rank ^ 1;
    int active = peer < nranks;

    if (nranks < 2 || NULL == buf || NULL == req) {
        fprintf(stderr, "mpibench msgrate: needs 2 ranks and memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (!active) {
        /* An odd rank out joins the barrier where the pairs start timing. */
        MPI_Barrier(MPI_COMM_WORLD);
    }
    for (it = -warmup; active && it < iters; ++it) {
        if (0 == it) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (0 == rank % 2) {
            for (k = 0; k < window; ++k) {
                MPI_Isend(buf + (size_t) k * bytes, (int) bytes, MPI_BYTE, peer, 1,
                          MPI_COMM_WORLD, &req[k]);
            }
            MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
            MPI_Recv(NULL, 0, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (k = 0; k < window; ++k) {
                MPI_Irecv(buf + (size_t) k * bytes, (int) bytes, MPI_BYTE, peer, 1,
                          MPI_COMM_WORLD, &req[k]);
            }
            MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
            MPI_Send(NULL, 0, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
        }
    }
    dt = MPI_Wtime() - t0;
    if (active && 0 == rank % 2) {
        rate = (double) window * iters / dt;
    }
    MPI_Reduce(&rate, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (0 == rank) {
        printf("msgrate %zu %d %d %.1f\n", bytes, window, iters, total);
    }
    free(buf);
    free(req);
    return 0;
}

/* Ranks 0 and 1 exchange, then every rank sleeps for -i SECONDS without calling
 * MPI (rank 0 prints "idle: sleeping" first), then 0 and 1 time one round trip of
 * 8 B: the first message after an idle spell, against the median of a warm
 * ping-pong before it. */
static int idle(int rank, int nranks, int seconds)
{
    char b[8] = {0};
    double rt[200], t1, first;
    int it;

    if (nranks < 2) {
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (it = 0; it < 200; ++it) {
        t1 = MPI_Wtime();
        if (0 == rank) {
            MPI_Send(b, 8, MPI_BYTE, 1, 4, MPI_COMM_WORLD);
            MPI_Recv(b, 8, MPI_BYTE, 1, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (1 == rank) {
            MPI_Recv(b, 8, MPI_BYTE, 0, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(b, 8, MPI_BYTE, 0, 4, MPI_COMM_WORLD);
        }
        rt[it] = MPI_Wtime() - t1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) {
        printf("idle: sleeping %d s\n", seconds);
        fflush(stdout);
    }
    sleep((unsigned) seconds);
    t1 = MPI_Wtime();
    if (0 == rank) {
        MPI_Send(b, 8, MPI_BYTE, 1, 5, MPI_COMM_WORLD);
        MPI_Recv(b, 8, MPI_BYTE, 1, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (1 == rank) {
        MPI_Recv(b, 8, MPI_BYTE, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(b, 8, MPI_BYTE, 0, 5, MPI_COMM_WORLD);
    }
    first = MPI_Wtime() - t1;
    if (0 == rank) {
        qsort(rt, 200, sizeof(rt[0]), cmp_double);
        printf("idle %d first %.2f warm %.2f\n", seconds, first / 2 * 1e6, rt[100] / 2 * 1e6);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return 0;
}

static int pingpong(int rank, int nranks, int iters, size_t bytes)
{
    char *buf = malloc(bytes ? bytes : 1);
    double *rt = malloc((size_t) iters * sizeof(*rt));
    double t0 = 0.0, t1, dt;
    int it, warmup = iters / 10 + 1;

    if (nranks < 2 || NULL == buf || NULL == rt) {
        fprintf(stderr, "mpibench pingpong: needs 2 ranks and memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(buf, rank, bytes);
    for (it = -warmup; it < iters; ++it) {
        if (0 == it) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        t1 = MPI_Wtime();
        if (0 == rank) {
            MPI_Send(buf, (int) bytes, MPI_BYTE, 1, 3, MPI_COMM_WORLD);
            MPI_Recv(buf, (int) bytes, MPI_BYTE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (1 == rank) {
            MPI_Recv(buf, (int) bytes, MPI_BYTE, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int) bytes, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
        }
        if (it >= 0) {
            rt[it] = MPI_Wtime() - t1;
        }
    }
    dt = MPI_Wtime() - t0;
    if (0 == rank) {
        /* Both, as perftest's t_avg and t_typical: under emulation a few
         * descheduled round trips move the mean far from the median. */
        qsort(rt, (size_t) iters, sizeof(*rt), cmp_double);
        printf("pingpong %zu %d %.2f %.2f\n", bytes, iters, dt / iters / 2 * 1e6,
               rt[iters / 2] / 2 * 1e6);
    }
    free(rt);
    free(buf);
    return 0;
}

static int allreduce(int rank, int iters, const size_t *sizes, int nsizes)
{
    int s, it;

    for (s = 0; s < nsizes; ++s) {
        size_t n = sizes[s] / sizeof(double);
        double *in = malloc((n ? n : 1) * sizeof(double));
        double *out = malloc((n ? n : 1) * sizeof(double));
        double t0 = 0.0, dt, worst;
        size_t i;
        int warmup = iters / 10 + 1;

        if (NULL == in || NULL == out) {
            fprintf(stderr, "mpibench allreduce: cannot allocate %zu bytes\n", sizes[s]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (i = 0; i < n; ++i) {
            in[i] = (double) (rank + 1);
        }
        for (it = -warmup; it < iters; ++it) {
            if (0 == it) {
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = MPI_Wtime();
            }
            MPI_Allreduce(in, out, (int) n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        }
        dt = (MPI_Wtime() - t0) / iters;
        MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (0 == rank) {
            int nranks;
            MPI_Comm_size(MPI_COMM_WORLD, &nranks);
            if (n > 0 && out[0] != (double) nranks * (nranks + 1) / 2) {
                fprintf(stderr, "mpibench allreduce: wrong sum %g\n", out[0]);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            printf("allreduce %zu %d %.2f\n", n * sizeof(double), iters, worst * 1e6);
            fflush(stdout);
        }
        free(in);
        free(out);
    }
    return 0;
}

static unsigned char pattern(size_t i)
{
    return (unsigned char) ((i * 7 + i / 4096) & 0xff);
}

/* Bytes of buf[0..len) that differ from pattern(). */
static size_t mismatches(const unsigned char *buf, size_t len)
{
    size_t i, bad = 0;

    for (i = 0; i < len; ++i) {
        bad += buf[i] != pattern(i);
    }
    return bad;
}

/* Rank 0 puts into, or gets from, rank 1's window; the others only take part
 * in the window's creation and the barriers. */
static int onesided(int rank, int nranks, int is_put, int window, int iters, size_t bytes)
{
    size_t len = (size_t) window * bytes, i, bad = 0;
    unsigned char *base = NULL, *local = malloc(len ? len : 1);
    double t0 = 0.0, dt;
    int it, k, warmup = iters / 10 + 1;
    MPI_Win win;

    if (nranks < 2 || NULL == local || len > (size_t) 1 << 30) {
        fprintf(stderr, "mpibench %s: needs 2 ranks, memory, and WINDOW x BYTES <= 1 GiB\n",
                is_put ? "put" : "get");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Win_allocate(1 == rank ? (MPI_Aint) len : 0, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    for (i = 0; i < len; ++i) {
        local[i] = 0 == rank && is_put ? pattern(i) : 0;
        if (1 == rank) {
            base[i] = is_put ? 0 : pattern(i);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) {
        for (it = -warmup; it < iters; ++it) {
            if (0 == it) {
                t0 = MPI_Wtime();
            }
            MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
            for (k = 0; k < window; ++k) {
                if (is_put) {
                    MPI_Put(local + (size_t) k * bytes, (int) bytes, MPI_BYTE, 1,
                            (MPI_Aint) k * (MPI_Aint) bytes, (int) bytes, MPI_BYTE, win);
                } else {
                    MPI_Get(local + (size_t) k * bytes, (int) bytes, MPI_BYTE, 1,
                            (MPI_Aint) k * (MPI_Aint) bytes, (int) bytes, MPI_BYTE, win);
                }
            }
            MPI_Win_unlock(1, win);
        }
        dt = MPI_Wtime() - t0;
        if (!is_put) {
            bad = mismatches(local, len);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (1 == rank && is_put) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 1, 0, win);
        bad = mismatches(base, len);
        MPI_Win_unlock(1, win);
    }
    if (bad) {
        fprintf(stderr, "mpibench %s: %zu of %zu bytes wrong\n", is_put ? "put" : "get", bad, len);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (0 == rank) {
        printf("%s %zu %d %d %.2f\n", is_put ? "put" : "get", bytes, window, iters,
               (double) iters * (double) len / dt / 1e6);
        fflush(stdout);
    }
    MPI_Win_free(&win);
    free(local);
    return 0;
}

int main(int argc, char **argv)
{
    int rank, nranks, opt, window = 0, iters = -1, nsizes = 0;
    size_t sizes[16], bytes = 8;
    const char *mode;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc < 2) {
        usage(rank);
    }
    mode = argv[1];
    optind = 2;
    while ((opt = getopt(argc, argv, "w:i:s:")) != -1) {
        switch (opt) {
        case 'w':
            window = atoi(optarg);
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        case 's':
            bytes = strtoull(optarg, NULL, 0);
            if (nsizes < 16) {
                sizes[nsizes++] = bytes;
            }
            break;
        default:
            usage(rank);
        }
    }
    if (window < 0) {
        usage(rank);
    }
    if (0 == strcmp(mode, "msgrate")) {
        msgrate(rank, nranks, window ? window : 64, iters > 0 ? iters : 200, bytes);
    } else if (0 == strcmp(mode, "pingpong")) {
        pingpong(rank, nranks, iters > 0 ? iters : 1000, bytes);
    } else if (0 == strcmp(mode, "put") || 0 == strcmp(mode, "get")) {
        onesided(rank, nranks, 'p' == mode[0], window ? window : 8, iters > 0 ? iters : 20,
                 nsizes ? bytes : (size_t) 1 << 20);
    } else if (0 == strcmp(mode, "gaps")) {
        if (nranks < 2 || gaps(rank, iters > 0 ? iters : 30, nsizes && bytes ? bytes : 8)) {
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    } else if (0 == strcmp(mode, "idle")) {
        idle(rank, nranks, iters > 0 ? iters : 20);
    } else if (0 == strcmp(mode, "allreduce")) {
        if (0 == nsizes) {
            sizes[nsizes++] = 8;
            sizes[nsizes++] = 1 << 20;
        }
        allreduce(rank, iters > 0 ? iters : 20, sizes, nsizes);
    } else {
        usage(rank);
    }
    MPI_Finalize();
    return 0;
}
