#!/usr/bin/env python3
"""leave_at_sigterm.py JEL_DIR: a JEL member (jel.py, found in JEL_DIR) named `late` that
leaves the job's pool when it gets SIGTERM, as an adaptive program's worker does once its
host is taken back, and says so on stdout: `joined`, then `left SEQ` once the pool has
answered its leave. Used by tests/tests/jel_agent_lab.rs: the leave is sent while the
reclaim's grace runs, and its answer must reach the member before the grace's SIGKILL."""
import signal
import sys

sys.path.insert(0, sys.argv[1])
import jel  # noqa: E402

# Blocked before the join, so that a SIGTERM at any time after it is waited for below.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
me = jel.Client().join("late")
print("joined", flush=True)
signal.sigwait({signal.SIGTERM})
print(f"left {me.leave()}", flush=True)
