//! Shared helpers for the differential tests: the peer-case file reader, the
//! libglobus-rsl oracle (compiled from `rsl/oracle/oracle.c` on first use)
//! and the comparison record both sides produce.

#![allow(dead_code)] // each test binary uses a different subset

pub mod gen;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

use rsl::{Mode, Rsl, SymbolTable};

/// Number of cases in `tests/data/peer-cases.txt` (REFERENCE-NOTES A.7).
pub const PEER_CASES: usize = 181;

/// One field of an outcome: text, NULL (unparse failed) or an eval error.
/// The peer file records long results as their first 400 bytes plus the
/// total length (`Truncated`), which [`Field::matches`] accepts.
#[derive(Clone, PartialEq, Eq)]
pub enum Field {
    Text(Vec<u8>),
    Truncated { prefix: Vec<u8>, total: usize },
    Null,
    Error(i32),
}

impl Field {
    /// Does `self` (a recorded result) describe `actual`?
    pub fn matches(&self, actual: &Field) -> bool {
        match (self, actual) {
            (Field::Truncated { prefix, total }, Field::Text(t)) => {
                t.len() == *total && t.starts_with(prefix)
            }
            _ => self == actual,
        }
    }
}

impl std::fmt::Debug for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Text(t) => write!(f, "{:?}", String::from_utf8_lossy(t)),
            Field::Truncated { prefix, total } => {
                write!(f, "{:?}…[{total} bytes]", String::from_utf8_lossy(prefix))
            }
            Field::Null => f.write_str("NULL"),
            Field::Error(rc) => write!(f, "ERROR rc={rc}"),
        }
    }
}

/// What a parser makes of one input (the oracle's PARSE/UNPARSE/CANON/EVAL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    ParseError,
    Parsed {
        unparse: Field,
        canon: Field,
        eval: Field,
    },
}

impl Outcome {
    pub fn parsed(&self) -> bool {
        matches!(self, Outcome::Parsed { .. })
    }

    /// Does `self` (a recorded or oracle result) describe `actual`?
    pub fn matches(&self, actual: &Outcome) -> bool {
        match (self, actual) {
            (
                Outcome::Parsed {
                    unparse,
                    canon,
                    eval,
                },
                Outcome::Parsed {
                    unparse: u,
                    canon: c,
                    eval: e,
                },
            ) => unparse.matches(u) && canon.matches(c) && eval.matches(e),
            _ => self == actual,
        }
    }
}

/// Our parser's outcome for `input` in compatible mode, with an EMPTY symbol
/// table for evaluation (exactly what the oracle does).
pub fn ours(input: &[u8]) -> Outcome {
    let Ok(rsl) = Rsl::parse_bytes(input, Mode::Compatible) else {
        return Outcome::ParseError;
    };
    let text = |r: &Rsl| match r.unparse() {
        Ok(s) => Field::Text(s.into_bytes()),
        Err(_) => Field::Null,
    };
    Outcome::Parsed {
        unparse: text(&rsl),
        canon: text(&rsl.canonicalized()),
        eval: match rsl.evaluate(&mut SymbolTable::new()) {
            Ok(evaluated) => text(&evaluated),
            Err(_) => Field::Error(1),
        },
    }
}

/// One case of the peer file.
#[derive(Debug, Clone)]
pub struct PeerCase {
    pub id: String,
    pub input: Vec<u8>,
    pub verified: Outcome,
}

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Read and decode `tests/data/peer-cases.txt` (format in its header).
pub fn peer_cases() -> Vec<PeerCase> {
    let path = data_dir().join("peer-cases.txt");
    let text = std::fs::read_to_string(&path).expect("tests/data/peer-cases.txt is readable UTF-8");
    text.split("\n=== CASE ")
        .skip(1)
        .map(|block| parse_block(block).unwrap_or_else(|e| panic!("bad case block: {e}\n{block}")))
        .collect()
}

fn parse_block(block: &str) -> Result<PeerCase, String> {
    let id = block.lines().next().ok_or("no id")?.trim().to_string();
    let start = block.find("\n<<<\n").ok_or("no <<<")? + 5;
    let end = start + block[start..].find("\n>>>").ok_or("no >>>")? + 1;
    let mut input = block.as_bytes()[start..end].to_vec();
    let header = &block[..start];
    let trailing = header
        .lines()
        .find_map(|l| l.strip_prefix("trailing_newline_in_source: "))
        .ok_or("no trailing_newline_in_source")?;
    if !trailing.starts_with("yes") {
        input.pop();
    }
    let field = |prefix: &str| -> Result<Field, String> {
        let line = header
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .ok_or(format!("no {prefix:?}"))?;
        Ok(match line {
            "NULL" | "(null)" => Field::Null,
            l if l.starts_with("ERROR rc=") => Field::Error(l[9..].parse().map_err(|_| "rc")?),
            l => match l.rsplit_once(" ...[") {
                Some((prefix, tail)) if tail.ends_with(" chars total, truncated here]") => {
                    let total = tail.split(' ').next().unwrap_or_default();
                    Field::Truncated {
                        prefix: prefix.as_bytes().to_vec(),
                        total: total.parse().map_err(|_| "truncation length")?,
                    }
                }
                _ => Field::Text(l.as_bytes().to_vec()),
            },
        })
    };
    let verified = if header.contains("\nverified: parse=OK") {
        Outcome::Parsed {
            unparse: field("  unparse: ")?,
            canon: field("  canon: ")?,
            eval: field("  eval(empty table): ")?,
        }
    } else if header.contains("\nverified: parse=ERROR") {
        Outcome::ParseError
    } else {
        return Err("no verified: line".into());
    };
    Ok(PeerCase {
        id,
        input,
        verified,
    })
}

