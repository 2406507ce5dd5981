/* watch.h: the thread that turns the job's JEL stream into short lines on a pipe. */
#ifndef MW_WATCH_H
#define MW_WATCH_H

/* Starts watching the job's pool; *read_fd gets the pipe's read end. -1 with jel_error()
 * set when the pool cannot be watched. */
int watch_start(int *read_fd);

#endif
