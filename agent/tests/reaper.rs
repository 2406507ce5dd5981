//! The agent's reaper in a process of its own (it reaps this process's children): adopted
//! children are reaped, the agent's own never, however fast they exit.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use agent::{proctree, reaper};

/// Polls `cond` every 5 ms for up to 10 s.
fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn is_zombie(pid: u32) -> bool {
    proctree::find(&proctree::table(), pid as i32).is_some_and(|p| p.zombie)
}

#[test]
fn own_children_keep_their_status_and_adopted_ones_are_reaped() {
    proctree::become_subreaper().expect("PR_SET_CHILD_SUBREAPER");
    // Our own child, exiting at once with 7: registered before the reaper can see it.
    let mut own = reaper::spawn_own(
        || Command::new("sh").args(["-c", "exit 7"]).spawn(),
        |c| Some(c.id()),
    )
    .expect("sh");
    // A grandchild whose parent exits: adopted by us (a subreaper), then it exits too.
    let out = Command::new("sh")
        .args(["-c", "sh -c 'sleep 0.2' >/dev/null 2>&1 & echo $!"])
        .output()
        .expect("sh");
    let adopted: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("pid");
    assert!(wait_for(|| is_zombie(own.id())), "own child never ended");
    let me = std::process::id() as i32;
    let parent = |pid: u32| proctree::find(&proctree::table(), pid as i32).map(|p| p.ppid);
    assert_eq!(parent(adopted), Some(me), "not adopted by the subreaper");
    assert!(wait_for(|| {
        reaper::reap_adopted();
        parent(adopted).is_none()
    }));
    assert!(
        is_zombie(own.id()),
        "the reaper took our own child's status"
    );
    assert_eq!(own.wait().expect("wait").code(), Some(7));
}
