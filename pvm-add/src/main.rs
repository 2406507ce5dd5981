//! `rb-pvm-add [--timeout-s N] HOST`: adds HOST to this user's running PVM virtual machine
//! as `pvm> add HOST` would, but as a plain PVM task: enrol, `pvm_addhosts`, leave. The
//! `pvm-grow` module uses it when present, because the job waits for the host meanwhile
//! and the console is slow to start: it enrols, then fetches and sets up state that grows
//! with the virtual machine (about 3 ms with one host, 13-15 ms with nine, against 3-4 ms
//! for a task that only enrols; measured in the test lab).
//!
//! libpvm3 is loaded at run time (`dlopen`), so building ResourceBroker needs no PVM.
//!
//! In a module job (`RB_MODULE_DIR` set), the first add leaves `rb-pvm-add --serve` behind,
//! enrolled, and the job's later adds go through it without loading libpvm3 or enrolling
//! again ([`served`]); the exit statuses and messages are the same either way.
//!
//! Exit status:
//! - 0: HOST was added to the virtual machine;
//! - 1: PVM could not add it; one stderr line says why, in PVM's words;
//! - 6: HOST is in the virtual machine already ("Duplicate host"; the same code as
//!   `pvm-grow`'s, modules/CONTRACT.md);
//! - 3: PVM cannot be used from here (no libpvm3, no pvmd of this user on this host): the
//!   caller falls back to the console, which explains itself;
//! - 64: usage;
//! - killed by SIGALRM (shell status 142) when `--timeout-s` passed first (a host of the
//!   virtual machine that does not answer stalls the master pvmd for minutes).

mod pvm;
mod served;

use std::time::{Duration, Instant};

use pvm::{Pvm, PVM_ALREADY, PVM_DUP_HOST};
use served::Reply;

/// The exit status for a host in the virtual machine already (modules/CONTRACT.md).
const EXIT_ALREADY_THERE: i32 = 6;

/// How long to keep asking while the master pvmd is busy with an earlier add (the job's
/// own phase-1 `add anyLinux` is usually still failing when the grant arrives).
const BUSY_LIMIT: Duration = Duration::from_secs(5);

/// The pause before asking again, after `elapsed` of "Already in progress". A refused ask
/// is one round trip to the local pvmd (tens of microseconds of its time), and the job
/// waits for its host meanwhile: every millisecond while an earlier add would normally
/// end, then less often for one that is stuck (PVM waits up to 60 s for a slave).
fn busy_pause(elapsed: Duration) -> Duration {
    Duration::from_millis(match elapsed.as_millis() {
        0..100 => 1,
        100..1000 => 10,
        _ => 100,
    })
}

#[derive(Debug, PartialEq)]
struct Args {
    timeout_s: u32,
    host: String,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Mode {
    /// `rb-pvm-add [--timeout-s N] HOST`.
    Add(Args),
    /// `rb-pvm-add --serve`: the job's enrolled task ([`served`]), started by a first add.
    Serve,
}

const USAGE: &str = "usage: rb-pvm-add [--timeout-s N] HOST";

fn main() {
    let mode = match parse_args(std::env::args().skip(1)) {
        Ok(m) => m,
        Err(msg) => {
            eprintln!("rb-pvm-add: {msg}\n{USAGE}");
            std::process::exit(64);
        }
    };
    std::process::exit(match mode {
        Mode::Add(args) => run(&args),
        Mode::Serve => serve(),
    });
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Mode, String> {
    let mut timeout_s = 50;
    let mut host = None;
    let mut serve = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--timeout-s" => {
                let value = args.next().ok_or("--timeout-s needs a value")?;
                timeout_s = value
                    .parse()
                    .map_err(|_| format!("--timeout-s {value:?}: not a whole number of seconds"))?;
            }
            "--serve" => serve = true,
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            a if a.is_empty() || a.chars().any(char::is_control) => {
                return Err(format!("{a:?} is not a host name"))
            }
            a if host.is_none() => host = Some(a.to_string()),
            a => return Err(format!("one host only (got {a:?} too)")),
        }
    }
    match (serve, host) {
        (true, None) => Ok(Mode::Serve),
        (true, Some(h)) => Err(format!("--serve takes no host (got {h:?})")),
        (false, None) => Err("no host given".into()),
        (false, Some(host)) => Ok(Mode::Add(Args { timeout_s, host })),
    }
}

