//! Who may do what: one pure decision, [`authorize`], taken before a request is carried
//! out. The broker's owner (the lab secret, or the broker's own uid on the control socket)
//! may do everything; a user (a credential from `rb user add`) may read the lab's state
//! (`rb status`, `rb jobs`, `rb policy show|explain`) and release the hosts their own jobs
//! hold, nothing else.

use proto::msg::Request;

/// Who asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// The broker's owner (and its host daemons).
    Owner,
    /// A user who proved their credential.
    User(String),
}

impl Actor {
    /// The name jobs and the audit log give this actor: the user's, or `owner` for the
    /// broker's owner.
    pub fn name<'a>(&'a self, owner: &'a str) -> &'a str {
        match self {
            Actor::Owner => owner,
            Actor::User(name) => name,
        }
    }
}

/// Why a request is refused (shown to the person who asked; `rb` exits 77).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("permission denied: {why}\nhelp: {help}")]
pub struct Refusal {
    pub why: String,
    pub help: String,
}

/// Why a request that reached the job desk was not carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// Not allowed.
    #[error(transparent)]
    Denied(#[from] Refusal),
    /// Allowed, but it could not be done (e.g. no such host).
    #[error("{0}")]
    Failed(String),
}

/// The name of a request in messages and the audit log (`rb ACTION`).
pub fn action(req: &Request) -> &'static str {
    match req {
        Request::Status => "status",
        Request::Shutdown => "shutdown",
        Request::Jobs => "jobs",
        Request::Release { .. } => "release",
        Request::Drain { .. } => "drain",
        Request::Resume { .. } => "resume",
        Request::PolicyReload => "policy reload",
        Request::PolicyShow => "policy show",
        Request::PolicyExplain { .. } => "policy explain",
        Request::UserAdd { .. } => "user add",
        Request::UserList => "user list",
        Request::UserRevoke { .. } => "user revoke",
    }
}

/// What a request acts on, for the audit log (a host or user name), if anything.
pub fn target(req: &Request) -> Option<&str> {
    match req {
        Request::Release { host, .. }
        | Request::Drain { host }
        | Request::Resume { host }
        | Request::PolicyExplain { host, .. } => Some(host),
        Request::UserAdd { name, .. } | Request::UserRevoke { name } => Some(name),
        _ => None,
    }
}

/// Whether a request changes the lab (worth an audit line when carried out).
pub fn is_admin(req: &Request) -> bool {
    !matches!(
        req,
        Request::Status
            | Request::Jobs
            | Request::PolicyShow
            | Request::PolicyExplain { .. }
            | Request::UserList
    )
}

/// May `actor` make `req`? `holder_of(host)` is the user of the job holding `host`, if a
/// job holds it (only asked for a user's `release`).
pub fn authorize(
    actor: &Actor,
    req: &Request,
    holder_of: impl Fn(&str) -> Option<String>,
) -> Result<(), Refusal> {
    let Actor::User(user) = actor else {
        return Ok(());
    };
    if !is_admin(req) && !matches!(req, Request::UserList) {
        return Ok(());
    }
    let owner_only = |what: &str| Refusal {
        why: format!("`rb {what}` needs the broker's owner; you are user `{user}`"),
        help: "ask the lab's owner (who runs rb-broker) to do it".into(),
    };
    match req {
        Request::Release { host, .. } => match holder_of(host) {
            Some(holder) if holder == *user => Ok(()),
            Some(holder) => Err(Refusal {
                why: format!("{host} is held by a job of user `{holder}`, not yours (`{user}`)"),
                help: "you may release only hosts your own jobs hold (see `rb jobs`)".into(),
            }),
            None => Err(Refusal {
                why: format!("{host} is held by none of your jobs (`{user}`)"),
                help: "you may release only hosts your own jobs hold (see `rb jobs`)".into(),
            }),
        },
        other => Err(owner_only(action(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bob() -> Actor {
        Actor::User("bob".into())
    }

    fn release(host: &str) -> Request {
        Request::Release {
            host: host.into(),
            grace_ms: None,
        }
    }

    /// node02 is held by bob's job, node03 by alice's, node04 by nobody.
    fn holder(host: &str) -> Option<String> {
        match host {
            "node02" => Some("bob".into()),
            "node03" => Some("alice".into()),
            _ => None,
        }
    }

    #[test]
    fn the_owner_may_do_everything() {
        let all = [
            Request::Shutdown,
            release("node03"),
            Request::Drain { host: "x".into() },
            Request::PolicyReload,
            Request::UserAdd {
                name: "bob".into(),
                out: None,
            },
            Request::UserList,
            Request::UserRevoke { name: "bob".into() },
        ];
        for req in all {
            assert_eq!(authorize(&Actor::Owner, &req, holder), Ok(()), "{req:?}");
        }
    }

    #[test]
    fn a_user_may_read_the_lab_and_explain_the_policy() {
        let open = [
            Request::Status,
            Request::Jobs,
            Request::PolicyShow,
            Request::PolicyExplain {
                host: "node02".into(),
                job: None,
            },
        ];
        for req in open {
            assert_eq!(authorize(&bob(), &req, holder), Ok(()), "{req:?}");
        }
    }

    #[test]
    fn admin_requests_need_the_owner_and_say_so() {
        let admin = [
            Request::Shutdown,
            Request::Drain { host: "x".into() },
            Request::Resume { host: "x".into() },
            Request::PolicyReload,
            Request::UserAdd {
                name: "eve".into(),
                out: None,
            },
            Request::UserList,
            Request::UserRevoke { name: "bob".into() },
        ];
        for req in admin {
            let refusal = authorize(&bob(), &req, holder).expect_err("owner only");
            let text = refusal.to_string();
            assert!(
                text.contains(&format!("`rb {}` needs the broker's owner", action(&req))),
                "{text}"
            );
            assert!(text.contains("user `bob`"), "{text}");
        }
    }

    #[test]
    fn a_user_releases_only_hosts_their_own_jobs_hold() {
        assert_eq!(authorize(&bob(), &release("node02"), holder), Ok(()));
        let other = authorize(&bob(), &release("node03"), holder).expect_err("alice's");
        assert!(other.why.contains("user `alice`"), "{other}");
        let free = authorize(&bob(), &release("node04"), holder).expect_err("nobody's");
        assert!(free.why.contains("none of your jobs"), "{free}");
    }

    #[test]
    fn actors_are_named_for_jobs_and_the_audit_log() {
        assert_eq!(Actor::Owner.name("root"), "root");
        assert_eq!(bob().name("root"), "bob");
        assert_eq!(target(&release("node02")), Some("node02"));
        assert!(is_admin(&release("n")) && !is_admin(&Request::Jobs));
    }
}
