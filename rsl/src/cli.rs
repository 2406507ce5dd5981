//! The `rb rsl …` subcommands: `check` (parse and print the canonical
//! unparse) and `spec` (print the job spec as JSON). The `rb` binary owns
//! argument parsing and process exit; this module owns the behaviour, with
//! output and errors written to the streams it is given.
//!
//! Exit codes: 0 success; [`EXIT_BAD_INPUT`] (64) for any bad input — invalid RSL, an
//! invalid job spec, an unreadable `@FILE` or standard input; 1 when the output cannot be
//! written.

use std::io::Write;

use crate::{JobSpec, Mode, Rsl, RslError};

/// `rb rsl …`
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum RslCommand {
    /// Parse RSL and print its canonical form (as globus_rsl_unparse would).
    ///
    /// The default mode is --compat: accept exactly what libglobus-rsl
    /// accepts, quirks included (a closing quote as the very last byte is an
    /// error; input silently ends at a character like `~` or inside an
    /// unterminated comment). --strict reports those quirks as errors.
    Check {
        /// Strict mode: report libglobus-rsl's silent truncations as errors.
        #[arg(long, conflicts_with = "compat")]
        strict: bool,
        /// Globus-compatible mode (the default).
        #[arg(long)]
        compat: bool,
        /// RSL text, or @FILE to read a file, or @- to read standard input.
        spec: String,
    },
    /// Print a ResourceBroker job spec as pretty JSON (strict mode; a bare
    /// `(a=1)(b=2)` means `&(a=1)(b=2)`).
    Spec {
        /// RSL text, or @FILE to read a file, or @- to read standard input.
        spec: String,
    },
}

/// Exit code for bad input, whatever is wrong with it (as for the rest of `rb`: 64, usage or
/// configuration error).
pub const EXIT_BAD_INPUT: i32 = 64;

/// Run one subcommand; returns the process exit code.
pub fn run(cmd: &RslCommand, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match cmd {
        RslCommand::Check { strict, spec, .. } => {
            let mode = if *strict {
                Mode::Strict
            } else {
                Mode::Compatible
            };
            with_input(spec, err, |bytes| {
                let rsl = Rsl::parse_bytes(bytes, mode)?;
                Ok(rsl.unparse()?)
            })
            .map_or_else(|code| code, |text| emit(out, err, &text))
        }
        RslCommand::Spec { spec } => with_input(spec, err, |bytes| {
            let text = std::str::from_utf8(bytes).map_err(|_| {
                // Reuse the parser's own UTF-8 diagnosis and location.
                match Rsl::parse_bytes(bytes, Mode::Strict) {
                    Err(e) => RslError::Parse(e),
                    Ok(_) => RslError::Spec(crate::SpecError::Shape(
                        "the job spec is not valid UTF-8".into(),
                    )),
                }
            })?;
            Ok(JobSpec::from_rsl_text(text)?.to_json_pretty())
        })
        .map_or_else(|code| code, |json| emit(out, err, &json)),
    }
}

/// Exit code when the output's reader went away (`rb rsl spec … | head -1`): what a shell
/// reports for SIGPIPE, as `startup::EXIT_READER_GONE` for the other commands of `rb`.
const EXIT_READER_GONE: i32 = 141;

fn emit(out: &mut dyn Write, err: &mut dyn Write, text: &str) -> i32 {
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => EXIT_READER_GONE,
        Err(e) => {
            let _ = writeln!(err, "error: cannot write output: {e}");
            1
        }
    }
}

/// Read SPEC_OR_@FILE, run `f` on its bytes, and print any error with the
/// input's name. `Err` carries the exit code.
fn with_input(
    spec: &str,
    err: &mut dyn Write,
    f: impl FnOnce(&[u8]) -> Result<String, RslError>,
) -> Result<String, i32> {
    let (name, bytes) = match read_spec(spec) {
        Ok(input) => input,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return Err(EXIT_BAD_INPUT);
        }
    };
    f(&bytes).map_err(|e| {
        let _ = match &name {
            Some(name) => writeln!(err, "error: {name}: {e}"),
            None => writeln!(err, "error: {e}"),
        };
        EXIT_BAD_INPUT
    })
}

/// `@FILE` → the file, `@-` → standard input, anything else → itself; at most
/// [`crate::input::MAX_SPEC_BYTES`].
fn read_spec(spec: &str) -> Result<(Option<String>, Vec<u8>), String> {
    crate::input::read_spec_arg(spec).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Rb {
        #[command(subcommand)]
        cmd: RslCommand,
    }

    fn rb(args: &[&str]) -> (i32, String, String) {
        let cli = Rb::try_parse_from(std::iter::once("rsl").chain(args.iter().copied()))
            .expect("arguments parse");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&cli.cmd, &mut out, &mut err);
        let s = |v: Vec<u8>| String::from_utf8(v).expect("utf8");
        (code, s(out), s(err))
    }

    #[test]
    fn check_prints_the_canonical_form() {
        let (code, out, err) = rb(&["check", "&(executable=/bin/date)(count=4)"]);
        assert_eq!((code, err.as_str()), (0, ""));
        assert_eq!(
            out,
            "&(\"executable\" = \"/bin/date\" )(\"count\" = \"4\" )\n"
        );
    }

    #[test]
    fn check_defaults_to_compatible_mode() {
        assert_eq!(rb(&["check", "&(x=1)~junk"]).0, 0);
        assert_eq!(rb(&["check", "--compat", "x = \"abc\""]).0, EXIT_BAD_INPUT);
        let (code, out, err) = rb(&["check", "--strict", "&(x=1)~junk"]);
        assert_eq!((code, out.as_str()), (EXIT_BAD_INPUT, ""));
        assert!(err.contains("line 1, column 7"), "{err}");
        assert!(err.contains("^"), "{err}");
        assert!(Rb::try_parse_from(["rsl", "check", "--strict", "--compat", "x=1"]).is_err());
    }

    #[test]
    fn reads_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("job.rsl");
        std::fs::write(&path, "+(count>=4)(arch=\"i86Linux\")(module=\"pvm\")\n").expect("write");
        let arg = format!("@{}", path.display());
        let (code, out, _) = rb(&["spec", &arg]);
        assert_eq!(code, 0);
        let json: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(json["parts"][0]["count"]["min"], 4);
        assert_eq!(json["parts"][0]["module"], "pvm");
        let (code, _, err) = rb(&["check", "@/nonexistent/job.rsl"]);
        assert_eq!(code, EXIT_BAD_INPUT, "unreadable input is bad input too");
        assert!(err.contains("cannot read /nonexistent/job.rsl"), "{err}");
    }

    #[test]
    fn spec_errors_name_the_input() {
        let (code, out, err) = rb(&["spec", "(cuont=4)"]);
        assert_eq!((code, out.as_str()), (EXIT_BAD_INPUT, ""));
        assert!(err.contains("did you mean `count`?"), "{err}");
    }

    #[test]
    fn help_mentions_the_default_mode() {
        let help = Rb::command()
            .find_subcommand_mut("check")
            .expect("check")
            .render_long_help()
            .to_string();
        assert!(help.contains("default mode is --compat"), "{help}");
    }
}
