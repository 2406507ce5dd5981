//! `rb-pvm-add [--timeout-s N] HOST`: adds HOST to this user's running PVM virtual machine
//! as `pvm> add HOST` would, but as a plain PVM task: enrol, `pvm_addhosts`, leave. The
//! `pvm-grow` module uses it when present, because the job waits for the host meanwhile
//! and the console is slow to start: it enrols, then fetches and sets up state that grows
//! with the virtual machine (about 3 ms with one host, 13-15 ms with nine, against 3-4 ms
//! for a task that only enrols; measured in the test lab).
//!
//! libpvm3 is loaded at run time (`dlopen`), so building ResourceBroker needs no PVM.
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

use std::time::{Duration, Instant};

use pvm::{Pvm, PVM_ALREADY, PVM_DUP_HOST};

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

#[derive(Debug)]
struct Args {
    timeout_s: u32,
    host: String,
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("rb-pvm-add: {msg}\nusage: rb-pvm-add [--timeout-s N] HOST");
            std::process::exit(64);
        }
    };
    std::process::exit(run(&args));
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut timeout_s = 50;
    let mut host = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--timeout-s" => {
                let value = args.next().ok_or("--timeout-s needs a value")?;
                timeout_s = value
                    .parse()
                    .map_err(|_| format!("--timeout-s {value:?}: not a whole number of seconds"))?;
            }
            a if a.starts_with('-') => return Err(format!("unknown option {a}")),
            a if host.is_none() => host = Some(a.to_string()),
            a => return Err(format!("one host only (got {a:?} too)")),
        }
    }
    let host = host.ok_or("no host given")?;
    Ok(Args { timeout_s, host })
}

fn run(args: &Args) -> i32 {
    // SAFETY: alarm only arms a timer; SIGALRM's default action ends the process.
    unsafe { libc::alarm(args.timeout_s) };
    steptimes::mark("pvmadd.start", None);
    let pvm = match Pvm::load() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rb-pvm-add: {e}");
            return 3;
        }
    };
    if let Err(code) = pvm.enrol() {
        eprintln!(
            "rb-pvm-add: cannot reach a pvmd of this user here: {}",
            pvm.describe(code)
        );
        return 3;
    }
    steptimes::mark("pvmadd.enrolled", None);
    let status = add(&pvm, &args.host);
    pvm.leave();
    match status {
        0 => 0,
        PVM_DUP_HOST => {
            eprintln!(
                "rb-pvm-add: {} is in the virtual machine already (Duplicate host)",
                args.host
            );
            EXIT_ALREADY_THERE
        }
        code => {
            eprintln!(
                "rb-pvm-add: PVM could not add {}: {}",
                args.host,
                pvm.describe(code)
            );
            1
        }
    }
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

    fn parse(words: &[&str]) -> Result<Args, String> {
        parse_args(words.iter().map(|w| w.to_string()))
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
        let a = parse(&["node03"]).expect("host");
        assert_eq!((a.host.as_str(), a.timeout_s), ("node03", 50));
        let a = parse(&["--timeout-s", "7", "node03"]).expect("timeout");
        assert_eq!((a.host.as_str(), a.timeout_s), ("node03", 7));
        assert!(parse(&[]).expect_err("none").contains("no host"));
        assert!(parse(&["a", "b"]).expect_err("two").contains("one host"));
        assert!(parse(&["--timeout-s", "x", "a"])
            .expect_err("bad")
            .contains("whole number"));
        assert!(parse(&["-x", "a"])
            .expect_err("opt")
            .contains("unknown option"));
    }
}
