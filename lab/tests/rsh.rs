//! Lab tier: real rsh (netkit rsh-client and in.rshd under openbsd-inetd) between hosts,
//! authenticated by the lab user's ~/.rhosts.

mod common;

use std::path::Path;

use common::stdout;

#[test]
fn rsh_between_hosts_as_the_lab_user() {
    if !common::root_or_skip() {
        return;
    }
    let needed = ["/usr/sbin/in.rshd", "/usr/sbin/inetd", "/usr/bin/rsh"];
    if let Some(missing) = needed.iter().find(|p| !Path::new(p).exists()) {
        println!("skipped: {missing} missing (install rsh-server rsh-client openbsd-inetd)");
        return;
    }
    let lab = common::up(2, true);
    let out = lab
        .exec_as_user("node02", &["rsh", "node03", "hostname; id -un"])
        .expect("exec");
    assert_eq!(
        stdout("rsh node02 -> node03", &out),
        format!("node03\n{}", lab.user().name)
    );
    let out = lab
        .exec_as_user("node03", &["rsh", "node02", "hostname"])
        .expect("exec");
    assert_eq!(stdout("rsh node03 -> node02", &out), "node02");
    common::down(lab);
}
