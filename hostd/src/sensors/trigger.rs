//! The pure rule that turns two activity samples into an immediate-report trigger.
//!
//! - [`ReportTrigger::Login`]: a `(user, tty)` session in `next` that `prev` did not have.
//! - [`ReportTrigger::InputActivity`]: the console idle time, or the tty idle time of a session
//!   present in both samples, went from `>= threshold` to `< threshold` (someone came back).
//!
//! - The same for logind's sessions of people ([`LogindSession::is_person`]): a new one is a
//!   `Login`; one whose idle hint cleared, that was unlocked, came to the foreground of its
//!   seat, or whose idle time fell below the threshold is `InputActivity`.
//!
//! Unknown values are never taken for idle: an idle time that is unknown in either sample
//! yields no `InputActivity`, and an unknown session list in `next` yields no `Login`. A list
//! that becomes readable with sessions in it does yield `Login` (the broker has not seen
//! them). `Login` wins when both apply.

use proto::report::{LogindSession, ReportTrigger, UserSession};

use super::Activity;

/// Should an immediate report be sent? See the module doc for the rule.
pub fn detect_trigger(
    prev: &Activity,
    next: &Activity,
    idle_threshold_s: u64,
) -> Option<ReportTrigger> {
    let (prev_logind, next_logind) = (people(&prev.logind), people(&next.logind));
    if new_login(prev.users.as_deref(), next.users.as_deref())
        || new_person(prev_logind.as_deref(), next_logind.as_deref())
    {
        return Some(ReportTrigger::Login);
    }
    let console = came_back(prev.console_idle_s, next.console_idle_s, idle_threshold_s);
    let tty = ttys_came_back(
        prev.users.as_deref(),
        next.users.as_deref(),
        idle_threshold_s,
    );
    let logind = logind_came_back(
        prev_logind.as_deref(),
        next_logind.as_deref(),
        idle_threshold_s,
    );
    (console || tty || logind).then_some(ReportTrigger::InputActivity)
}

fn people(sessions: &Option<Vec<LogindSession>>) -> Option<Vec<&LogindSession>> {
    sessions
        .as_ref()
        .map(|ss| ss.iter().filter(|s| s.is_person()).collect())
}

/// A person's logind session in `next` that `prev` did not have (any, when `prev` was
/// unknown).
fn new_person(prev: Option<&[&LogindSession]>, next: Option<&[&LogindSession]>) -> bool {
    let Some(next) = next else {
        return false;
    };
    let prev = prev.unwrap_or(&[]);
    next.iter().any(|n| !prev.iter().any(|p| p.id == n.id))
}

/// A person's session that the desktop now says is in use again.
fn logind_came_back(
    prev: Option<&[&LogindSession]>,
    next: Option<&[&LogindSession]>,
    threshold: u64,
) -> bool {
    let (Some(prev), Some(next)) = (prev, next) else {
        return false;
    };
    next.iter().any(|n| {
        prev.iter().filter(|p| p.id == n.id).any(|p| {
            (p.idle_hint && !n.idle_hint)
                || (p.locked && !n.locked)
                || (!p.active && n.active)
                || came_back(p.idle_s, n.idle_s, threshold)
        })
    })
}

fn same_session(a: &UserSession, b: &UserSession) -> bool {
    a.user == b.user && a.tty == b.tty
}

/// A session in `next` that `prev` did not have. When the list was unknown before and is
/// readable now, any session counts: the broker has not heard of it yet.
fn new_login(prev: Option<&[UserSession]>, next: Option<&[UserSession]>) -> bool {
    let Some(next) = next else {
        return false;
    };
    let prev = prev.unwrap_or(&[]);
    next.iter()
        .any(|n| !prev.iter().any(|p| same_session(p, n)))
}

/// Idle went from at least `threshold` to below it; unknown on either side never counts.
fn came_back(prev: Option<u64>, next: Option<u64>, threshold: u64) -> bool {
    matches!((prev, next), (Some(p), Some(n)) if p >= threshold && n < threshold)
}

