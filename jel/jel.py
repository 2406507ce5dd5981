"""JEL (Join-Elect-Leave) client for ResourceBroker jobs: one file, standard library only.

Talks to the job's pool over the Unix socket named by $RB_JEL (newline-delimited JSON; see
PROTOCOL.md, section "JEL"), after checking with SO_PEERCRED that the socket is served by our
own uid.

    import jel
    me = jel.Client().join("worker")          # a member while `me` is open
    print(me.elect("master"))                 # {"name": ..., "winner": {...}, "epoch": N}
    for event in me.watch(1):                 # dicts exactly as on the wire, from seq 1
        print(event["seq"], event["event"])

As a command: `python3 jel.py members | result NAME | watch [--from SEQ] [--count N]`.
Outside a job every call fails with "not inside a ResourceBroker job" (exit 2).
"""

import json
import os
import socket
import struct
import sys

VERSION = 1
ENV_JEL = "RB_JEL"


class JelError(Exception):
    """A failed call; `exit_code` is what a command exits with."""

    exit_code = 69


class NotInJob(JelError):
    exit_code = 2

    def __init__(self):
        super().__init__(
            "not inside a ResourceBroker job (RB_JEL is not set)\n"
            "help: JEL serves the processes of a job: run the program under the agent (`agent PROGRAM ARGS…`)"
        )


class Refused(JelError):
    """The pool refused a request (its reply's error and help)."""

    exit_code = 1

    def __init__(self, reply):
        self.reply = reply
        super().__init__(
            "the pool refused `%s`: %s\nhelp: %s"
            % (reply.get("op"), reply.get("error"), reply.get("help"))
        )


class WrongServer(JelError):
    exit_code = 77


def socket_path():
    path = os.environ.get(ENV_JEL)
    if not path:
        raise NotInJob()
    return path


class _Conn:
    """One connection after the hello."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError as e:
            raise JelError(
                "cannot connect to the job's pool at %s: %s\n"
                "help: is the job still running?" % (path, e)
            )
        cred = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", cred)
        if uid != os.geteuid():
            raise WrongServer(
                "the socket %s is served by uid %d, not you (uid %d)\n"
                "help: do not use this socket; check who made it (`ls -ln %s`)"
                % (path, uid, os.geteuid(), path)
            )
        self.file = self.sock.makefile("rb")
        self.write({"jel": VERSION})
        hello = self.read()
        if "jel" not in hello:
            raise Refused(hello)
        self.consistency = hello.get("consistency", "")

    def write(self, obj):
        self.sock.sendall((json.dumps(obj, separators=(",", ":")) + "\n").encode())

    def read(self):
        line = self.file.readline()
        if not line:
            raise JelError("the job's pool at %s closed the connection" % self.path)
        return json.loads(line)

    def request(self, obj):
        self.write(obj)
        reply = self.read()
        if reply.get("reply") == "error":
            raise Refused(reply)
        return reply

    def close(self):
        self.file.close()
        self.sock.close()


class Client:
    """A connection that is not a member (yet)."""

    def __init__(self, path=None):
        self._conn = _Conn(path or socket_path())

    def join(self, name=None, pid=None):
        """Joins; the connection becomes the member's (closing it without leave() = died)."""
        req = {"op": "join", "name": name}
        if pid is not None:
            req["pid"] = pid
        reply = self._conn.request(req)
        return Member(self._conn, reply["member"])

    def members(self):
        return self._conn.request({"op": "members"})["members"]

    def result(self, name):
        return self._conn.request({"op": "result", "name": name})

    def watch(self, from_seq=1):
        return Watcher(self._conn, from_seq)


class Member:
    def __init__(self, conn, info):
        self._conn = conn
        self.info = info
        self.id = info["id"]

    def elect(self, name):
        return self._conn.request({"op": "elect", "name": name})

    def result(self, name):
        return self._conn.request({"op": "result", "name": name})

    def members(self):
        return self._conn.request({"op": "members"})["members"]

    def signal(self, name, to=(), payload=None):
        req = {"op": "signal", "name": name, "to": list(to), "payload": payload}
        return self._conn.request(req)["seq"]

    def leave(self):
        seq = self._conn.request({"op": "leave"})["seq"]
        self._conn.close()
        return seq

    def close(self):
        """Closes without leaving: the pool reports this member died (exited)."""
        self._conn.close()

    def watch(self, from_seq=1):
        return Watcher(_Conn(self._conn.path), from_seq)


class Watcher:
    """The stream from a seq on; reconnects and resumes by seq when the pool cuts it off."""

    def __init__(self, conn, from_seq):
        self._conn = conn
        self.next_seq = max(1, from_seq)
        self.terminated = False
        conn.request({"op": "watch", "from": self.next_seq})

    def next_event(self):
        try:
            event = self._conn.read()
        except JelError:
            if self.terminated:
                raise
            self.resume()
            event = self._conn.read()
        self.next_seq = event["seq"] + 1
        self.terminated = self.terminated or event["event"] == "terminated"
        return event

    def resume(self):
        self._conn.close()
        self._conn = _Conn(self._conn.path)
        self._conn.request({"op": "watch", "from": self.next_seq})

    def __iter__(self):
        while not self.terminated:
            yield self.next_event()


def winner_label(reply):
    """A winner as people see it: its name, or its id when it has none."""
    w = reply.get("winner")
    if w is None:
        return None
    return w["name"] if w.get("name") is not None else str(w["id"])


def main(argv):
    usage = "usage: jel.py members | result NAME | watch [--from SEQ] [--count N]"
    try:
        if argv[:1] == ["members"]:
            print(json.dumps(Client().members()))
        elif argv[:1] == ["result"] and len(argv) == 2:
            label = winner_label(Client().result(argv[1]))
            if label is None:
                return 1
            print(label)
        elif argv[:1] == ["watch"]:
            opts = dict(zip(argv[1::2], argv[2::2]))
            count = int(opts.get("--count", "0"))
            for n, event in enumerate(Client().watch(int(opts.get("--from", "1"))), 1):
                print(json.dumps(event, separators=(",", ":")), flush=True)
                if n == count:
                    break
        else:
            print(usage, file=sys.stderr)
            return 64
    except JelError as e:
        print("jel: %s" % e, file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
