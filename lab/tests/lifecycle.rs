//! Lab tier: labs side by side, teardown on panic, reaping labs of killed processes,
//! detach/attach, and that teardown leaves nothing behind.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{ssh, stdout, Names};
use lab::Lab;

#[test]
fn two_labs_at_once_do_not_clash() {
    if !common::root_or_skip() {
        return;
    }
    let a = std::thread::spawn(|| common::up(2, false));
    let b = std::thread::spawn(|| common::up(2, false));
    let (a, b) = (a.join().expect("lab a"), b.join().expect("lab b"));
    assert_ne!(a.subnet(), b.subnet());
    assert_ne!(a.dir(), b.dir());
    assert_ne!(a.hosts()[0].netns, b.hosts()[0].netns);
    for lab in [&a, &b] {
        let addr = stdout(
            "addr",
            &lab.exec("node02", &["ip", "-o", "-4", "addr", "show", "eth0"])
                .expect("exec"),
        );
        assert!(
            addr.contains(&format!("{}/24", lab.hosts()[0].address)),
            "{addr}"
        );
        assert_eq!(
            stdout("ssh", &ssh(lab, "node02", false, "hostname")),
            "node02"
        );
    }
    let listed = lab::list_labs();
    for lab in [&a, &b] {
        let s = listed
            .iter()
            .find(|s| s.dir == lab.dir())
            .expect("lab listed");
        assert!(s.owner_alive && !s.detached && !s.is_stale());
        assert_eq!(s.owner_pid, Some(std::process::id()));
        assert!(s.hosts.iter().all(|h| h.running));
    }
    common::down(a);
    common::down(b);
}

#[test]
fn a_panicking_test_still_tears_its_lab_down() {
    if !common::root_or_skip() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let lab = common::up(2, false);
        tx.send(Names::of(&lab)).expect("send names");
        panic!("deliberate panic with a lab up");
    })
    .join();
    assert!(result.is_err(), "the thread should have panicked");
    rx.recv().expect("names").assert_gone();
}

/// Not a test by itself: the body of the process that `stale_labs_are_reaped` kills.
#[test]
#[ignore = "helper process for stale_labs_are_reaped"]
fn stale_helper() {
    if std::env::var_os("RB_LAB_STALE_HELPER").is_none() {
        return;
    }
    let lab = common::up(2, false);
    println!("DIR {}", lab.dir().display());
    loop {
        std::thread::park(); // until SIGKILLed
    }
}

#[test]
fn stale_labs_are_reaped() {
    if !common::root_or_skip() {
        return;
    }
    let mut helper = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "stale_helper", "--ignored", "--nocapture"])
        .env("RB_LAB_STALE_HELPER", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start helper");
    let lines = BufReader::new(helper.stdout.take().expect("piped"));
    let dir = lines
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("DIR ").map(PathBuf::from))
        .expect("helper printed its lab dir");
    // Names first, while the helper is alive: once it is dead, any `Lab::up` on the
    // machine (other tests run in parallel) may reap its lab before we do.
    let names = Names::of(&Lab::attach(&dir).expect("attach")); // dropping leaves it running
    helper.kill().expect("SIGKILL helper");
    helper.wait().expect("wait helper");

    if let Some(summary) = lab::list_labs().into_iter().find(|s| s.dir == dir) {
        assert!(summary.is_stale(), "{summary:?}");
    }
    lab::reap_stale();
    names.assert_gone();
}

#[test]
fn detached_labs_survive_and_can_be_attached_and_torn_down() {
    if !common::root_or_skip() {
        return;
    }
    let lab = common::up(1, false);
    let names = Names::of(&lab);
    let dir = lab.detach();
    let summary = lab::list_labs()
        .into_iter()
        .find(|s| s.dir == dir)
        .expect("listed");
    assert!(summary.detached && !summary.is_stale());
    assert!(!lab::reap_stale().contains(&dir));
    {
        let again = Lab::attach(&dir).expect("attach");
        assert!(again.is_running("node02"));
        assert_eq!(
            stdout(
                "hostname",
                &again.exec("node02", &["hostname"]).expect("exec")
            ),
            "node02"
        );
    } // dropped: still running
    let again = Lab::attach(&dir).expect("attach again");
    assert!(again.is_running("node02"));
    again.down().expect("down");
    names.assert_gone();
    assert!(Lab::attach(&dir).is_err());
}
