//! Who made a lab and from where ([`Creator`], recorded in every manifest), which labs a
//! bare `rb lab down` takes ([`plan_down`]), and which lab `rb lab exec|crash|…` without
//! `--dir` means ([`default_candidates`]).
//!
//! Several people and several checkouts (each with its tests) may run labs on one machine.
//! A bare `rb lab down` takes down only the labs made by the same user from the same
//! checkout, and never a lab that a running process owns (a test tears its own lab down when
//! it ends); `--all` takes every lab not owned by a running process; `rb lab down DIR` takes
//! the one lab named. What is left is said, with the reason and the command that takes it.
//!
//! The *checkout* is the directory of the binary that made the lab (`target/debug` of a
//! checkout); a test binary in `target/debug/deps` counts as its `target/debug`.
//! The *user* is the real uid, plus `SUDO_UID` when the command ran through sudo (root
//! is needed to make a lab, so the uid alone is usually 0).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::LabSummary;

/// Who made a lab, from which checkout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Creator {
    /// Real uid of the process that made the lab.
    pub uid: u32,
    /// `SUDO_UID` of that process, when it ran through sudo.
    pub sudo_uid: Option<u32>,
    /// Directory of the binary that made the lab (see the module docs).
    pub checkout: PathBuf,
}

impl Creator {
    /// The creator this process would record.
    pub fn current() -> Creator {
        let exe = std::env::current_exe().unwrap_or_default();
        Creator {
            uid: nix::unistd::getuid().as_raw(),
            sudo_uid: std::env::var("SUDO_UID").ok().and_then(|s| s.parse().ok()),
            checkout: checkout_of(&exe),
        }
    }

    /// The user part, for people: `uid 0` or `uid 0 (sudo uid 1000)`.
    pub fn user(&self) -> String {
        match self.sudo_uid {
            Some(s) => format!("uid {} (sudo uid {s})", self.uid),
            None => format!("uid {}", self.uid),
        }
    }

    fn same_user(&self, other: &Creator) -> bool {
        (self.uid, self.sudo_uid) == (other.uid, other.sudo_uid)
    }
}

/// The checkout of an executable: its directory, or the parent of `deps/` (test binaries).
pub fn checkout_of(exe: &Path) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("/"));
    match dir.file_name() {
        Some(name) if name == "deps" => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// Why `rb lab down` leaves a lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    /// Made from another checkout (the one given).
    OtherCheckout(PathBuf),
    /// Made by another user (described as by [`Creator::user`]).
    OtherUser(String),
    /// Made by an earlier version that did not record its creator.
    Unrecorded,
    /// Owned by this running process (a test); it tears the lab down when it ends.
    InUse(Option<u32>),
    /// The manifest cannot be read (why).
    Unreadable(String),
}

/// What `rb lab down` (without DIR) does: the labs it takes down and those it leaves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DownPlan {
    /// Lab directories to tear down.
    pub take: Vec<PathBuf>,
    /// Lab directories left, and why.
    pub left: Vec<(PathBuf, Left)>,
}

/// Chooses the labs of a bare `rb lab down` (`all`: `--all`) made by `me`.
pub fn plan_down(labs: &[LabSummary], me: &Creator, all: bool) -> DownPlan {
    let mut plan = DownPlan::default();
    for lab in labs {
        match why_left(lab, me, all) {
            Some(why) => plan.left.push((lab.dir.clone(), why)),
            None => plan.take.push(lab.dir.clone()),
        }
    }
    plan
}

fn why_left(lab: &LabSummary, me: &Creator, all: bool) -> Option<Left> {
    if let Some(p) = &lab.problem {
        return Some(Left::Unreadable(p.clone()));
    }
    if !lab.detached && lab.owner_alive {
        return Some(Left::InUse(lab.owner_pid));
    }
    if all {
        return None;
    }
    match &lab.made_by {
        None => Some(Left::Unrecorded),
        Some(c) if !c.same_user(me) => Some(Left::OtherUser(c.user())),
        Some(c) if c.checkout != me.checkout => Some(Left::OtherCheckout(c.checkout.clone())),
        Some(_) => None,
    }
}

/// The labs a command without `--dir` may mean: the labs made by `rb lab up` by `me` from
/// this checkout, or, when there are none, every lab made by `rb lab up`.
pub fn default_candidates(labs: &[LabSummary], me: &Creator) -> Vec<PathBuf> {
    let detached = labs.iter().filter(|l| l.detached && l.problem.is_none());
    let ours: Vec<PathBuf> = detached
        .clone()
        .filter(|l| l.made_by.as_ref() == Some(me))
        .map(|l| l.dir.clone())
        .collect();
    if ours.is_empty() {
        detached.map(|l| l.dir.clone()).collect()
    } else {
        ours
    }
}

impl DownPlan {
    /// One line per lab left, then what to do about them; empty when nothing is left.
    pub fn report_left(&self) -> String {
        let mut s = String::new();
        for (dir, why) in &self.left {
            let _ = writeln!(s, "left {}: {}", dir.display(), describe(why));
        }
        let count = |f: fn(&Left) -> bool| self.left.iter().filter(|(_, w)| f(w)).count();
        let others = count(|w| {
            matches!(
                w,
                Left::OtherCheckout(_) | Left::OtherUser(_) | Left::Unrecorded
            )
        });
        if others > 0 {
            let _ = writeln!(
                s,
                "{} of other checkouts or users left; `rb lab down --all` takes them down",
                labs(others)
            );
        }
        let in_use = count(|w| matches!(w, Left::InUse(_)));
        if in_use > 0 {
            let _ = writeln!(
                s,
                "{} owned by a running process left; it tears its lab down when it ends, \
                 `rb lab down DIR` forces one",
                labs(in_use)
            );
        }
        let unreadable = count(|w| matches!(w, Left::Unreadable(_)));
        if unreadable > 0 {
            let _ = writeln!(
                s,
                "{} with an unreadable manifest left; remove by hand (`rb lab status`)",
                labs(unreadable)
            );
        }
        s
    }
}

