//! `rb-timeit REPS CMD [ARGS…]`: runs CMD REPS times, one after another (stdin and stdout
//! on /dev/null, stderr inherited), and prints each run's wall time in milliseconds, one
//! per line — or `fail STATUS` for a run that did not exit 0. The benchmarks run it inside
//! lab hosts so that only the command itself is timed.

use std::{
    process::{Command, ExitCode, Stdio},
    time::Instant,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps = args.first().and_then(|r| r.parse::<usize>().ok());
    let (Some(reps), Some(program)) = (reps, args.get(1)) else {
        eprintln!("usage: rb-timeit REPS CMD [ARGS…]");
        return ExitCode::from(64);
    };
    for _ in 0..reps {
        let started = Instant::now();
        let status = Command::new(program)
            .args(&args[2..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        match status {
            Ok(s) if s.success() => println!("{ms:.3}"),
            Ok(s) => println!("fail {s}"),
            Err(e) => {
                eprintln!("rb-timeit: cannot run {program}: {e}");
                return ExitCode::from(127);
            }
        }
    }
    ExitCode::SUCCESS
}
