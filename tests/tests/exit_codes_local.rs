//! Tier 2, one test per row of `docs/src/reference/exit-codes.md`: each program, the input
//! that row names, the exit code it documents, and a word of the message. The real binaries
//! in a temporary directory; one broker (a local lab) for the rows that need one.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use tests::{bin, local_lab, wait_until, Broker};

/// One row of the table.
struct Row {
    program: &'static str,
    args: &'static [&'static str],
    code: i32,
    /// A part of stderr that says why (empty: not checked).
    says: &'static str,
}

/// `@DIR@` in an argument is the test's directory, `@ADDR@` the broker's TCP address.
const ROWS: &[Row] = &[
    // rb
    Row {
        program: "rb",
        args: &["rsl", "check", "&(count=1)"],
        code: 0,
        says: "",
    },
    Row {
        program: "rb",
        args: &["--bogus"],
        code: 64,
        says: "unexpected argument",
    },
    Row {
        program: "rb",
        args: &["check", "@DIR@/nohosts.toml"],
        code: 64,
        says: "names no host",
    },
    Row {
        program: "rb",
        args: &["check", "--lab", "@DIR@/badnames.toml"],
        code: 64,
        says: "host[1].name",
    },
    Row {
        program: "rb",
        args: &["check", "@DIR@/secret0644.toml"],
        code: 64,
        says: "readable by others",
    },
    Row {
        program: "rb",
        args: &["rsl", "check", "(("],
        code: 64,
        says: "expected",
    },
    Row {
        program: "rb",
        args: &["rsl", "check", "@/dev/zero"],
        code: 64,
        says: "longer than 65536",
    },
    Row {
        program: "rb",
        args: &["policy", "check", "@DIR@/bad-policy.toml"],
        code: 64,
        says: "help:",
    },
    Row {
        program: "rb",
        args: &["policy", "check", "@DIR@/missing.toml"],
        code: 66,
        says: "cannot read",
    },
    Row {
        program: "rb",
        args: &[
            "status",
            "--broker",
            "@ADDR@",
            "--credential",
            "@DIR@/cred0644",
        ],
        code: 64,
        says: "readable by others",
    },
    Row {
        program: "rb",
        args: &[
            "status",
            "--broker",
            "@ADDR@",
            "--credential",
            "@DIR@/cred-malformed",
        ],
        code: 64,
        says: "credential file",
    },
    Row {
        program: "rb",
        args: &[
            "status",
            "--broker",
            "@ADDR@",
            "--secret-file",
            "@DIR@/secret0644",
        ],
        code: 64,
        says: "readable by others",
    },
    Row {
        program: "rb",
        args: &[
            "status",
            "--broker",
            "@ADDR@",
            "--credential",
            "@DIR@/cred-wrong",
        ],
        code: 77,
        says: "",
    },
    Row {
        program: "rb",
        args: &["report", "@DIR@/no-trace", "--svg", "@DIR@/u.svg"],
        code: 66,
        says: "cannot read the trace directory",
    },
    Row {
        program: "rb",
        args: &["report", "@DIR@/bad-trace", "--svg", "@DIR@/u.svg"],
        code: 64,
        says: "trace-000001.jsonl:1: not a decision-trace line",
    },
    Row {
        program: "rb",
        args: &["report", "@DIR@/bad-trace", "--svg", "@DIR@/no-dir/u.svg"],
        code: 73,
        says: "its directory does not exist",
    },
    Row {
        program: "rb",
        args: &["status", "--broker", "@DIR@/no-broker.sock"],
        code: 1,
        says: "cannot reach the broker",
    },
    // agent
    Row {
        program: "agent",
        args: &["--bogus", "true"],
        code: 64,
        says: "unknown flag `--bogus`",
    },
    Row {
        program: "agent",
        args: &["--rsl", "@/dev/zero", "true"],
        code: 64,
        says: "longer than 65536",
    },
    Row {
        program: "agent",
        args: &["--grace-s", "99999", "true"],
        code: 64,
        says: "out of range",
    },
    Row {
        program: "agent",
        args: &[
            "--broker",
            "@ADDR@",
            "--secret-file",
            "@DIR@/secret0644",
            "true",
        ],
        code: 64,
        says: "readable by others",
    },
    Row {
        program: "agent",
        args: &["--broker", "@ADDR@", "nonexistent-app-rb"],
        code: 127,
        says: "command not found",
    },
    // rb-broker
    Row {
        program: "rb-broker",
        args: &["--bogus"],
        code: 64,
        says: "unexpected argument",
    },
    Row {
        program: "rb-broker",
        args: &["--lab", "@DIR@/nohosts.toml"],
        code: 64,
        says: "names no host",
    },
    Row {
        program: "rb-broker",
        args: &["--lab", "@DIR@/secret0644.toml"],
        code: 64,
        says: "readable by others",
    },
    // rb-hostd
    Row {
        program: "rb-hostd",
        args: &["--bogus"],
        code: 64,
        says: "unexpected argument",
    },
    Row {
        program: "rb-hostd",
        args: &["--broker", "no port", "--host", "h"],
        code: 64,
        says: "",
    },
    // rb-jel
    Row {
        program: "rb-jel",
        args: &["--bogus"],
        code: 64,
        says: "unexpected argument",
    },
    Row {
        program: "rb-jel",
        args: &["members"],
        code: 2,
        says: "not inside a ResourceBroker job",
    },
    // rsh (the shim)
    Row {
        program: "rsh",
        args: &[],
        code: 1,
        says: "usage",
    },
];

