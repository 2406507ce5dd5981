#!/usr/bin/env python3
"""Asynchronous block Jacobi under ResourceBroker (the CometG class of adaptive jobs).

Solves A x = b for A = tridiag(-1, D, -1) (n unknowns, D > 2: strictly diagonally dominant,
so any order of block updates converges) and b = 1, to a residual below --tol.

    agent python3 examples/jacobi/jacobi.py --n 4000 --blocks 8 -- '(adaptive=yes)'
    ... last line: residual=<r> iterations=<k>

The process the agent starts joins the job's pool (JEL, jel.py) and stands for `master`; the
winner keeps x, runs one worker in its own process, and while some block has no worker asks
for one more host at a time with `rsh anyLinux python3 /ABS/jacobi.py --worker ...`. A worker
joins the pool as `worker`, calls the master back on TCP, and repeatedly gets a block with its
two boundary values, relaxes it (--sweeps Jacobi sweeps with the boundary fixed) and sends it
back. Updates are applied as they arrive, with whatever neighbours the block had: asynchronous
(chaotic) relaxation, which converges for this A whatever the order and the delays. Workers
come and go mid-run: a worker leaves the pool after --worker-blocks blocks (0: never); a
`vacate` for a worker's host, or its `died`/`left`, frees its block at once for another
worker, and an answer that comes after that is dropped. `iterations` counts the block updates
applied. --out FILE writes x, one value per line, for a check outside the program.

Exit codes: 0 converged; 1 not converged within --max-updates; 2 not inside a job; 64 bad usage;
69 a worker cannot reach its master.
"""

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "jel"))
import jel  # noqa: E402  (jel/jel.py of this repository, standard library only)

MAX_LINE = 16 << 20
LAUNCH_FAILURES_MAX = 3


def send(sock, obj):
    sock.sendall((json.dumps(obj) + "\n").encode())


def lines(sock):
    """The JSON objects a peer sends, until it closes (or sends something unreadable)."""
    f = sock.makefile("rb")
    while True:
        try:
            line = f.readline(MAX_LINE + 1)
        except OSError:
            return
        if not line or not line.endswith(b"\n"):
            return
        try:
            yield json.loads(line)
        except ValueError:
            return


def relax(x, left, right, diag, sweeps):
    """--sweeps Jacobi sweeps of one block with its boundary values fixed (b = 1)."""
    n = len(x)
    for _ in range(sweeps):
        new = [0.0] * n
        for i in range(n):
            lo = x[i - 1] if i > 0 else left
            hi = x[i + 1] if i < n - 1 else right
            new[i] = (1.0 + lo + hi) / diag
        x = new
    return x


def residual(x, diag):
    """max |b - A x| over the unknowns."""
    n = len(x)
    worst = 0.0
    for i in range(n):
        lo = x[i - 1] if i > 0 else 0.0
        hi = x[i + 1] if i < n - 1 else 0.0
        worst = max(worst, abs(1.0 - (diag * x[i] - lo - hi)))
    return worst


# ---------------------------------------------------------------------------- worker


def work(master, hello, diag, sweeps, task_ms, max_blocks):
    """Serves blocks on one connection until `quit`, the master's loss or max_blocks."""
    done = 0
    send(master, hello)
    for msg in lines(master):
        if msg.get("t") != "block":
            return
        started = time.monotonic()
        x = relax(msg["x"], msg["left"], msg["right"], diag, sweeps)
        left = task_ms / 1000.0 - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        send(master, {"t": "done", "k": msg["k"], "x": x})
        done += 1
        if max_blocks and done >= max_blocks:
            return


def connect_any(addrs):
    last = None
    for a in addrs.split(","):
        host, _, port = a.rpartition(":")
        try:
            return socket.create_connection((host, int(port)), timeout=2)
        except OSError as e:
            last = e
    raise OSError(f"cannot reach the master at any of {addrs}: {last}")


def worker_main(args):
    # SIGTERM is ignored: when the broker takes the host back the stream has the `vacate`
    # before SIGTERM, and the master, having freed our block, tells us to quit. Dying at
    # SIGTERM would race that. Without a master, SIGKILL at the grace's end ends us.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    me = jel.Client().join("worker")
    try:
        master = connect_any(args.master)
    except OSError as e:
        print(f"jacobi.py: {e}", file=sys.stderr)
        return 69
    master.settimeout(None)
    hello = {"t": "hello", "member": me.id, "launch": args.launch,
             "pid": os.getpid(), "host": me.info.get("host")}
    work(master, hello, args.diag, args.sweeps, args.task_ms, args.worker_blocks)
    me.leave()
    return 0


# ---------------------------------------------------------------------------- master