fn ttys_came_back(
    prev: Option<&[UserSession]>,
    next: Option<&[UserSession]>,
    threshold: u64,
) -> bool {
    let (Some(prev), Some(next)) = (prev, next) else {
        return false;
    };
    next.iter().any(|n| {
        prev.iter()
            .filter(|p| same_session(p, n))
            .any(|p| came_back(p.idle_s, n.idle_s, threshold))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(user: &str, tty: &str, idle_s: Option<u64>) -> UserSession {
        UserSession {
            user: user.into(),
            tty: tty.into(),
            idle_s,
            from: None,
        }
    }

    fn activity(users: Option<Vec<UserSession>>, console_idle_s: Option<u64>) -> Activity {
        Activity {
            users,
            console_idle_s,
            logind: None,
        }
    }

    #[test]
    fn new_session_is_a_login() {
        let prev = activity(Some(vec![session("alice", "pts/1", Some(3))]), None);
        let next = activity(
            Some(vec![
                session("alice", "pts/1", Some(4)),
                session("bob", "pts/2", Some(0)),
            ]),
            None,
        );
        assert_eq!(detect_trigger(&prev, &next, 60), Some(ReportTrigger::Login));
        let same_user_new_tty = activity(Some(vec![session("alice", "pts/9", None)]), None);
        assert_eq!(
            detect_trigger(&prev, &same_user_new_tty, 60),
            Some(ReportTrigger::Login)
        );
    }

    #[test]
    fn logout_or_unchanged_sessions_do_not_trigger() {
        let both = activity(
            Some(vec![
                session("alice", "pts/1", Some(3)),
                session("bob", "pts/2", Some(5)),
            ]),
            Some(10),
        );
        let one = activity(Some(vec![session("alice", "pts/1", Some(4))]), Some(11));
        assert_eq!(detect_trigger(&both, &one, 60), None);
        assert_eq!(detect_trigger(&one, &one, 60), None);
    }

    #[test]
    fn console_coming_back_after_idle_is_input_activity() {
        let idle = activity(Some(vec![]), Some(600));
        let back = activity(Some(vec![]), Some(0));
        assert_eq!(
            detect_trigger(&idle, &back, 60),
            Some(ReportTrigger::InputActivity)
        );
        let at_threshold = activity(Some(vec![]), Some(60));
        assert_eq!(
            detect_trigger(&at_threshold, &back, 60),
            Some(ReportTrigger::InputActivity)
        );
        let busy = activity(Some(vec![]), Some(59));
        assert_eq!(detect_trigger(&busy, &back, 60), None, "was not idle");
        assert_eq!(
            detect_trigger(&back, &idle, 60),
            None,
            "going idle is no event"
        );
    }

    #[test]
    fn tty_coming_back_after_idle_is_input_activity() {
        let prev = activity(Some(vec![session("alice", "pts/1", Some(3600))]), None);
        let next = activity(Some(vec![session("alice", "pts/1", Some(2))]), None);
        assert_eq!(
            detect_trigger(&prev, &next, 60),
            Some(ReportTrigger::InputActivity)
        );
    }

    #[test]
    fn login_wins_over_input_activity() {
        let prev = activity(Some(vec![]), Some(600));
        let next = activity(Some(vec![session("bob", "tty1", Some(0))]), Some(0));
        assert_eq!(detect_trigger(&prev, &next, 60), Some(ReportTrigger::Login));
    }

    #[test]
    fn unknown_never_triggers() {
        let known = activity(Some(vec![session("alice", "pts/1", Some(0))]), Some(0));
        let unknown = activity(None, None);
        assert_eq!(
            detect_trigger(&unknown, &known, 60),
            Some(ReportTrigger::Login),
            "sessions that became readable are news"
        );
        assert_eq!(
            detect_trigger(&unknown, &activity(Some(vec![]), None), 60),
            None
        );
        assert_eq!(detect_trigger(&known, &unknown, 60), None);
        let unknown_idle = activity(Some(vec![session("alice", "pts/1", None)]), None);
        assert_eq!(
            detect_trigger(&unknown_idle, &known, 60),
            None,
            "unknown is not idle"
        );
        let idle = activity(Some(vec![session("alice", "pts/1", Some(900))]), Some(900));
        assert_eq!(detect_trigger(&idle, &unknown_idle, 60), None);
    }

    fn wayland(id: &str, idle_hint: bool, locked: bool) -> LogindSession {
        LogindSession {
            id: id.into(),
            user: "ann".into(),
            seat: Some("seat0".into()),
            class: "user".into(),
            kind: "wayland".into(),
            active: true,
            locked,
            idle_hint,
            idle_s: Some(if idle_hint { 900 } else { 0 }),
            ..LogindSession::default()
        }
    }

    fn with_logind(sessions: Vec<LogindSession>) -> Activity {
        Activity {
            users: Some(vec![]),
            console_idle_s: Some(4000),
            logind: Some(sessions),
        }
    }

    #[test]
    fn logind_owner_return_triggers_at_once() {
        let away = with_logind(vec![wayland("2", true, true)]);
        let back = with_logind(vec![wayland("2", false, false)]);
        assert_eq!(
            detect_trigger(&away, &back, 60),
            Some(ReportTrigger::InputActivity)
        );
        let unlocked = with_logind(vec![wayland("2", true, false)]);
        assert_eq!(
            detect_trigger(&away, &unlocked, 60),
            Some(ReportTrigger::InputActivity),
            "unlock"
        );
        let new = with_logind(vec![wayland("2", true, true), wayland("3", false, false)]);
        assert_eq!(detect_trigger(&away, &new, 60), Some(ReportTrigger::Login));
        assert_eq!(detect_trigger(&away, &away, 60), None);
        assert_eq!(detect_trigger(&back, &away, 60), None, "leaving is no news");
        let greeter = LogindSession {
            class: "greeter".into(),
            ..wayland("9", false, false)
        };
        let with_greeter = with_logind(vec![wayland("2", true, true), greeter]);
        assert_eq!(
            detect_trigger(&away, &with_greeter, 60),
            None,
            "a greeter is nobody"
        );
    }
}
