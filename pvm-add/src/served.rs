//! The job's PVM task kept enrolled: after its first add, `rb-pvm-add` leaves a server
//! (`rb-pvm-add --serve`) in the job's module directory (`RB_MODULE_DIR`), enrolled in the
//! virtual machine, and each later `rb-pvm-add HOST` of the job hands its host to that
//! server over a Unix socket there instead of loading libpvm3 and enrolling again (about
//! 1.5–3 ms of each add on the test machine, while the job waits for its host).
//!
//! - [`ask`]: the client side: connect, send `HOST\n`, read the [`Reply`]. No server (no
//!   socket, or a stale one): `None`, and the caller adds the host itself.
//! - [`serve`]: the server: binds the socket, then adds the hosts it is asked for one at a
//!   time, and ends when its pvmd goes away (`pvm-halt`, the job's end), when the module
//!   directory is removed (the agent removes it with the job), or when another server holds
//!   the socket. The agent, the job's child subreaper, adopts it and ends it at the job's
//!   end in any case.
//! - [`start_server`]: the first add's way to leave one behind: fork, `setsid`, exec, not
//!   waited for (the job waits for its host meanwhile).
//! - [`Reply`]: the exit status and the stderr line the client gives as its own, one line
//!   `CODE<TAB>MESSAGE`; [`Reply::parse`] and [`Reply::line`] are pure.

use std::{
    ffi::CString,
    io::{BufRead, BufReader, Read, Write},
    os::{
        fd::{AsRawFd, RawFd},
        unix::net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    time::Duration,
};

use crate::pvm::{Pvm, PvmdNews};

/// The server's socket in the job's module directory.
pub const SOCKET: &str = "rb-pvm-add.sock";
/// The module directory (modules/CONTRACT.md): private to the user, one module call at a
/// time, removed with the job.
pub const MODULE_DIR_VAR: &str = "RB_MODULE_DIR";
/// How long the server waits for a client's host line.
const REQUEST_LIMIT: Duration = Duration::from_secs(2);
/// How often an idle server checks that its module directory is still there.
const IDLE_CHECK_MS: i32 = 1000;
/// The pause after the pvmd's connection was readable with no whole message in it.
const PVMD_PAUSE: Duration = Duration::from_millis(10);

/// What `rb-pvm-add HOST` exits with, and the line it says on stderr (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: i32,
    pub message: String,
}

impl Reply {
    /// The reply as sent: `CODE<TAB>MESSAGE\n` (the message on one line).
    pub fn line(&self) -> String {
        let message = self.message.replace(['\n', '\r'], " ");
        format!("{}\t{message}\n", self.code)
    }

    /// A reply line back; `None` when it is not one (a server that went away mid-answer).
    pub fn parse(line: &str) -> Option<Reply> {
        let line = line.strip_suffix('\n')?;
        let (code, message) = line.split_once('\t')?;
        Some(Reply {
            code: code.parse().ok()?,
            message: message.to_string(),
        })
    }
}

/// The module directory of this job, when there is one.
pub fn module_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(MODULE_DIR_VAR)?);
    dir.is_dir().then_some(dir)
}

/// Asks the job's server in `dir` to add `host`. `None` when no server answers the
/// connection (the caller adds the host itself); `Some(Err)` when one took the host but
/// went away before answering (the add may have happened: not tried again).
pub fn ask(dir: &Path, host: &str) -> Option<Result<Reply, String>> {
    let addr = SocketAddr::of(dir)?;
    let mut conn = UnixStream::connect(addr.path()).ok()?;
    // The write side stays open: the server takes a closed connection for a client gone
    // (killed by its timeout) and then adds nothing.
    if let Err(e) = conn.write_all(format!("{host}\n").as_bytes()) {
        return Some(Err(format!("the job's PVM task took no request: {e}")));
    }
    steptimes::mark("pvmadd.asked", None);
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    Some(
        Reply::parse(&answer)
            .ok_or_else(|| "the job's PVM task went away during the add".to_string()),
    )
}

