//! The pure rule that turns two activity samples into an immediate-report trigger.
//!
//! - [`ReportTrigger::Login`]: a `(user, tty)` session in `next` that `prev` did not have.
//! - [`ReportTrigger::InputActivity`]: the console idle time, or the tty idle time of a session
//!   present in both samples, went from `>= threshold` to `< threshold` (someone came back).
//!
//! Unknown values are never taken for idle: an idle time that is unknown in either sample
//! yields no `InputActivity`, and an unknown session list in `next` yields no `Login`. A list
//! that becomes readable with sessions in it does yield `Login` (the broker has not seen
//! them). `Login` wins when both apply.

use proto::report::{ReportTrigger, UserSession};

use super::Activity;

/// Should an immediate report be sent? See the module doc for the rule.
pub fn detect_trigger(
    prev: &Activity,
    next: &Activity,
    idle_threshold_s: u64,
) -> Option<ReportTrigger> {
    if new_login(prev.users.as_deref(), next.users.as_deref()) {
        return Some(ReportTrigger::Login);
    }
    let console = came_back(prev.console_idle_s, next.console_idle_s, idle_threshold_s);
    let tty = ttys_came_back(
        prev.users.as_deref(),
        next.users.as_deref(),
        idle_threshold_s,
    );
    (console || tty).then_some(ReportTrigger::InputActivity)
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
}
