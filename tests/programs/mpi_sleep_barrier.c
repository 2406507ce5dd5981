/*
 * mpi_sleep_barrier SECONDS: every MPI rank prints "rank <r> of <n> on <hostname>", sleeps
 * SECONDS, then waits for the others at a barrier and prints "rank <r> done". A run whose
 * host is taken away while the ranks sleep shows whether mpirun notices the lost rank or
 * waits for the barrier for ever.
 *
 * Build with Debian's lam4-dev wrapper, run one process per LAM node:
 *     mpicc.lam -O2 -Wall -o mpi_sleep_barrier mpi_sleep_barrier.c
 *     mpirun.lam N ./mpi_sleep_barrier 60
 * The binary must exist at the same path on every node (e.g. a shared home).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    int rank = 0, size = 0;
    char host[256];
    unsigned seconds = argc > 1 ? (unsigned) strtoul(argv[1], NULL, 10) : 60;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    while (seconds > 0)
        seconds = sleep(seconds);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d done\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
