//! What `rb-jel` fails with, and its exit codes.

use std::{io, path::PathBuf};

use jel::JelError;

/// Exit code: bad usage.
pub const EXIT_USAGE: i32 = 64;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("not inside a ResourceBroker job: the pool's socket {path} is gone ({source})\nhelp: RB_JEL is valid while its job runs; run this from a process of a running job")]
    JobGone { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Jel(#[from] JelError),
    #[error("election `{name}` has no winner")]
    NoWinner { name: String },
    #[error("no member `{name}` in the pool\nhelp: `rb-jel members` lists them (ids or names)")]
    NoSuchMember { name: String },
    #[error("--payload `{text}` is not JSON: {source}\nhelp: quote it for the shell, e.g. --payload '{{\"step\": 9}}'")]
    Payload {
        text: String,
        source: serde_json::Error,
    },
    #[error("cannot run `{cmd}`: {source}")]
    Spawn { cmd: String, source: io::Error },
    #[error("cannot serve the member relay at {path}: {source}\nhelp: the directory of RB_JEL must be writable by the job")]
    Relay { path: PathBuf, source: io::Error },
    #[error("the pool sent a reply this rb-jel does not expect to `{op}`\nhelp: use rb-jel of the same ResourceBroker version as the job's agent")]
    Unexpected { op: &'static str },
    #[error("cannot write the output: {0}")]
    Output(io::Error),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::JobGone { .. } => 2,
            CliError::Jel(e) => e.exit_code(),
            CliError::NoWinner { .. } | CliError::NoSuchMember { .. } => 1,
            CliError::Payload { .. } => EXIT_USAGE,
            CliError::Spawn { source, .. } if source.kind() == io::ErrorKind::NotFound => 127,
            CliError::Spawn { .. } => 126,
            CliError::Relay { .. } | CliError::Unexpected { .. } => 69,
            CliError::Output(_) => 1,
        }
    }
}

/// A connection error that means the job is gone (its socket removed, nobody listening)
/// becomes [`CliError::JobGone`].
pub fn connect_error(e: JelError) -> CliError {
    match e {
        JelError::Connect { path, source }
            if matches!(
                source.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            CliError::JobGone { path, source }
        }
        e => CliError::Jel(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_is_not_inside_a_job_exit_2() {
        let e = connect_error(JelError::Connect {
            path: "/x/jel.sock".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("not inside a ResourceBroker job"));
        assert_eq!(CliError::Jel(JelError::NotInJob).exit_code(), 2);
    }

    #[test]
    fn a_command_not_found_is_127_and_not_executable_126() {
        let spawn = |kind| CliError::Spawn {
            cmd: "x".into(),
            source: io::Error::from(kind),
        };
        assert_eq!(spawn(io::ErrorKind::NotFound).exit_code(), 127);
        assert_eq!(spawn(io::ErrorKind::PermissionDenied).exit_code(), 126);
    }
}
