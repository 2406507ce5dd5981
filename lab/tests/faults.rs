//! Lab tier: fault injection. A crash kills every process of a host at once and boot brings
//! it back fresh; a partition cuts a host off and heal reconnects it.

mod common;

use std::time::{Duration, Instant};

use common::{ssh, stdout};
use lab::LabError;

#[test]
fn crash_kills_everything_and_boot_brings_a_fresh_host_back() {
    if !common::root_or_skip() {
        return;
    }
    let lab = common::up(3, false);
    let mut daemon = lab
        .spawn("node02", &["sleep", "1000"], true)
        .expect("spawn");
    stdout(
        "mark",
        &lab.exec("node02", &["touch", "/tmp/before-crash"])
            .expect("exec"),
    );
    let _login = lab
        .fake_login("node02", "bob", "c1", Duration::from_secs(60))
        .expect("login");

    let t = Instant::now();
    lab.crash("node02").expect("crash");
    println!("crash: {} ms", t.elapsed().as_millis());
    assert!(!lab.is_running("node02"));
    assert!(
        !daemon.wait().expect("wait").success(),
        "process survived the crash"
    );
    assert!(matches!(
        lab.exec("node02", &["true"]),
        Err(LabError::HostDown { .. })
    ));
    let t = Instant::now();
    let out = ssh(&lab, "node02", false, "true");
    assert!(!out.status.success(), "ssh to a crashed host worked");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "ssh to a crashed host took {:?}",
        t.elapsed()
    );
    assert_eq!(
        stdout("node03 alive", &ssh(&lab, "node03", false, "hostname")),
        "node03"
    );

    let t = Instant::now();
    lab.boot("node02").expect("boot");
    println!("boot: {} ms", t.elapsed().as_millis());
    assert!(lab.is_running("node02"));
    assert_eq!(
        stdout("ssh after boot", &ssh(&lab, "node02", true, "hostname")),
        "node02"
    );
    let tmp = lab.exec("node02", &["ls", "/tmp"]).expect("exec");
    assert_eq!(stdout("fresh /tmp", &tmp), "", "/tmp survived the reboot");
    let who = lab.exec("node02", &["who"]).expect("exec");
    assert_eq!(stdout("fresh utmp", &who), "", "utmp survived the reboot");
    assert!(matches!(
        lab.boot("node02"),
        Err(LabError::HostRunning { .. })
    ));

    // A spawned process stopped the right way does not slow down the next crash.
    let mut daemon = lab
        .spawn("node03", &["sleep", "1000"], false)
        .expect("spawn");
    lab.kill_spawned(&mut daemon).expect("kill spawned");
    let t = Instant::now();
    lab.crash("node03").expect("crash");
    println!("crash after kill_spawned: {} ms", t.elapsed().as_millis());
    common::down(lab);
}

#[test]
fn partition_cuts_a_host_off_and_heal_reconnects_it() {
    if !common::root_or_skip() {
        return;
    }
    let lab = common::up(3, false);
    lab.partition("node03").expect("partition");
    assert!(lab.is_partitioned("node03").expect("known host"));
    assert!(lab.is_running("node03"), "a partition is not a crash");
    let t = Instant::now();
    let out = ssh(&lab, "node03", false, "true");
    assert!(!out.status.success(), "ssh into a partitioned host worked");
    println!(
        "ssh to partitioned host failed after {} ms",
        t.elapsed().as_millis()
    );
    let hop = lab
        .exec_as_user("node02", &["ssh", "node03", "true"])
        .expect("exec");
    assert!(!hop.status.success(), "node02 reached partitioned node03");
    assert_eq!(
        stdout("node04 unaffected", &ssh(&lab, "node04", false, "hostname")),
        "node04"
    );

    lab.heal("node03").expect("heal");
    assert_eq!(
        stdout("ssh after heal", &ssh(&lab, "node03", false, "hostname")),
        "node03"
    );
    let hop = lab
        .exec_as_user("node02", &["ssh", "node03", "hostname"])
        .expect("exec");
    assert_eq!(stdout("node02 -> node03 after heal", &hop), "node03");
    common::down(lab);
}
