/*
 * tb_pingpong: ping-pong latency and bandwidth between ranks 0 and 1, every
 * byte verified.  The main job of tools/run-job, and a building block of the
 * MPI tests.
 *
 * usage: tb_pingpong [-m MAX_BYTES] [-i ITERATIONS] [-w WARMUP]
 * Prints one line per size: bytes, half round-trip time in microseconds,
 * bandwidth in MB/s; exits non-zero on any data error.
 */
#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    size_t i;
    for (i = 0; i < len; ++i) {
        buf[i] = (unsigned char) ((i * 131u + seed * 7u) >> 3);
    }
}

static size_t check(const unsigned char *buf, size_t len, unsigned seed)
{
    size_t i;
    for (i = 0; i < len; ++i) {
        if (buf[i] != (unsigned char) ((i * 131u + seed * 7u) >> 3)) {
            return i + 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t max = 1 << 20, size;
    int iters = 50, warmup = 5, rank, nranks, opt, errors = 0;
    unsigned char *sbuf, *rbuf;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    while ((opt = getopt(argc, argv, "m:i:w:")) != -1) {
        switch (opt) {
        case 'm':
            max = strtoull(optarg, NULL, 0);
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        default:
            if (0 == rank) {
                fprintf(stderr, "usage: %s [-m MAX_BYTES] [-i ITERATIONS] [-w WARMUP]\n", argv[0]);
            }
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nranks < 2 || iters < 1 || warmup < 0) {
        if (0 == rank) {
            fprintf(stderr, "tb_pingpong: needs 2 or more ranks and -i >= 1\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    sbuf = malloc(max ? max : 1);
    rbuf = malloc(max ? max : 1);
    if (NULL == sbuf || NULL == rbuf) {
        fprintf(stderr, "tb_pingpong: cannot allocate 2 x %zu bytes\n", max);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (0 == rank) {
        char peer[MPI_MAX_PROCESSOR_NAME], me[MPI_MAX_PROCESSOR_NAME];
        int len;
        MPI_Get_processor_name(me, &len);
        MPI_Recv(peer, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("# tb_pingpong: rank 0 on %s, rank 1 on %s, %d iterations\n", me, peer, iters);
        printf("# %10s %12s %12s\n", "bytes", "usec", "MB/s");
    } else if (1 == rank) {
        char me[MPI_MAX_PROCESSOR_NAME];
        int len;
        MPI_Get_processor_name(me, &len);
        MPI_Send(me, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    }

    for (size = 0; size <= max; size = size ? size * 4 : 1) {
        double t0 = 0.0, usec;
        size_t bad = 0;
        int i;

        for (i = -warmup; i < iters; ++i) {
            unsigned seed = (unsigned) (size + (size_t) i);
            if (0 == i) {
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = MPI_Wtime();
            }
            if (0 == rank) {
                fill(sbuf, size, seed);
                MPI_Send(sbuf, (int) size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int) size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                bad = check(rbuf, size, seed + 1);
            } else if (1 == rank) {
                MPI_Recv(rbuf, (int) size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                bad = check(rbuf, size, seed);
                fill(sbuf, size, seed + 1);
                MPI_Send(sbuf, (int) size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
            }
            if (bad) {
                fprintf(stderr, "tb_pingpong: rank %d: %zu-byte message %d: byte %zu wrong\n",
                        rank, size, i, bad - 1);
                errors++;
                bad = 0;
            }
        }
        usec = (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
        if (0 == rank) {
            printf("  %10zu %12.2f %12.2f\n", size, usec, usec > 0 ? (double) size / usec : 0.0);
            fflush(stdout);
        }
        if (size == max) {
            break;
        }
        if (size * 4 > max && size != max) {
            size = max / 4;
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &errors, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (0 == rank) {
        printf("# tb_pingpong: %s\n", errors ? "DATA ERRORS" : "all data verified");
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return errors ? 1 : 0;
}