fn labs(n: usize) -> String {
    if n == 1 {
        "1 lab".into()
    } else {
        format!("{n} labs")
    }
}

fn describe(why: &Left) -> String {
    match why {
        Left::OtherCheckout(c) => format!("made from another checkout ({})", c.display()),
        Left::OtherUser(u) => format!("made by another user ({u})"),
        Left::Unrecorded => "made by an earlier rb (creator not recorded)".into(),
        Left::InUse(Some(pid)) => format!("owned by running pid {pid}"),
        Left::InUse(None) => "owned by a running process".into(),
        Left::Unreadable(p) => format!("unreadable manifest: {p}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Creator {
        Creator {
            uid: 0,
            sudo_uid: Some(1000),
            checkout: "/home/a/rb/target/debug".into(),
        }
    }

    fn lab(dir: &str, made_by: Option<Creator>) -> LabSummary {
        LabSummary {
            dir: dir.into(),
            subnet: Some(1),
            owner_pid: None,
            owner_alive: true,
            detached: true,
            made_by,
            hosts: vec![],
            problem: None,
        }
    }

    fn labs() -> Vec<LabSummary> {
        let other_checkout = Creator {
            checkout: "/home/a/other/target/debug".into(),
            ..me()
        };
        let other_user = Creator {
            sudo_uid: Some(1001),
            ..me()
        };
        let mut in_use = lab("/l/in-use", Some(me()));
        (in_use.detached, in_use.owner_pid) = (false, Some(77));
        let mut stale = lab("/l/stale-ours", Some(me()));
        (stale.detached, stale.owner_alive) = (false, false);
        let mut broken = lab("/l/broken", None);
        broken.problem = Some("bad json".into());
        vec![
            lab("/l/ours", Some(me())),
            lab("/l/other-checkout", Some(other_checkout)),
            lab("/l/other-user", Some(other_user)),
            lab("/l/old", None),
            in_use,
            stale,
            broken,
        ]
    }

    #[test]
    fn bare_down_takes_only_our_labs_from_this_checkout() {
        let plan = plan_down(&labs(), &me(), false);
        let take: Vec<&str> = plan
            .take
            .iter()
            .map(|p| p.to_str().expect("ascii path"))
            .collect();
        assert_eq!(take, ["/l/ours", "/l/stale-ours"]);
        let left: Vec<(&str, &Left)> = plan
            .left
            .iter()
            .map(|(d, w)| (d.to_str().expect("ascii path"), w))
            .collect();
        assert_eq!(
            left,
            [
                (
                    "/l/other-checkout",
                    &Left::OtherCheckout("/home/a/other/target/debug".into())
                ),
                (
                    "/l/other-user",
                    &Left::OtherUser("uid 0 (sudo uid 1001)".into())
                ),
                ("/l/old", &Left::Unrecorded),
                ("/l/in-use", &Left::InUse(Some(77))),
                ("/l/broken", &Left::Unreadable("bad json".into())),
            ]
        );
        let report = plan.report_left();
        assert!(
            report.contains(
                "3 labs of other checkouts or users left; `rb lab down --all` takes them down"
            ),
            "{report}"
        );
        assert!(
            report.contains("left /l/in-use: owned by running pid 77"),
            "{report}"
        );
        assert!(
            report.contains("1 lab owned by a running process left"),
            "{report}"
        );
    }

    #[test]
    fn down_all_takes_every_lab_no_running_process_owns() {
        let plan = plan_down(&labs(), &me(), true);
        let take: Vec<&str> = plan
            .take
            .iter()
            .map(|p| p.to_str().expect("ascii path"))
            .collect();
        assert_eq!(
            take,
            [
                "/l/ours",
                "/l/other-checkout",
                "/l/other-user",
                "/l/old",
                "/l/stale-ours"
            ]
        );
        assert_eq!(plan.left.len(), 2, "{:?}", plan.left);
    }

    #[test]
    fn commands_without_dir_mean_our_lab_first() {
        let paths = |v: Vec<PathBuf>| -> Vec<String> {
            v.iter().map(|p| p.display().to_string()).collect()
        };
        assert_eq!(paths(default_candidates(&labs(), &me())), ["/l/ours"]);
        let stranger = Creator {
            checkout: "/elsewhere".into(),
            ..me()
        };
        assert_eq!(
            paths(default_candidates(&labs(), &stranger)),
            ["/l/ours", "/l/other-checkout", "/l/other-user", "/l/old"]
        );
    }

    #[test]
    fn nothing_left_says_nothing() {
        let plan = plan_down(&[lab("/l/ours", Some(me()))], &me(), false);
        assert_eq!(plan.report_left(), "");
    }

    #[test]
    fn test_binaries_count_as_their_target_dir() {
        assert_eq!(
            checkout_of(Path::new("/c/target/debug/deps/lab-1234")),
            Path::new("/c/target/debug")
        );
        assert_eq!(
            checkout_of(Path::new("/c/target/debug/rb")),
            Path::new("/c/target/debug")
        );
    }
}
