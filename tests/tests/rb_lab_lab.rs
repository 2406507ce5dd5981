//! Tier 3: the `rb lab` command itself, run as a user runs it (the real `rb` binary).
//!
//! Other tests (and other checkouts' tests) run labs on this machine at the same time, so a
//! test here only ever takes down labs it made: by naming them, or with a bare
//! `rb lab down` run from a checkout directory that only this test uses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tests::labtier::skip_unless_root;

/// A checkout of its own: a fresh directory holding hard links to the built `rb` and
/// `rb-lab-init` (the checkout a lab records is the directory of the binary that made it).
/// Tears down, by name, every lab it made that is still there when dropped.
struct Checkout {
    dir: tempfile::TempDir,
    labs: Vec<PathBuf>,
}

impl Checkout {
    fn new(name: &str) -> Checkout {
        let bins = tests::bin_dir();
        let dir = tempfile::Builder::new()
            .prefix(&format!("rb-lab-checkout-{name}-"))
            .tempdir_in(bins)
            .expect("temp checkout dir");
        for bin in ["rb", "rb-lab-init"] {
            let (from, to) = (bins.join(bin), dir.path().join(bin));
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).expect("copy binary");
            }
        }
        Checkout {
            dir,
            labs: Vec::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs this checkout's `rb lab ARGS`.
    fn rb_lab(&self, args: &[&str]) -> Output {
        Command::new(self.path().join("rb"))
            .arg("lab")
            .args(args)
            .env_remove("RB_LAB_INIT")
            .output()
            .expect("run rb lab")
    }

    /// `rb lab up --hosts 1`; returns the lab directory.
    fn up(&mut self) -> PathBuf {
        let out = self.rb_lab(&["up", "--hosts", "1"]);
        let text = ok("rb lab up", &out);
        let dir = text
            .lines()
            .next()
            .and_then(|l| l.rsplit_once(": "))
            .map(|(_, d)| PathBuf::from(d.trim()))
            .unwrap_or_else(|| panic!("no lab directory in\n{text}"));
        self.labs.push(dir.clone());
        dir
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        for dir in &self.labs {
            if dir.join("manifest.json").exists() {
                let d = dir.to_string_lossy();
                let out = self.rb_lab(&["down", &d]);
                if !out.status.success() {
                    eprintln!("cleanup: rb lab down {d}: {out:?}");
                }
            }
        }
    }
}

/// Standard output of a command that must have succeeded.
fn ok(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `rb lab down` without arguments once took down every lab made by `rb lab up` on the
/// machine, other people's and other checkouts' included: it takes only this checkout's.
#[test]
fn bare_lab_down_takes_down_only_labs_of_this_checkout() {
    if skip_unless_root("bare_lab_down_takes_down_only_labs_of_this_checkout") {
        return;
    }
    let mut ours = Checkout::new("ours");
    let mut theirs = Checkout::new("theirs");
    let our_lab = ours.up();
    let their_lab = theirs.up();

    let text = ok("bare rb lab down", &ours.rb_lab(&["down"]));
    assert!(
        text.contains("down in ") && text.contains(&our_lab.display().to_string()),
        "{text}"
    );
    assert!(!our_lab.exists(), "our lab is still there:\n{text}");
    assert!(their_lab.join("manifest.json").exists(), "{text}");
    let left = format!(
        "left {}: made from another checkout ({})",
        their_lab.display(),
        theirs.path().display()
    );
    assert!(text.contains(&left), "no `{left}` in\n{text}");
    assert!(
        text.contains("`rb lab down --all` takes them down"),
        "{text}"
    );
    // Their lab still works; without --dir, their checkout's commands mean their only lab
    // (whatever other labs the machine has); `rb lab status` says where it came from.
    let d = their_lab.to_string_lossy();
    ok(
        "exec in their lab",
        &theirs.rb_lab(&["exec", "node02", "true"]),
    );
    // `rb lab exec` exits with the command's own status, as the command would.
    let failed = theirs.rb_lab(&["exec", "node02", "sh", "-c", "exit 3"]);
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    let status = ok("rb lab status", &theirs.rb_lab(&["status"]));
    assert!(
        status.contains(&format!("from {}", theirs.path().display())),
        "{status}"
    );
    // Named: taken down whoever made it.
    ok("rb lab down DIR", &ours.rb_lab(&["down", &d]));
    assert!(!their_lab.exists());
}

/// `rb lab slurm`: a Slurm cluster of lab hosts that runs until it is told to stop, so that
/// overflow onto Slurm can be tried by hand on one machine.
#[test]
fn lab_slurm_runs_a_cluster_until_it_is_stopped() {
    if skip_unless_root("lab_slurm_runs_a_cluster_until_it_is_stopped") {
        return;
    }
    use std::io::BufRead;
    use std::time::Duration;

    let mut ours = Checkout::new("slurm");
    let lab = ours.up();
    let d = lab.to_string_lossy().into_owned();
    let mut child = Command::new(ours.path().join("rb"))
        .args(["lab", "slurm", "--dir", &d, "node02"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rb lab slurm");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut printed = Vec::new();
    let conf = loop {
        match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(line) => {
                let conf = line
                    .strip_prefix("clients:   SLURM_CONF=")
                    .and_then(|l| l.split_whitespace().next())
                    .map(PathBuf::from);
                printed.push(line);
                if let Some(conf) = conf {
                    break conf;
                }
            }
            Err(e) => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("wait");
                panic!(
                    "no cluster ({e}): {printed:?}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    };
    let sinfo = Command::new("sinfo")
        .args(["-h", "-N", "-o", "%N %t"])
        .env("SLURM_CONF", &conf)
        .output()
        .expect("sinfo");
    let nodes = String::from_utf8_lossy(&sinfo.stdout);
    assert!(nodes.lines().any(|l| l == "node02 idle"), "sinfo: {nodes}");

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let ended = tests::wait_until(Duration::from_secs(60), || child.try_wait().ok().flatten());
    let status = ended.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("rb lab slurm did not stop at SIGTERM")
    });
    assert!(status.success(), "rb lab slurm: {status}");
    assert!(
        !lab.join("slurm").exists(),
        "the cluster's directory is left behind"
    );
}
