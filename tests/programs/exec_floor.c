/* exec_floor PROGRAM [ARGS...]: exec PROGRAM with ARGS and nothing else. Built static, it is
 * the cheapest possible stand-in for a remote-shell wrapper: the benchmarks time it beside the
 * rsh shim's pass-through to show what one extra exec costs on the machine. */
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: exec_floor PROGRAM [ARGS...]\n");
        return 64;
    }
    execv(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