fn run(args: &Args) -> i32 {
    // SAFETY: alarm only arms a timer; SIGALRM's default action ends the process.
    unsafe { libc::alarm(args.timeout_s) };
    steptimes::mark("pvmadd.start", None);
    let dir = served::module_dir();
    if let Some(answer) = dir.as_deref().and_then(|d| served::ask(d, &args.host)) {
        return say(answer.unwrap_or_else(|why| Reply {
            code: 1,
            message: format!("rb-pvm-add: cannot add {}: {why}", args.host),
        }));
    }
    let pvm = match enrolled() {
        Ok(p) => p,
        Err(message) => return say(Reply { code: 3, message }),
    };
    steptimes::mark("pvmadd.enrolled", None);
    let reply = outcome(&pvm, &args.host, add(&pvm, &args.host));
    pvm.leave();
    if dir.is_some() {
        served::start_server();
    }
    say(reply)
}

/// `rb-pvm-add --serve`: the job's enrolled task, in its module directory.
fn serve() -> i32 {
    let Some(dir) = served::module_dir() else {
        eprintln!(
            "rb-pvm-add: --serve needs the job's module directory ({})",
            served::MODULE_DIR_VAR
        );
        return 64;
    };
    let pvm = match enrolled() {
        Ok(p) => p,
        Err(message) => return say(Reply { code: 3, message }),
    };
    let code = served::serve(&pvm, &dir, |host| outcome(&pvm, host, add(&pvm, host)));
    pvm.leave();
    code
}

/// libpvm3 loaded and this process enrolled; else the line that says why (exit 3).
fn enrolled() -> Result<Pvm, String> {
    let pvm = Pvm::load().map_err(|e| format!("rb-pvm-add: {e}"))?;
    pvm.enrol().map_err(|code| {
        format!(
            "rb-pvm-add: cannot reach a pvmd of this user here: {}",
            pvm.describe(code)
        )
    })?;
    Ok(pvm)
}

/// The exit status and stderr line for PVM's `status` of adding `host`.
fn outcome(pvm: &Pvm, host: &str, status: i32) -> Reply {
    let (code, message) = match status {
        0 => (0, String::new()),
        PVM_DUP_HOST => (
            EXIT_ALREADY_THERE,
            format!("rb-pvm-add: {host} is in the virtual machine already (Duplicate host)"),
        ),
        code => (
            1,
            format!(
                "rb-pvm-add: PVM could not add {host}: {}",
                pvm.describe(code)
            ),
        ),
    };
    Reply { code, message }
}

/// Says the reply's line (if any) on stderr; its exit status.
fn say(reply: Reply) -> i32 {
    if !reply.message.is_empty() {
        eprintln!("{}", reply.message);
    }
    reply.code
}

/// Asks the master to add `host`, again while it is busy with another add.
fn add(pvm: &Pvm, host: &str) -> i32 {
    let started = Instant::now();
    loop {
        let status = pvm.add_host(host);
        let step = match status {
            PVM_ALREADY => "pvmadd.busy",
            _ => "pvmadd.answer",
        };
        steptimes::mark(step, None);
        if status != PVM_ALREADY || started.elapsed() >= BUSY_LIMIT {
            return status;
        }
        std::thread::sleep(busy_pause(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Mode, String> {
        parse_args(words.iter().map(|w| w.to_string()))
    }

    fn add_args(words: &[&str]) -> Args {
        match parse(words).expect("parses") {
            Mode::Add(a) => a,
            Mode::Serve => panic!("serve"),
        }
    }

    #[test]
    fn asks_every_millisecond_at_first_then_less_often() {
        let ms = |m| busy_pause(Duration::from_millis(m)).as_millis();
        assert_eq!(
            (ms(0), ms(99), ms(100), ms(999), ms(1000)),
            (1, 1, 10, 10, 100)
        );
    }

    #[test]
    fn arguments() {
        let a = add_args(&["node03"]);
        assert_eq!((a.host.as_str(), a.timeout_s), ("node03", 50));
        let a = add_args(&["--timeout-s", "7", "node03"]);
        assert_eq!((a.host.as_str(), a.timeout_s), ("node03", 7));
        assert_eq!(parse(&["--serve"]), Ok(Mode::Serve));
        assert!(parse(&[]).expect_err("none").contains("no host"));
        assert!(parse(&["a", "b"]).expect_err("two").contains("one host"));
        assert!(parse(&["node03\nnode04"])
            .expect_err("a line break")
            .contains("not a host name"));
        assert!(parse(&[""]).expect_err("empty").contains("not a host name"));
        assert!(parse(&["--serve", "a"])
            .expect_err("serve and host")
            .contains("no host"));
        assert!(parse(&["--timeout-s", "x", "a"])
            .expect_err("bad")
            .contains("whole number"));
        assert!(parse(&["-x", "a"])
            .expect_err("opt")
            .contains("unknown option"));
    }
}
