/*
 * mpi_hosts: every MPI rank prints "rank <r> of <n> on <hostname>".
 *
 * Build with Debian's lam4-dev wrapper, run one process per LAM node:
 *     mpicc.lam -O2 -Wall -o mpi_hosts mpi_hosts.c
 *     mpirun.lam N ./mpi_hosts        (N: one process per node; C: one per CPU)
 * The binary must exist at the same path on every node (e.g. a shared home).
 */
#include <stdio.h>
#include <unistd.h>
#include <mpi.h>

int main(int argc, char **argv)
{
    int rank = 0, size = 0;
    char host[256];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
