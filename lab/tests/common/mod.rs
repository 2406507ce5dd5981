//! Helpers shared by the lab integration tests: the root check, bring-up with timing,
//! ssh from the root namespace, and the leak check after teardown.

#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use lab::{Lab, LabSpec};

/// True when the lab tier can run; prints the skip line otherwise.
pub fn root_or_skip() -> bool {
    if nix::unistd::geteuid().is_root() {
        true
    } else {
        // Straight to the stderr handle: libtest captures println!/eprintln! of passing tests.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: lab tests need root (network namespaces)"
        );
        false
    }
}

/// Brings a lab up and prints how long it took.
pub fn up(hosts: usize, rsh: bool) -> Lab {
    let started = Instant::now();
    let lab = Lab::up(&LabSpec {
        hosts,
        rsh,
        prefix: Some("t".into()),
    })
    .expect("lab up");
    println!(
        "lab bring-up: {hosts} hosts{} in {} ms ({})",
        if rsh { " with rsh" } else { "" },
        started.elapsed().as_millis(),
        lab.dir().display()
    );
    lab
}

/// Tears a lab down, prints how long it took, and checks that nothing is left.
pub fn down(lab: Lab) {
    let names = Names::of(&lab);
    let n = lab.hosts().len();
    let started = Instant::now();
    lab.down().expect("teardown");
    println!(
        "lab teardown: {n} hosts in {} ms",
        started.elapsed().as_millis()
    );
    names.assert_gone();
}

/// Standard output of a successful command, trimmed.
pub fn stdout(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `cmd` on `host` over ssh from the root namespace.
pub fn ssh(lab: &Lab, host: &str, as_user: bool, cmd: &str) -> Output {
    lab.ssh(host, as_user)
        .expect("known host")
        .arg(cmd)
        .output()
        .expect("run ssh")
}

/// Everything a lab creates outside its process tree, to check it is gone afterwards.
pub struct Names {
    pub dir: PathBuf,
    pub netns: Vec<String>,
    pub links: Vec<String>,
    pub etc: Vec<PathBuf>,
}

impl Names {
    pub fn of(lab: &Lab) -> Names {
        let mut links: Vec<String> = lab.hosts().iter().map(|h| h.veth.clone()).collect();
        links.push(format!("rbbr{}", lab.subnet()));
        Names {
            dir: lab.dir().to_path_buf(),
            netns: lab.hosts().iter().map(|h| h.netns.clone()).collect(),
            etc: lab
                .hosts()
                .iter()
                .map(|h| Path::new("/etc/netns").join(&h.netns))
                .collect(),
            links,
        }
    }

    pub fn assert_gone(&self) {
        let netns = run("ip", &["netns", "list"]);
        let links = run("ip", &["-o", "link", "show"]);
        for ns in &self.netns {
            assert!(
                !netns.split_whitespace().any(|w| w == ns),
                "netns {ns} left behind:\n{netns}"
            );
        }
        for l in &self.links {
            assert!(
                !links.contains(&format!(" {l}:")) && !links.contains(&format!(" {l}@")),
                "link {l} left behind:\n{links}"
            );
        }
        assert!(!self.dir.exists(), "{} left behind", self.dir.display());
        for e in &self.etc {
            assert!(!e.exists(), "{} left behind", e.display());
        }
    }
}

fn run(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog).args(args).output().expect("run");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
