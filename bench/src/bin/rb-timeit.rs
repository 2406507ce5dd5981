//! `rb-timeit REPS COMMAND [--then COMMAND]…`: runs each COMMAND REPS times and prints each
//! run's wall time in milliseconds (fork+exec+wait; stdin and stdout on /dev/null, stderr
//! inherited), one per line — or `fail STATUS` for a run that did not exit 0.
//!
//! COMMAND is `[-u NAME]… [NAME=VALUE]… PROGRAM [ARGS…]`, like env(1) but without the extra
//! exec: the environment edits apply to that command only.
//!
//! With one COMMAND the runs go one after another and each line is the bare figure. With
//! several, the runs are interleaved — round r runs every command once, starting with
//! command r mod N — so a baseline and its variants meet the same machine conditions, and
//! each line starts with the command's index: `K MS` or `K fail STATUS`. The benchmarks
//! run it inside lab hosts so that only the commands themselves are timed.
//!
//! With `RB_STEP_TIMES` set, each run's start and end are steps too (`timeit.spawn`,
//! `timeit.reaped`; see the `steptimes` crate): the exec of the program and its reaping.

use std::{
    process::{Command, ExitCode, Stdio},
    time::Instant,
};

const USAGE: &str = "usage: rb-timeit REPS [-u NAME]… [NAME=VALUE]… PROGRAM [ARGS…] [--then [-u NAME]… [NAME=VALUE]… PROGRAM [ARGS…]]…";

/// One command to time, with its own environment edits.
#[derive(Debug, PartialEq)]
struct Timed {
    unset: Vec<String>,
    set: Vec<(String, String)>,
    program: String,
    args: Vec<String>,
}

impl Timed {
    fn parse(words: &[String]) -> Result<Timed, String> {
        let mut unset = Vec::new();
        let mut set = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let word = &words[i];
            if word == "-u" {
                let name = words.get(i + 1).ok_or("-u needs a variable name")?;
                unset.push(name.clone());
                i += 2;
            } else if let Some((name, value)) = assignment(word) {
                set.push((name.to_string(), value.to_string()));
                i += 1;
            } else {
                break;
            }
        }
        let program = words.get(i).ok_or("a command has no program")?.clone();
        Ok(Timed {
            unset,
            set,
            program,
            args: words[i + 1..].to_vec(),
        })
    }

    /// Runs the command once: its wall time in ms, or why it failed.
    fn run(&self) -> Result<Result<f64, String>, String> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for name in &self.unset {
            command.env_remove(name);
        }
        command.envs(self.set.iter().map(|(n, v)| (n, v)));
        steptimes::mark("timeit.spawn", None);
        let started = Instant::now();
        let status = command.status();
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        steptimes::mark("timeit.reaped", None);
        match status {
            Ok(s) if s.success() => Ok(Ok(ms)),
            Ok(s) => Ok(Err(format!("fail {s}"))),
            Err(e) => Err(format!("rb-timeit: cannot run {}: {e}", self.program)),
        }
    }
}

/// `NAME=VALUE` with a shell-style variable name.
fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let valid = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some((name, value))
}

fn parse(args: &[String]) -> Result<(usize, Vec<Timed>), String> {
    let reps = args
        .first()
        .and_then(|r| r.parse::<usize>().ok())
        .ok_or("REPS must be a whole number")?;
    let commands = args[1..]
        .split(|w| w == "--then")
        .map(Timed::parse)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((reps, commands))
}

/// The order of the commands in round `round`: a rotation, so none always goes first.
fn round_order(round: usize, commands: usize) -> impl Iterator<Item = usize> {
    (0..commands).map(move |k| (round + k) % commands)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (reps, commands) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("rb-timeit: {e}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    let several = commands.len() > 1;
    for round in 0..reps {
        for k in round_order(round, commands.len()) {
            let line = match commands[k].run() {
                Ok(Ok(ms)) => format!("{ms:.3}"),
                Ok(Err(fail)) => fail,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(127);
                }
            };
            if several {
                println!("{k} {line}");
            } else {
                println!("{line}");
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn one_command_keeps_its_arguments_whole() {
        let (reps, cmds) = parse(&words("3 ssh node03 A=1 true")).expect("parses");
        assert_eq!(reps, 3);
        assert_eq!(cmds.len(), 1);
        assert_eq!(cmds[0].program, "ssh");
        assert_eq!(cmds[0].args, words("node03 A=1 true"));
        assert!(cmds[0].set.is_empty());
    }

    #[test]
    fn environment_edits_belong_to_their_own_command() {
        let (_, cmds) = parse(&words(
            "2 -u RB_AGENT rsh n true --then X=[\"ssh\"] -u Y shim n true --then rsh any true",
        ))
        .expect("parses");
        assert_eq!(cmds.len(), 3);
        assert_eq!(cmds[0].unset, ["RB_AGENT"]);
        assert_eq!(cmds[1].set, [("X".to_string(), "[\"ssh\"]".to_string())]);
        assert_eq!(cmds[1].unset, ["Y"]);
        assert_eq!(cmds[1].program, "shim");
        assert!(cmds[2].unset.is_empty() && cmds[2].set.is_empty());
    }

    #[test]
    fn bad_invocations_are_refused() {
        assert!(parse(&words("x true")).is_err());
        assert!(parse(&words("2 -u")).is_err());
        assert!(parse(&words("2 A=1")).is_err());
        assert!(parse(&words("2 true --then")).is_err());
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn a_path_with_an_equals_sign_is_a_program_not_an_assignment() {
        let (_, cmds) = parse(&words("1 ./a=b")).expect("parses");
        assert_eq!(cmds[0].program, "./a=b");
    }

    #[test]
    fn every_round_runs_each_command_once_and_the_first_rotates() {
        for round in 0..5 {
            let mut order: Vec<usize> = round_order(round, 3).collect();
            assert_eq!(order[0], round % 3);
            order.sort();
            assert_eq!(order, [0, 1, 2]);
        }
    }
}
