/*
 * pvm_lost_task HOST: a PVM master that spawns one copy of itself on HOST (the worker
 * sleeps 120 s, then sends tag 1 to its parent), asks PVM to tell it when the worker
 * exits (pvm_notify(PvmTaskExit), tag 9), and waits for whichever comes first. Prints
 * "spawned tTID on HOST", then "worker done" (exit 0) or "worker tTID on HOST is gone"
 * (exit 2). A host deleted from the virtual machine while the worker sleeps shows what a
 * PVM program that asked for notifications sees: the notification, at once.
 *
 * Build with Debian's pvm-dev:  gcc -O2 -Wall -o pvm_lost_task pvm_lost_task.c -lpvm3
 * Run it by absolute path (PVM spawns the same path on HOST; e.g. a shared home).
 */
#include <stdio.h>
#include <unistd.h>
#include <pvm3.h>

#define TAG_DONE 1
#define TAG_EXIT 9

int main(int argc, char **argv)
{
    int tid = 0;
    char *no_args[] = {NULL};

    if (pvm_mytid() < 0)
        return 1;
    if (pvm_parent() != PvmNoParent) {
        unsigned left = 120;
        while (left > 0)
            left = sleep(left);
        pvm_initsend(PvmDataDefault);
        pvm_send(pvm_parent(), TAG_DONE);
        pvm_exit();
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: pvm_lost_task HOST\n");
        pvm_exit();
        return 1;
    }
    if (pvm_spawn(argv[0], no_args, PvmTaskHost, argv[1], 1, &tid) != 1) {
        printf("cannot spawn on %s: %d\n", argv[1], tid);
        pvm_exit();
        return 1;
    }
    pvm_notify(PvmTaskExit, TAG_EXIT, 1, &tid);
    printf("spawned t%x on %s\n", tid, argv[1]);
    fflush(stdout);
    int tag = 0, len = 0, src = 0;
    pvm_bufinfo(pvm_recv(-1, -1), &len, &tag, &src);
    if (tag == TAG_DONE) {
        printf("worker done\n");
        pvm_exit();
        return 0;
    }
    printf("worker t%x on %s is gone\n", tid, argv[1]);
    pvm_exit();
    return 2;
}