/// The compiled oracle, or `None` (with the reason printed) when
/// libglobus-rsl is unavailable and cannot be installed.
pub fn oracle() -> Option<&'static Path> {
    static ORACLE: OnceLock<Option<PathBuf>> = OnceLock::new();
    ORACLE.get_or_init(build_oracle).as_deref()
}

const SKIP: &str = "skipped: libglobus-rsl-dev not installed (run the suite as root to install it)";

fn library_present() -> bool {
    Path::new("/usr/include/globus/globus_rsl.h").exists()
        && (Command::new("pkg-config")
            .args(["--exists", "globus-rsl"])
            .status()
            .is_ok_and(|s| s.success())
            || Path::new("/usr/lib/x86_64-linux-gnu/libglobus_rsl.so").exists())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

fn build_oracle() -> Option<PathBuf> {
    if !library_present() {
        if !is_root() {
            // Straight to the process's stderr: libtest does not capture
            // this, so the skip is visible in a normal `cargo test` run.
            let _ = writeln!(std::io::stderr(), "{SKIP}");
            return None;
        }
        let installed = Command::new("apt-get")
            .args(["install", "-y", "libglobus-rsl-dev"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            installed && library_present(),
            "running as root but `apt-get install -y libglobus-rsl-dev` failed"
        );
    }
    Some(compile("oracle"))
}

/// Compile `rsl/oracle/NAME.c` against libglobus-rsl into the target tmp dir
/// (atomically, so parallel test binaries do not trip over each other).
pub fn compile(name: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("oracle/{name}.c"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rsl-{name}"));
    let tmp = out.with_extension(format!("{}.tmp", std::process::id()));
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "globus-rsl"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|| "-I/usr/include/globus -lglobus_rsl_assist -lglobus_rsl".into());
    let status = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&tmp)
        .arg(&source)
        .args(flags.split_whitespace())
        .arg("-lglobus_common")
        .status()
        .expect("a C compiler (`cc`) is installed");
    assert!(status.success(), "compiling {} failed", source.display());
    std::fs::rename(&tmp, &out).expect("rename the oracle into place");
    out
}

/// A running `oracle --batch`: one framed input in, one record out.
pub struct OracleSession {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl OracleSession {
    pub fn start(oracle: &Path) -> Self {
        let mut child = Command::new(oracle)
            .arg("--batch")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("oracle starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        OracleSession {
            child,
            stdin,
            stdout,
        }
    }

    /// What libglobus-rsl makes of `input`.
    pub fn query(&mut self, input: &[u8]) -> Outcome {
        let mut frame = format!("{}\n", input.len()).into_bytes();
        frame.extend_from_slice(input);
        self.stdin.write_all(&frame).expect("feed the oracle");
        self.stdin.flush().expect("feed the oracle");
        let outcome = if self.line() == b"PARSE OK" {
            Outcome::Parsed {
                unparse: self.field("UNPARSE"),
                canon: self.field("CANON"),
                eval: self.field("EVAL"),
            }
        } else {
            Outcome::ParseError
        };
        assert_eq!(self.line(), b"END", "oracle protocol");
        outcome
    }

    fn line(&mut self) -> Vec<u8> {
        let mut line = Vec::new();
        self.stdout
            .read_until(b'\n', &mut line)
            .expect("read the oracle");
        assert_eq!(
            line.pop(),
            Some(b'\n'),
            "oracle died (crashed on the last input?)"
        );
        line
    }

    fn field(&mut self, tag: &str) -> Field {
        let line = String::from_utf8_lossy(&self.line()).into_owned();
        let rest = line
            .strip_prefix(tag)
            .and_then(|r| r.strip_prefix(' '))
            .unwrap_or_else(|| panic!("oracle protocol: expected {tag}, got {line:?}"));
        if rest == "NULL" {
            return Field::Null;
        }
        if let Some(rc) = rest.strip_prefix("ERROR rc=") {
            return Field::Error(rc.parse().expect("rc"));
        }
        let n: usize = rest.parse().expect("length");
        let mut text = vec![0; n + 1];
        self.stdout.read_exact(&mut text).expect("read the oracle");
        assert_eq!(text.pop(), Some(b'\n'), "oracle protocol");
        Field::Text(text)
    }
}

impl Drop for OracleSession {
    fn drop(&mut self) {
        // Closing stdin ends the batch loop; reap our own child.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Render an input for assertion messages.
pub fn show(input: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(input))
}
