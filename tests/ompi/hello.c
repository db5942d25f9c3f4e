/* Every rank sends its rank to rank 0, which checks them: enough to prove a
 * job's processes reached each other over whichever BTL carried it. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, i, value, bad = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (0 == rank) {
        for (i = 1; i < size; ++i) {
            MPI_Recv(&value, 1, MPI_INT, i, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad += value != i;
        }
        printf("hello: %d ranks, %s\n", size, bad ? "WRONG DATA" : "all data correct");
    } else {
        MPI_Send(&rank, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return bad ? 1 : 0;
}