fn private(path: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The files the rows name, in `dir`.
fn prepare(dir: &Path) {
    let key = "ab".repeat(32);
    private(
        &dir.join("cred0644"),
        &format!("user = eve\nkey = {key}\n"),
        0o644,
    );
    private(
        &dir.join("cred-wrong"),
        &format!("user = eve\nkey = {key}\n"),
        0o600,
    );
    private(&dir.join("cred-malformed"), "garbage\n", 0o600);
    proto::auth::write_new_secret(&dir.join("secret"), false).expect("secret");
    proto::auth::write_new_secret(&dir.join("secret0644"), false).expect("secret");
    private(&dir.join("secret0644"), &"x".repeat(32), 0o644);
    let lab = |secret: &str, hosts: &str| {
        format!(
            "[broker]\nlisten = \"127.0.0.1:0\"\ntransport = \"local\"\nstate_dir = \"{}\"\n\
             secret_file = \"{}\"\n{hosts}",
            dir.join("state").display(),
            dir.join(secret).display()
        )
    };
    let one = "[[host]]\nname = \"vhost01\"\n";
    let long = "x".repeat(254);
    let bad = format!(
        "[[host]]\nname = \"ok1\"\n[[host]]\nname = \"{long}\"\n[[host]]\nname = \"-bad\"\n"
    );
    std::fs::write(dir.join("nohosts.toml"), lab("secret", "")).expect("lab");
    std::fs::write(dir.join("badnames.toml"), lab("secret", &bad)).expect("lab");
    std::fs::write(dir.join("secret0644.toml"), lab("secret0644", one)).expect("lab");
    std::fs::write(dir.join("bad-policy.toml"), "start = 'host.lod1 > 1'\n").expect("policy");
    std::fs::create_dir(dir.join("bad-trace")).expect("mkdir");
    std::fs::write(dir.join("bad-trace/trace-000001.jsonl"), "{oops\n").expect("trace");
}

fn run(row: &Row, dir: &Path, addr: &str) -> (Option<i32>, String) {
    let args: Vec<String> = row
        .args
        .iter()
        .map(|a| {
            a.replace("@DIR@", &dir.display().to_string())
                .replace("@ADDR@", addr)
        })
        .collect();
    let out = Command::new(bin(row.program))
        .args(&args)
        .env_remove("RB_BROKER")
        .env_remove("RB_LAB")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_program_exits_with_the_documented_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    prepare(dir.path());
    let broker = Broker::start(&local_lab(1));
    let up = wait_until(Duration::from_secs(20), || {
        broker.status().filter(|s| !s.is_empty())
    });
    assert!(up.is_some(), "{}", broker.log());
    let addr = broker.tcp_addr().to_string();
    let mut wrong = Vec::new();
    for row in ROWS {
        let (code, stderr) = run(row, dir.path(), &addr);
        if code != Some(row.code) || !stderr.contains(row.says) {
            wrong.push(format!(
                "{} {:?}: exit {code:?}, documented {} (saying {:?}); stderr: {stderr}",
                row.program, row.args, row.code, row.says
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every row of the table in the book is one of [`ROWS`], and every program of [`ROWS`]
/// has a section there: the page and this test cannot drift apart.
#[test]
fn the_book_table_lists_what_this_test_checks() {
    let page =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/exit-codes.md");
    let text = std::fs::read_to_string(&page).expect("docs/src/reference/exit-codes.md");
    for row in ROWS {
        let cell = format!("| `{}` | {} |", row.program, row.code);
        assert!(text.contains(&cell), "the page has no row {cell}");
    }
}

/// A 254-character host name is named in the error by its start, not echoed whole; every
/// bad name of the file is reported.
#[test]
fn rb_check_reports_every_bad_host_name_shortly() {
    let dir = tempfile::tempdir().expect("tempdir");
    prepare(dir.path());
    let row = Row {
        program: "rb",
        args: &["check", "@DIR@/badnames.toml"],
        code: 64,
        says: "",
    };
    let (code, stderr) = run(&row, dir.path(), "");
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("host[1].name") && stderr.contains("host[2].name"),
        "{stderr}"
    );
    assert!(
        stderr.contains("254 bytes long, longer than 253"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&"x".repeat(41)),
        "the name is cut: {stderr}"
    );
    assert!(stderr.len() < 2000, "{stderr}");
}

/// The commands that answer on standard output, as a reader that stops early meets them
/// (`rb status | head -1`, `… | jq -e first`): `@SOCK@` is the broker's socket, `@STATE@` its
/// state directory, `@POLICY@` the paper policy's file.
const CLOSED_STDOUT: &[(&str, &[&str])] = &[
    ("rb", &["status", "--broker", "@SOCK@"]),
    ("rb", &["status", "--json", "--broker", "@SOCK@"]),
    ("rb", &["jobs", "--broker", "@SOCK@"]),
    ("rb", &["jobs", "--json", "--broker", "@SOCK@"]),
    ("rb", &["policy", "show", "--broker", "@SOCK@"]),
    ("rb", &["policy", "show", "--json", "--broker", "@SOCK@"]),
    (
        "rb",
        &["policy", "explain", "vhost01", "--broker", "@SOCK@"],
    ),
    ("rb", &["policy", "check", "@POLICY@"]),
    (
        "rb",
        &["policy", "replay", "@STATE@/trace", "--policy", "@POLICY@"],
    ),
    ("rb", &["report", "@STATE@/trace", "--svg", "-"]),
    ("rb", &["rsl", "spec", "&(count=1)"]),
    ("rb-hostd", &["--once"]),
];

/// A command whose reader went away before it wrote ends quietly with 141 (what a shell
/// reports for SIGPIPE, as `cat` would end): no panic, no message (Rust ignores SIGPIPE, so
/// `println!` panicked there).
#[test]
fn a_command_whose_reader_went_away_exits_141_and_says_nothing() {
    let broker = Broker::start(&local_lab(1));
    let up = wait_until(Duration::from_secs(20), || {
        broker.status().filter(|s| !s.is_empty())
    });
    assert!(up.is_some(), "{}", broker.log());
    let trace = broker.state_dir().join("trace");
    let traced = wait_until(Duration::from_secs(20), || {
        let files = std::fs::read_dir(&trace).ok()?;
        (files.count() > 0).then_some(())
    });
    assert!(traced.is_some(), "no trace file in {}", trace.display());
    let policy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policies/paper.toml");
    let mut wrong = Vec::new();
    for (program, args) in CLOSED_STDOUT {
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                a.replace("@SOCK@", &broker.socket().display().to_string())
                    .replace("@STATE@", &broker.state_dir().display().to_string())
                    .replace("@POLICY@", &policy.display().to_string())
            })
            .collect();
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(bin(program))
            .args(&args)
            .env_remove("RB_BROKER")
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // `rb-hostd --once` logs what it could not read, `rb report` says what it charted:
        // on stderr, whatever becomes of stdout. No error may be said, nothing may panic.
        let quiet = !stderr.contains("panicked")
            && !stderr.contains(": error:")
            && !stderr.contains("cannot write");
        if out.status.code() != Some(141) || !quiet {
            wrong.push(format!(
                "{program} {args:?}: exit {:?}; stderr: {stderr}",
                out.status.code()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every command of [`CLOSED_STDOUT`] is a row of the book's table with code 141.
#[test]
fn the_book_lists_the_commands_that_exit_141() {
    let page =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/exit-codes.md");
    let text = std::fs::read_to_string(&page).expect("docs/src/reference/exit-codes.md");
    for (program, _) in CLOSED_STDOUT {
        let cell = format!("| `{program}` | 141 |");
        assert!(text.contains(&cell), "the page has no row {cell}");
    }
}
