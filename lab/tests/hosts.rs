//! Lab tier: four hosts with their own hostnames, sshd, /tmp and logins.

mod common;

use std::time::Duration;

use common::{ssh, stdout};

#[test]
fn four_hosts_have_own_names_ssh_tmp_and_logins() {
    if !common::root_or_skip() {
        return;
    }
    let lab = common::up(4, false);
    let names: Vec<String> = lab.hosts().iter().map(|h| h.name.clone()).collect();
    assert_eq!(names, ["node02", "node03", "node04", "node05"]);
    let s = lab.subnet();
    assert_eq!(lab.gateway().to_string(), format!("10.77.{s}.1"));
    assert!(lab.dir().starts_with("/var/tmp"));

    // Own hostname (UTS) per host, via nsenter and via ssh as root and as the lab user.
    for h in lab.hosts() {
        assert_eq!(
            stdout("hostname", &lab.exec(&h.name, &["hostname"]).expect("exec")),
            h.name
        );
        assert_eq!(
            stdout("ssh root", &ssh(&lab, &h.name, false, "hostname")),
            h.name
        );
        let who = stdout("ssh user", &ssh(&lab, &h.name, true, "id -un; hostname"));
        assert_eq!(who, format!("{}\n{}", lab.user().name, h.name));
    }

    // Host to host by name, resolved inside the lab (/etc/hosts overlay).
    let user_hop = lab
        .exec_as_user("node02", &["ssh", "node03", "hostname; id -u"])
        .expect("exec");
    assert_eq!(
        stdout("user ssh node02 -> node03", &user_hop),
        format!("node03\n{}", lab.user().uid)
    );
    let key = lab.root_key();
    let root_hop = lab
        .exec(
            "node02",
            &[
                "ssh",
                "-i",
                key.to_str().expect("utf-8 path"),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "node03",
                "hostname",
            ],
        )
        .expect("exec");
    assert_eq!(stdout("root ssh node02 -> node03", &root_hop), "node03");
    let gw = stdout(
        "getent",
        &lab.exec("node04", &["getent", "hosts", "node01"])
            .expect("exec"),
    );
    assert!(gw.starts_with(&format!("10.77.{s}.1 ")), "{gw}");

    // Private /tmp per host (also seen over ssh, i.e. by sshd's children).
    stdout(
        "write tmp",
        &lab.exec("node02", &["sh", "-c", "echo only-here > /tmp/mark"])
            .expect("exec"),
    );
    assert_eq!(
        stdout("ssh cat", &ssh(&lab, "node02", false, "cat /tmp/mark")),
        "only-here"
    );
    let other = lab.exec("node03", &["cat", "/tmp/mark"]).expect("exec");
    assert!(!other.status.success(), "node03 sees node02's /tmp");

    // A fake login on node03, idle 90 minutes, shown by who -u there only.
    let login = lab
        .fake_login("node03", "alice", "t1", Duration::from_secs(90 * 60))
        .expect("fake login");
    let who3 = stdout(
        "who node03",
        &lab.exec("node03", &["who", "-u"]).expect("exec"),
    );
    let line = who3
        .lines()
        .find(|l| l.starts_with("alice"))
        .unwrap_or_else(|| panic!("no alice in:\n{who3}"));
    assert!(line.contains("shm/rbtty-t1"), "{line}");
    assert!(
        line.contains("01:30") || line.contains("01:31"),
        "idle not ~90 min: {line}"
    );
    let who2 = stdout(
        "who node02",
        &lab.exec("node02", &["who", "-u"]).expect("exec"),
    );
    assert!(
        !who2.contains("alice"),
        "node02 sees node03's login:\n{who2}"
    );
    login.touch().expect("touch");
    let who3 = stdout(
        "who node03",
        &lab.exec("node03", &["who", "-u"]).expect("exec"),
    );
    let line = who3
        .lines()
        .find(|l| l.starts_with("alice"))
        .expect("alice still there");
    assert!(
        line.contains("  .  ") || line.contains(" . "),
        "not active after touch: {line}"
    );
    login.end().expect("end login");
    let who3 = stdout(
        "who node03",
        &lab.exec("node03", &["who", "-u"]).expect("exec"),
    );
    assert!(!who3.contains("alice"), "login not ended:\n{who3}");

    // The lab user's files.
    let rhosts = lab
        .exec_as_user("node02", &["stat", "-c", "%a %U", ".rhosts", ".bashrc"])
        .expect("exec");
    let expected = format!("600 {0}\n644 {0}", lab.user().name);
    assert_eq!(stdout("stat", &rhosts), expected);
    assert_eq!(
        std::fs::metadata(lab.user().home.join(".bashrc"))
            .expect("bashrc")
            .len(),
        0
    );
    common::down(lab);
}
