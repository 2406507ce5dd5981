//! Standard output for the binaries' answers (`rb status`, `rb jobs`, `rb policy replay`…).
//!
//! Rust ignores SIGPIPE, so when the reader of a pipe goes away (`rb status | head -1`,
//! `rb status --json | jq -e 'first'`) a write fails with `EPIPE`, and `println!` panics on
//! it: a backtrace where `cat` or `git` would have ended quietly. Writes made here return the
//! failure instead; the caller passes it up, and the program ends with
//! [`EXIT_READER_GONE`] and says nothing when nobody reads any more, or reports any other
//! failure (a full disk behind `> FILE`) with exit code 1.

use std::{
    fmt,
    io::{self, Write},
    process::ExitCode,
};

/// Exit code when standard output's reader went away: what a shell reports for a program
/// killed by SIGPIPE (128 + 13), as `cat` would end in the same place.
pub const EXIT_READER_GONE: u8 = 141;

/// Standard output could not be written.
#[derive(Debug)]
pub enum OutputError {
    /// Its reader went away (a closed pipe): nothing went wrong, nobody reads any more.
    ReaderGone,
    /// Anything else (`ENOSPC` behind `> FILE`, a closed descriptor).
    Failed(io::Error),
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputError::ReaderGone => f.write_str("standard output was closed by its reader"),
            OutputError::Failed(e) => write!(f, "cannot write to standard output: {e}"),
        }
    }
}

impl std::error::Error for OutputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutputError::ReaderGone => None,
            OutputError::Failed(e) => Some(e),
        }
    }
}

impl From<io::Error> for OutputError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::BrokenPipe {
            OutputError::ReaderGone
        } else {
            OutputError::Failed(e)
        }
    }
}

impl OutputError {
    /// The exit code: [`EXIT_READER_GONE`] when the reader went away, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            OutputError::ReaderGone => EXIT_READER_GONE,
            OutputError::Failed(_) => 1,
        }
    }

    /// Ends a command that returns its exit code: says why on stderr (`PROGRAM: error: …`)
    /// unless the reader went away, and gives the code.
    pub fn exit(&self, program: &str) -> ExitCode {
        if !matches!(self, OutputError::ReaderGone) {
            eprintln!("{program}: error: {self}");
        }
        ExitCode::from(self.exit_code())
    }
}

/// Writes `bytes` (text, or an answer passed on as it came) to standard output and flushes
/// it.
pub fn print(bytes: impl AsRef<[u8]>) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_all(bytes.as_ref())?;
    out.flush()?;
    Ok(())
}

/// Writes formatted text to standard output and flushes it (what [`out!`](crate::out) and
/// [`outln!`](crate::outln) call).
pub fn print_fmt(args: fmt::Arguments<'_>) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()?;
    Ok(())
}

/// `print!` that returns a [`OutputError`] instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::print_fmt(::std::format_args!($($arg)*))
    };
}

/// `println!` that returns a [`OutputError`] instead of panicking.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::print("\n")
    };
    ($($arg:tt)*) => {
        $crate::output::print_fmt(::std::format_args!("{}\n", ::std::format_args!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_is_the_reader_gone_and_anything_else_a_failure() {
        let gone = OutputError::from(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(matches!(gone, OutputError::ReaderGone));
        assert_eq!(gone.exit_code(), EXIT_READER_GONE);
        let full = OutputError::from(io::Error::from_raw_os_error(28)); // ENOSPC
        assert!(matches!(full, OutputError::Failed(_)));
        assert_eq!(full.exit_code(), 1);
        assert!(full.to_string().contains("cannot write to standard output"));
    }
}