/// Starts `rb-pvm-add --serve` for the job's module directory, in a session of its own,
/// its stdio on /dev/null; not waited for. Nothing happens when it cannot start. A bare
/// fork and exec, not `std::process::Command`: its spawn returns only once the child has
/// exec'd (about a millisecond here), and the job waits for `pvm-grow` meanwhile.
pub fn start_server() {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let (Ok(path), Ok(flag), Ok(null)) = (
        CString::new(exe.as_os_str().as_encoded_bytes()),
        CString::new("--serve"),
        CString::new("/dev/null"),
    ) else {
        return;
    };
    let argv = [path.as_ptr(), flag.as_ptr(), std::ptr::null()];
    // SAFETY: this program is single-threaded; the child only makes async-signal-safe
    // calls (setsid, open, dup2, execv, _exit) on memory prepared before the fork.
    unsafe {
        if libc::fork() == 0 {
            libc::setsid();
            let fd = libc::open(null.as_ptr(), libc::O_RDWR);
            if fd >= 0 {
                for target in 0..3 {
                    libc::dup2(fd, target);
                }
            }
            libc::execv(path.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
}

/// The server: adds each host it is asked for with `add` (the same as a plain
/// `rb-pvm-add HOST`) until the pvmd or the module directory goes. Returns the exit code.
pub fn serve(pvm: &Pvm, dir: &Path, add: impl Fn(&str) -> Reply) -> i32 {
    let path = dir.join(SOCKET);
    let Some(listener) = SocketAddr::of(dir).and_then(|addr| bind(addr.path())) else {
        return 0;
    };
    let Some(pvmd) = pvm.pvmd_fd() else {
        let _ = std::fs::remove_file(&path);
        return 3;
    };
    loop {
        match wait(listener.as_raw_fd(), pvmd) {
            Ready::Client => {
                if let Ok((conn, _)) = listener.accept() {
                    answer(conn, &add);
                }
            }
            Ready::Pvmd => match pvm.pvmd_news() {
                PvmdNews::Gone => break,
                PvmdNews::Message => {}
                // Readable without a whole message: not at once again (no busy loop).
                PvmdNews::Nothing => std::thread::sleep(PVMD_PAUSE),
            },
            Ready::Idle if !socket_still_there(&path) => return 0,
            Ready::Idle => {}
        }
    }
    let _ = std::fs::remove_file(&path);
    0
}

/// The socket's address in a module directory as `bind` and `connect` take it. A Unix
/// socket's address holds a path of at most [`SUN_PATH_MAX`] bytes, and a module directory
/// can be longer (`~/.local/state/rb/…` under a long home): then the directory is reached
/// through a descriptor of it, `/proc/self/fd/N/rb-pvm-add.sock`, held open with the
/// address (without it, every add of such a job took the slow way, silently).
struct SocketAddr {
    path: PathBuf,
    _dir: Option<std::fs::File>,
}

/// The longest path a Unix socket's address holds (`sun_path` less its NUL).
const SUN_PATH_MAX: usize = 107;

impl SocketAddr {
    /// `None` when the directory cannot be opened.
    fn of(dir: &Path) -> Option<SocketAddr> {
        let path = dir.join(SOCKET);
        if path.as_os_str().len() <= SUN_PATH_MAX {
            return Some(SocketAddr { path, _dir: None });
        }
        // Opened close-on-exec (std's default): the server's children do not inherit it.
        let dir = std::fs::File::open(dir).ok()?;
        Some(SocketAddr {
            path: PathBuf::from(format!("/proc/self/fd/{}/{SOCKET}", dir.as_raw_fd())),
            _dir: Some(dir),
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds `path`; `None` when another server answers there. A socket nobody answers on (a
/// server killed, e.g. by the pvmd's halt) is replaced.
fn bind(path: &Path) -> Option<UnixListener> {
    match UnixListener::bind(path) {
        Ok(l) => Some(l),
        Err(_) if UnixStream::connect(path).is_ok() => None,
        Err(_) => {
            let _ = std::fs::remove_file(path);
            UnixListener::bind(path).ok()
        }
    }
}

/// Whether the socket at `path` is still there (the module directory not removed).
fn socket_still_there(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

enum Ready {
    Client,
    Pvmd,
    Idle,
}

/// Waits for a client, the pvmd's connection, or [`IDLE_CHECK_MS`].
fn wait(listener: RawFd, pvmd: RawFd) -> Ready {
    let mut fds = [
        libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pvmd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfd entries.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, IDLE_CHECK_MS) };
    match n {
        n if n > 0 && fds[1].revents != 0 => Ready::Pvmd,
        n if n > 0 && fds[0].revents != 0 => Ready::Client,
        _ => Ready::Idle,
    }
}

/// Reads one host line from `conn`, adds it, writes the reply.
fn answer(conn: UnixStream, add: &impl Fn(&str) -> Reply) {
    let _ = conn.set_read_timeout(Some(REQUEST_LIMIT));
    let mut line = String::new();
    let mut reader = BufReader::new(&conn);
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let host = line.trim();
    if host.is_empty() || gone(&conn) {
        return;
    }
    let reply = add(host);
    let _ = (&conn).write_all(reply.line().as_bytes());
}

/// Whether the client closed its connection (killed: its `--timeout-s` passed while an
/// earlier add held the server). Its host is then not added: its `pvm-grow` has failed and
/// the agent gave the host back.
fn gone(conn: &UnixStream) -> bool {
    let mut fd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd; no wait.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_line_reads_back_with_its_message_on_one_line() {
        let reply = Reply {
            code: 1,
            message: "rb-pvm-add: PVM could not add node03: Can't start pvmd\nagain".into(),
        };
        let line = reply.line();
        assert_eq!(
            line,
            "1\trb-pvm-add: PVM could not add node03: Can't start pvmd again\n"
        );
        let back = Reply::parse(&line).expect("parses");
        assert_eq!((back.code, back.message.contains("again")), (1, true));
        assert_eq!(
            Reply::parse("0\t\n"),
            Some(Reply {
                code: 0,
                message: String::new()
            })
        );
    }

    #[test]
    fn a_cut_or_garbled_reply_is_none() {
        for bad in ["", "0", "0\t", "x\tmessage\n", "6 Duplicate\n"] {
            assert_eq!(Reply::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn no_server_in_the_directory_is_none_and_a_server_gone_mid_answer_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(ask(dir.path(), "node03").is_none());
        // A server that reads the host and closes without a reply.
        let listener = UnixListener::bind(dir.path().join(SOCKET)).expect("bind");
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().expect("accept");
            let mut line = String::new();
            BufReader::new(&conn).read_line(&mut line).expect("line");
            line
        });
        let answer = ask(dir.path(), "node03").expect("a server answered");
        assert!(answer.expect_err("no reply").contains("went away"));
        assert_eq!(server.join().expect("server"), "node03\n");
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_left_to_its_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(SOCKET);
        drop(UnixListener::bind(&path).expect("bind"));
        assert!(path.exists(), "a socket file nobody listens on");
        let live = bind(&path).expect("the stale socket replaced");
        assert!(bind(&path).is_none(), "a live server keeps its socket");
        drop(live);
    }

    #[test]
    fn a_client_gone_before_the_server_reads_it_has_nothing_added() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = bind(&dir.path().join(SOCKET)).expect("bind");
        let mut client = UnixStream::connect(dir.path().join(SOCKET)).expect("connect");
        client.write_all(b"node03\n").expect("host");
        drop(client);
        let (conn, _) = listener.accept().expect("accept");
        let asked = std::cell::Cell::new(false);
        answer(conn, &|_: &str| {
            asked.set(true);
            Reply {
                code: 0,
                message: String::new(),
            }
        });
        assert!(!asked.get(), "the host of a client gone was added");
    }

    /// A module directory whose socket path is longer than a socket's address holds (a
    /// long home's `~/.local/state/rb/…`): the server binds there and a client reaches it.
    #[test]
    fn a_module_directory_longer_than_a_sockets_address_still_reaches_its_server() {
        let top = tempfile::tempdir().expect("tempdir");
        let dir = top.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&dir).expect("mkdir");
        assert!(dir.join(SOCKET).as_os_str().len() > SUN_PATH_MAX);
        let addr = SocketAddr::of(&dir).expect("address");
        let listener = bind(addr.path()).expect("bind");
        assert!(
            dir.join(SOCKET).exists(),
            "the socket is in the module directory"
        );
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().expect("accept");
            answer(conn, &|host: &str| Reply {
                code: 0,
                message: format!("asked {host}"),
            });
        });
        let reply = ask(&dir, "node03")
            .expect("the server answers")
            .expect("reply");
        server.join().expect("server");
        assert_eq!(reply.message, "asked node03");
    }

    #[test]
    fn the_server_answers_each_host_with_what_add_says() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(SOCKET);
        let listener = bind(&path).expect("bind");
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (conn, _) = listener.accept().expect("accept");
                answer(conn, &|host: &str| Reply {
                    code: if host == "node03" { 0 } else { 6 },
                    message: format!("asked {host}"),
                });
            }
        });
        let first = ask(dir.path(), "node03").expect("server").expect("reply");
        let second = ask(dir.path(), "node04").expect("server").expect("reply");
        server.join().expect("server");
        assert_eq!((first.code, first.message.as_str()), (0, "asked node03"));
        assert_eq!((second.code, second.message.as_str()), (6, "asked node04"));
    }
}
