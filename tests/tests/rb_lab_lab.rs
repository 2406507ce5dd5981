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

/// Issue 14 item 20: `rb lab down` without arguments took down every lab made by `rb lab up`
/// on the machine, other people's and other checkouts' included.
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
