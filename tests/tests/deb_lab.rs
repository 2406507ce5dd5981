//! The Debian package on a real lab (root): `packaging/build-deb.sh` packages this build,
//! `dpkg -i` installs it (the lab's hosts share this machine's `/usr`, so one install serves
//! them all), a broker run from `/usr/bin` with no `hostd_path` starts the installed
//! `rb-hostd` on every host, and a job's `rsh anyLinux` runs through the installed shim.
//! The package's man pages render, its bash completion loads, its systemd units use only
//! keys and values of systemd.unit(5), systemd.service(5), systemd.exec(5) and
//! systemd.kill(5) and are installed disabled, and `/usr/bin/rsh` is the same file before
//! and after. The package is purged at the end, also when an assertion fails.
//!
//! The other tests run the programs from `target/`, never from `PATH` (`tests::bin`), so the
//! install cannot stand in for the build they test; and cargo runs one test binary at a
//! time, so no other test runs while the package is installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::labtier::{lab_file_with, skip_unless_root, LabOptions, TEST_TIMING};
use tests::Broker;

const PACKAGE: &str = "resourcebroker";

/// Purges the package (and the system user its postinst made, when it made one) on drop.
struct Installed {
    user_existed: bool,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let out = Command::new("dpkg").args(["-P", PACKAGE]).output();
        if !matches!(&out, Ok(o) if o.status.success()) {
            eprintln!("dpkg -P {PACKAGE} failed: {out:?}");
        }
        if !self.user_existed {
            let _ = Command::new("userdel").arg("rb").status();
        }
    }
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("ok installed"))
}