class Master:
    """x, the blocks, the workers; every input arrives on one queue, in order."""

    def __init__(self, args, port, inputs):
        self.args = args
        self.port = port
        self.inputs = inputs
        n, b = args.n, args.blocks
        self.bounds = [(k * n // b, (k + 1) * n // b) for k in range(b)]
        self.x = [0.0] * n
        self.holder = {}  # block -> worker id
        self.stamp = [0] * b  # when each block was last updated
        self.updates = 0
        self.workers = {}  # id -> {"sock", "member", "block", "retiring"}
        self.pending = {}  # launch -> Popen, until its worker says hello
        self.launched = 0
        self.failures = 0
        self.remote = 0
        self.freed_at_vacate = 0
        self.freed_at_death = 0
        self.freed_at_loss = 0  # its worker's connection dropped first (a crashed host)
        self.residual = residual(self.x, args.diag)

    def serve(self):
        while self.residual >= self.args.tol and self.updates < self.args.max_updates:
            self.handle(self.inputs.get())
            self.hand_out()
            self.grow()
        return self.residual < self.args.tol

    def handle(self, item):
        kind = item[0]
        if kind == "connected":
            _, wid, sock = item
            self.workers[wid] = {"sock": sock, "member": None, "block": None, "retiring": True,
                                 "label": ""}
        elif kind == "msg":
            self.worker_said(item[1], item[2])
        elif kind == "gone":
            if self.retire(item[1]):
                self.freed_at_loss += 1
            self.workers.pop(item[1], None)
        elif kind == "event":
            self.pool_event(item[1])
        elif kind == "launch_ended":
            if self.pending.pop(item[1], None) is not None:
                self.failures += 1
                print(f"jacobi.py: `rsh anyLinux` ended ({item[2]}) before its worker called back",
                      file=sys.stderr)

    def worker_said(self, wid, msg):
        w = self.workers.get(wid)
        if w is None:
            return
        if msg.get("t") == "hello":
            w["member"] = msg.get("member")
            w["retiring"] = False
            host = msg.get("host")
            w["label"] = f"pid {msg.get('pid')} on {host}" if host else "in the master"
            if msg.get("launch") is not None and self.pending.pop(msg["launch"], None) is not None:
                self.failures = 0
                self.remote += 1
        elif msg.get("t") == "done":
            k = msg.get("k")
            if w["block"] != k or self.holder.get(k) != wid:
                return  # freed meanwhile (vacate, death): another worker has it
            lo, hi = self.bounds[k]
            if len(msg.get("x", ())) != hi - lo:
                return
            self.x[lo:hi] = msg["x"]
            del self.holder[k]
            w["block"] = None
            self.updates += 1
            self.stamp[k] = self.updates
            self.residual = residual(self.x, self.args.diag)

    def retire(self, wid):
        w = self.workers.get(wid)
        if w is None:
            return False
        w["retiring"] = True
        k, w["block"] = w["block"], None
        if k is not None and self.holder.get(k) == wid:
            del self.holder[k]
            return True
        return False

    def pool_event(self, event):
        kind = event["event"]
        if kind == "vacate":
            leaving = {m["id"] for m in event["members"]}
        elif kind in ("died", "left"):
            leaving = {event["member"]["id"]}
        else:
            return
        for wid, w in list(self.workers.items()):
            if w["member"] not in leaving:
                continue
            if self.retire(wid):
                if kind == "vacate":
                    self.freed_at_vacate += 1
                else:
                    self.freed_at_death += 1
            try:
                send(w["sock"], {"t": "quit"})  # it ignores SIGTERM: it stops now
            except OSError:
                pass

    def hand_out(self):
        for wid, w in self.workers.items():
            if w["retiring"] or w["block"] is not None:
                continue
            free = [k for k in range(len(self.bounds)) if k not in self.holder]
            if not free:
                return
            k = min(free, key=lambda b: self.stamp[b])  # the stalest block first
            lo, hi = self.bounds[k]
            left = self.x[lo - 1] if lo > 0 else 0.0
            right = self.x[hi] if hi < len(self.x) else 0.0
            self.holder[k] = wid
            w["block"] = k
            try:
                send(w["sock"], {"t": "block", "k": k, "x": self.x[lo:hi], "left": left, "right": right})
            except OSError:
                pass  # its reader reports it gone
            if self.args.verbose:
                print(f"jacobi.py: block {k} to the worker {w['label']}", file=sys.stderr, flush=True)

    def grow(self):
        working = sum(1 for w in self.workers.values() if not w["retiring"])
        if (working < len(self.bounds) and not self.pending
                and self.remote_now() < self.args.max_workers
                and self.failures < LAUNCH_FAILURES_MAX):
            self.launch()

    def remote_now(self):
        return sum(1 for w in self.workers.values() if w["member"] is not None and not w["retiring"])

    def launch(self):
        self.launched += 1
        n = self.launched
        a = self.args
        cmd = ["rsh", "anyLinux", sys.executable, os.path.abspath(__file__), "--worker",
               "--master", ",".join(f"{ip}:{self.port}" for ip in addresses()),
               "--diag", repr(a.diag), "--sweeps", str(a.sweeps), "--task-ms", str(a.task_ms),
               "--worker-blocks", str(a.worker_blocks), "--launch", str(n)]
        try:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        except OSError as e:
            self.failures = LAUNCH_FAILURES_MAX
            print(f"jacobi.py: cannot run rsh: {e}; going on without more hosts", file=sys.stderr)
            return
        self.pending[n] = child

        def wait():
            self.inputs.put(("launch_ended", n, child.wait()))

        threading.Thread(target=wait, daemon=True).start()

    def stop(self):
        for w in self.workers.values():
            try:
                send(w["sock"], {"t": "quit"})
            except OSError:
                pass
        for child in self.pending.values():
            child.terminate()  # withdraws a request still waiting for a host


def addresses():
    """This host's IPv4 addresses, loopback last (a granted host reaches one of them)."""
    out = []
    try:
        found = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False)
        out = [a for a in found.stdout.split() if "." in a and not a.startswith("127.")]
    except OSError:
        pass
    return out + ["127.0.0.1"]


def accept(listener, inputs):
    wid = 0
    while True:
        sock, _ = listener.accept()
        wid += 1
        inputs.put(("connected", wid, sock))

        def read(wid=wid, sock=sock):
            for msg in lines(sock):
                inputs.put(("msg", wid, msg))
            inputs.put(("gone", wid))

        threading.Thread(target=read, daemon=True).start()


def watch(member, inputs):
    try:
        for event in member.watch(1):
            inputs.put(("event", event))
    except jel.JelError:
        pass


def master_main(args):
    me = jel.Client().join("master")
    won = me.elect("master")
    if (won.get("winner") or {}).get("id") != me.id:
        print(f"jacobi.py: another process of this job is the master ({won.get('winner')})",
              file=sys.stderr)
        return 1
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    inputs = queue.Queue()
    threading.Thread(target=accept, args=(listener, inputs), daemon=True).start()
    threading.Thread(target=watch, args=(me, inputs), daemon=True).start()
    for _ in range(args.local_workers):
        def local():
            s = socket.create_connection(("127.0.0.1", port))
            work(s, {"t": "hello", "member": None, "launch": None},
                 args.diag, args.sweeps, args.task_ms, 0)
        threading.Thread(target=local, daemon=True).start()
    m = Master(args, port, inputs)
    converged = m.serve()
    m.stop()
    if args.out:
        with open(args.out, "w") as f:
            f.write("".join(f"{v!r}\n" for v in m.x))
    print(f"jacobi.py: {m.updates} block updates, {m.remote} workers on granted hosts, "
          f"blocks freed: {m.freed_at_vacate} at a vacate, {m.freed_at_death} at a death, "
          f"{m.freed_at_loss} at a lost connection",
          file=sys.stderr)
    print(f"residual={m.residual:.3e} iterations={m.updates}", flush=True)
    me.leave()
    return 0 if converged else 1


def parse(argv):
    p = argparse.ArgumentParser(prog="jacobi.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="unknowns (default 2000)")
    p.add_argument("--blocks", type=int, default=8, help="blocks, at most one worker each (default 8)")
    p.add_argument("--diag", type=float, default=4.0, help="A's diagonal, > 2 (default 4)")
    p.add_argument("--tol", type=float, default=1e-10, help="residual to reach (default 1e-10)")
    p.add_argument("--sweeps", type=int, default=10, help="Jacobi sweeps per block update (default 10)")
    p.add_argument("--task-ms", type=int, default=0, help="each block update lasts at least MS ms")
    p.add_argument("--worker-blocks", type=int, default=0,
                   help="a remote worker leaves after this many blocks (0: never)")
    p.add_argument("--max-workers", type=int, default=16, help="most workers on granted hosts")
    p.add_argument("--local-workers", type=int, default=1, help="workers in the master's process")
    p.add_argument("--max-updates", type=int, default=1_000_000, help="give up after this many")
    p.add_argument("--out", help="write x here, one value per line")
    p.add_argument("--verbose", action="store_true", help="log each block handed out (stderr)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--launch", type=int, help=argparse.SUPPRESS)

    class Usage(Exception):
        pass

    def error(message):
        raise Usage(message)

    p.error = error
    try:
        args = p.parse_args(argv)
    except Usage as e:
        p.print_usage(sys.stderr)
        print(f"jacobi.py: {e}", file=sys.stderr)
        sys.exit(64)
    problems = []
    if args.diag <= 2:
        problems.append(f"--diag {args.diag}: must be > 2 (A strictly diagonally dominant)")
    if args.n < 1 or not 1 <= args.blocks <= args.n:
        problems.append(f"--n {args.n} --blocks {args.blocks}: need 1 <= blocks <= n")
    if args.tol <= 0 or args.sweeps < 1 or args.task_ms < 0 or args.worker_blocks < 0:
        problems.append("--tol must be > 0, --sweeps >= 1, --task-ms and --worker-blocks >= 0")
    if args.worker and not args.master:
        problems.append("--worker needs --master ADDR:PORT[,…] (the master starts workers itself)")
    if not args.worker and args.local_workers < 1 and args.max_workers < 1:
        problems.append("no workers: give --local-workers or --max-workers above 0")
    if problems:
        for line in problems:
            print(f"jacobi.py: {line}", file=sys.stderr)
        sys.exit(64)
    return args


def main(argv):
    args = parse(argv)
    try:
        return worker_main(args) if args.worker else master_main(args)
    except jel.JelError as e:
        print(f"jacobi.py: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
