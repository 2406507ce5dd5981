//! Running the real tools (`ip`, `nsenter`, `ssh-keygen`, ...) with errors that name the
//! command, its stderr and a help line.

use std::ffi::OsStr;
use std::process::{Command, Output};

use crate::LabError;

/// The command line of `cmd` as one readable string (program and arguments).
pub(crate) fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One argument, quoted for display when it is not a plain word.
fn quote(arg: &OsStr) -> String {
    let s = arg.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` to completion and returns its output, whatever its exit status.
pub(crate) fn output(cmd: &mut Command, help: &str) -> Result<Output, LabError> {
    cmd.output().map_err(|source| LabError::Spawn {
        command: describe(cmd),
        source,
        help: help.to_string(),
    })
}

/// Runs `cmd` to completion; a non-zero exit is a [`LabError::Command`].
pub(crate) fn run(cmd: &mut Command, help: &str) -> Result<Output, LabError> {
    let out = output(cmd, help)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(failed(cmd, &out, help))
    }
}

/// The [`LabError::Command`] for a finished command.
pub(crate) fn failed(cmd: &Command, out: &Output, help: &str) -> LabError {
    LabError::Command {
        command: describe(cmd),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        help: help.to_string(),
    }
}

/// Runs `ip <args>`.
pub(crate) fn ip(args: &[&str]) -> Result<(), LabError> {
    run(
        Command::new("ip").args(args),
        "check that iproute2 is installed and that the name is not used by something else (`ip link`, `ip netns list`)",
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_quotes_only_when_needed() {
        let mut cmd = Command::new("ip");
        cmd.args(["link", "set", "rb5n02", "down"]);
        assert_eq!(describe(&cmd), "ip link set rb5n02 down");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo it's"]);
        assert_eq!(describe(&cmd), r"sh -c 'echo it'\''s'");
    }

    #[test]
    fn run_reports_stderr_and_status() {
        let err = run(
            Command::new("sh").args(["-c", "echo oops >&2; exit 3"]),
            "do X",
        )
        .expect_err("exit 3 must fail");
        let text = err.to_string();
        assert!(text.contains("oops"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(text.contains("help: do X"), "{text}");
    }
}