fn user_exists(name: &str) -> bool {
    Command::new("getent")
        .args(["passwd", name])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `/usr/bin/rsh` as it is: where it leads (an alternative) and what that file holds.
fn rsh_fingerprint() -> (Option<PathBuf>, Option<Vec<u8>>) {
    let path = Path::new("/usr/bin/rsh");
    (std::fs::canonicalize(path).ok(), std::fs::read(path).ok())
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn build_package(out_dir: &Path) -> PathBuf {
    let root = tests::bin_dir()
        .parent()
        .and_then(Path::parent)
        .expect("the checkout above target/debug");
    let out = run(Command::new(root.join("packaging/build-deb.sh"))
        .args(["--profile", "debug", "--no-build", "--out-dir"])
        .arg(out_dir));
    let text = String::from_utf8_lossy(&out.stdout);
    let deb = PathBuf::from(text.lines().last().unwrap_or_default().trim());
    assert!(
        deb.is_file() && deb.to_string_lossy().ends_with(".deb"),
        "build-deb.sh printed {text:?}"
    );
    deb
}

/// The package's files, from dpkg.
fn package_files() -> Vec<PathBuf> {
    let out = run(Command::new("dpkg").args(["-L", PACKAGE]));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

#[test]
fn the_package_installs_serves_a_lab_job_and_is_purged() {
    if skip_unless_root("the_package_installs_serves_a_lab_job_and_is_purged") {
        return;
    }
    if installed() {
        eprintln!("skipped: {PACKAGE} is installed on this machine; this test leaves it alone");
        return;
    }
    let out_dir = tempfile::tempdir().expect("tempdir");
    let deb = build_package(out_dir.path());
    let rsh_before = rsh_fingerprint();
    let guard = Installed {
        user_existed: user_exists("rb"),
    };
    run(Command::new("dpkg").arg("-i").arg(&deb));

    check_layout();
    let files = package_files();
    check_man_pages(&files);
    check_completion();
    for unit in [
        "/lib/systemd/system/rb-broker.service",
        "/usr/lib/systemd/user/rb-broker.service",
    ] {
        let problems = unit_problems(Path::new(unit), &files);
        assert!(problems.is_empty(), "{unit}:\n{}", problems.join("\n"));
    }
    for wants in [
        "/etc/systemd/system/multi-user.target.wants/rb-broker.service",
        "/etc/systemd/user/default.target.wants/rb-broker.service",
    ] {
        assert!(!Path::new(wants).exists(), "{wants}: installed enabled");
    }
    check_init_matches_the_layout();
    run_a_lab_job();
    assert_eq!(rsh_fingerprint(), rsh_before, "/usr/bin/rsh changed");

    drop(guard);
    assert!(!installed(), "{PACKAGE} still installed after dpkg -P");
    assert!(!Path::new("/usr/bin/rb-broker").exists());
    assert_eq!(
        rsh_fingerprint(),
        rsh_before,
        "/usr/bin/rsh changed by the removal"
    );
}

fn check_layout() {
    for f in [
        "/usr/bin/rb",
        "/usr/bin/agent",
        "/usr/bin/rb-broker",
        "/usr/bin/rb-hostd",
        "/usr/bin/rb-subagent",
        "/usr/bin/rb-jel",
        "/usr/lib/rb/shims/rsh",
        "/usr/lib/rb/shims/ssh",
        "/usr/lib/rb/shims/scp",
        "/usr/lib/rb/shims/sftp",
        "/usr/lib/rb/librb_preload.so",
        "/usr/share/rb/modules/pvm-grow",
        "/usr/share/rb/modules/lam-grow",
        "/usr/share/rb/policies/paper.toml",
        "/usr/share/man/man1/rb.1.gz",
        "/usr/share/man/man1/rb-jobs.1.gz",
        "/usr/share/man/man1/agent.1.gz",
        "/usr/share/man/man1/rb-broker.1.gz",
        "/usr/share/man/man1/rb-rsh.1.gz",
        "/usr/share/man/man1/rb-ssh.1.gz",
        "/usr/share/bash-completion/completions/rb",
        "/usr/share/zsh/vendor-completions/_rb",
        "/usr/share/fish/vendor_completions.d/rb.fish",
        "/etc/rb/lab.toml",
    ] {
        assert!(Path::new(f).exists(), "{f} is not installed");
    }
    assert!(
        !Path::new("/usr/share/man/man1/rsh.1.gz").exists()
            || std::fs::canonicalize("/usr/share/man/man1/rsh.1.gz")
                .is_ok_and(|p| !p.ends_with("rb-rsh.1.gz")),
        "the package must not take rsh(1)"
    );
    for taken in ["/usr/bin/ssh", "/usr/share/man/man1/ssh.1.gz"] {
        assert!(
            std::fs::canonicalize(taken).map_or(true, |p| !p.starts_with("/usr/lib/rb")
                && !p.ends_with("rb-ssh.1.gz")),
            "the package must not take {taken}"
        );
    }
    assert!(
        !Path::new("/usr/share/bash-completion/completions/ssh").exists()
            || !std::fs::read_to_string("/usr/share/bash-completion/completions/ssh")
                .unwrap_or_default()
                .contains("ResourceBroker"),
        "the package must not take ssh's completion"
    );
}

fn check_man_pages(files: &[PathBuf]) {
    let pages: Vec<&PathBuf> = files
        .iter()
        .filter(|f| {
            f.starts_with("/usr/share/man/man1") && f.extension().is_some_and(|e| e == "gz")
        })
        .collect();
    assert!(pages.len() >= 40, "man pages: {pages:?}");
    for page in pages {
        let out = run(Command::new("man")
            .args(["-P", "cat", "-l"])
            .arg(page)
            .env("MANWIDTH", "80"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "{}: {text}",
            page.display()
        );
    }
    let jobs =
        run(Command::new("man").args(["-P", "cat", "-l", "/usr/share/man/man1/rb-jobs.1.gz"]));
    let jobs = String::from_utf8_lossy(&jobs.stdout);
    for word in ["QUEUED", "no_host_matches", "owner_active", "reason_code"] {
        assert!(
            jobs.contains(word),
            "man rb-jobs does not explain {word}:\n{jobs}"
        );
    }
}

fn check_completion() {
    let out = run(Command::new("bash").args([
        "-c",
        "source /usr/share/bash-completion/completions/rb; complete -p rb",
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("_rb") && text.trim_end().ends_with(" rb"),
        "{text}"
    );
}

/// The keys each section may hold, from systemd.unit(5) ([Unit], [Install]) and
/// systemd.service(5), systemd.exec(5), systemd.kill(5) ([Service]): those the units use and
/// their usual neighbours. A misspelt key is the mistake this catches.
const UNIT_KEYS: &[(&str, &[&str])] = &[
    (
        "Unit",
        &[
            "Description",
            "Documentation",
            "Wants",
            "Requires",
            "After",
            "Before",
            "ConditionPathExists",
        ],
    ),
    (
        "Service",
        &[
            "Type",
            "User",
            "Group",
            "StateDirectory",
            "StateDirectoryMode",
            "Environment",
            "ExecStartPre",
            "ExecStart",
            "ExecReload",
            "ExecStop",
            "KillMode",
            "KillSignal",
            "TimeoutStopSec",
            "Restart",
            "RestartSec",
        ],
    ),
    ("Install", &["WantedBy", "RequiredBy", "Alias"]),
];

/// What is wrong with the unit file at `path` (empty: nothing).
fn unit_problems(path: &Path, package: &[PathBuf]) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut problems = Vec::new();
    let mut section = None::<&str>;
    let mut seen = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let at = format!("line {}", n + 1);
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = UNIT_KEYS.iter().find(|(s, _)| *s == name).map(|(s, _)| *s);
            if section.is_none() {
                problems.push(format!("{at}: unknown section [{name}]"));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            problems.push(format!("{at}: not KEY=VALUE: {line}"));
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let allowed = UNIT_KEYS
            .iter()
            .find(|(s, _)| Some(*s) == section)
            .is_some_and(|(_, keys)| keys.contains(&key));
        if !allowed {
            problems.push(format!("{at}: {key} is not a key of [{section:?}]"));
        }
        seen.push(key.to_string());
        problems.extend(value_problem(key, value, package).map(|p| format!("{at}: {p}")));
    }
    if !seen.iter().any(|k| k == "ExecStart") {
        problems.push("no ExecStart".into());
    }
    problems
}

/// What is wrong with one value: enumerations from systemd.service(5) and systemd.kill(5);
/// commands must be absolute and, when they are the package's, installed; man pages named
/// in Documentation must be installed.
fn value_problem(key: &str, value: &str, package: &[PathBuf]) -> Option<String> {
    let one_of = |allowed: &[&str]| {
        (!allowed.contains(&value)).then(|| format!("{key}={value}: not one of {allowed:?}"))
    };
    match key {
        "Type" => one_of(&[
            "simple",
            "exec",
            "forking",
            "oneshot",
            "dbus",
            "notify",
            "notify-reload",
            "idle",
        ]),
        "KillMode" => one_of(&["control-group", "mixed", "process", "none"]),
        "Restart" => one_of(&[
            "no",
            "on-success",
            "on-failure",
            "on-abnormal",
            "on-watchdog",
            "on-abort",
            "always",
        ]),
        "ExecStartPre" | "ExecStart" | "ExecReload" | "ExecStop" => {
            let program = value.trim_start_matches(['-', '@', ':', '+', '!']);
            let program = program.split_whitespace().next().unwrap_or_default();
            if !program.starts_with('/') {
                Some(format!("{key}: {program} is not an absolute path"))
            } else if !Path::new(program).is_file() {
                Some(format!("{key}: {program} does not exist"))
            } else {
                None
            }
        }
        "Documentation" => value.split_whitespace().find_map(|uri| {
            let page = uri.strip_prefix("man:")?;
            let (name, section) = page.strip_suffix(')')?.split_once('(')?;
            let file = PathBuf::from(format!("/usr/share/man/man{section}/{name}.{section}.gz"));
            (!package.contains(&file)).then(|| format!("Documentation: {uri} is not installed"))
        }),
        "StateDirectoryMode" => (value.len() != 4 || u32::from_str_radix(value, 8).is_err())
            .then(|| format!("{key}={value}: not an octal mode")),
        _ => None,
    }
}

/// `rb init` writes a lab file that the installed layout runs as it is: no `hostd_path`
/// (the broker's default is the rb-hostd next to /usr/bin/rb-broker).
fn check_init_matches_the_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lab = dir.path().join("lab.toml");
    run(Command::new("/usr/bin/rb")
        .args(["init", "--lab"])
        .arg(&lab)
        .arg("--secret-file")
        .arg(dir.path().join("secret")));
    let text = std::fs::read_to_string(&lab).expect("lab file");
    assert!(
        !text
            .lines()
            .any(|l| l.trim_start().starts_with("hostd_path")),
        "rb init set hostd_path:\n{text}"
    );
    run(Command::new("/usr/bin/rb").arg("check").arg(&lab));
}

fn run_a_lab_job() {
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 2,
        ..lab::LabSpec::default()
    })
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    let text: String = lab_file_with(&lab, &LabOptions::new(&[], TEST_TIMING))
        .lines()
        .filter(|l| !l.starts_with("hostd_path"))
        .map(|l| format!("{l}\n"))
        .collect();
    let broker = Broker::start_program(Path::new("/usr/bin/rb-broker"), &text);
    broker.wait_all_up(Duration::from_secs(60));
    for host in lab.hosts() {
        let out = lab
            .exec(&host.name, &["pgrep", "-a", "rb-hostd"])
            .expect("pgrep on a host");
        let ps = String::from_utf8_lossy(&out.stdout);
        assert!(
            ps.contains("/usr/bin/rb-hostd"),
            "{}: the installed rb-hostd is not the one running: {ps}",
            host.name
        );
    }
    let out = run(Command::new("/usr/bin/agent")
        .arg("--broker")
        .arg(broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(broker.secret())
        .args(["--grace-s", "1", "--", "sh", "-c"])
        .arg(
            "readlink -f \"$(command -v rsh)\"; rsh anyLinux hostname; \
             readlink -f \"$(command -v ssh)\"; ssh anyLinux hostname",
        )
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .env_remove("RB_JEL"));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"/usr/lib/rb/shims/rsh"), "{text}");
    let names: Vec<&str> = lab.hosts().iter().map(|h| h.name.as_str()).collect();
    assert!(
        lines.get(1).is_some_and(|h| names.contains(h)),
        "rsh anyLinux hostname printed {text:?}, not one of {names:?}"
    );
    assert_eq!(lines.get(2), Some(&"/usr/lib/rb/shims/rsh"), "ssh: {text}");
    assert!(
        lines.get(3).is_some_and(|h| names.contains(h)),
        "ssh anyLinux hostname printed {text:?}, not one of {names:?}"
    );
}
