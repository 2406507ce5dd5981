//! The fixed hook names a policy file may set: each hook's result type, the variables it may
//! read, and its default (the paper policy where that is meaningful). The README's hook table
//! is written from this module.

/// The type a hook's expression must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    /// `int`, `uint` or `double`; handed out as `f64`.
    Number,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Number => "number",
        }
    }
}

/// A hook's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Answer {
    Bool(bool),
    Number(f64),
}

impl Answer {
    pub fn as_bool(self) -> Option<bool> {
        match self {
            Answer::Bool(b) => Some(b),
            Answer::Number(_) => None,
        }
    }

    pub fn as_number(self) -> Option<f64> {
        match self {
            Answer::Number(n) => Some(n),
            Answer::Bool(_) => None,
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Bool(b) => write!(f, "{b}"),
            Answer::Number(n) => write!(f, "{n}"),
        }
    }
}

/// A variable a hook may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Var {
    Host,
    Job,
    Holder,
    User,
    Lab,
    Now,
}

impl Var {
    pub const ALL: [Var; 6] = [
        Var::Host,
        Var::Job,
        Var::Holder,
        Var::User,
        Var::Lab,
        Var::Now,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Var::Host => "host",
            Var::Job => "job",
            Var::Holder => "holder",
            Var::User => "user",
            Var::Lab => "lab",
            Var::Now => "now",
        }
    }
}

/// One hook of a policy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    Start,
    Rank,
    Vacate,
    GraceS,
    MayPreempt,
    PreemptRank,
    Share,
    MaxHosts,
    Priority,
    Overflow,
}

impl Hook {
    pub const ALL: [Hook; 10] = [
        Hook::Start,
        Hook::Rank,
        Hook::Vacate,
        Hook::GraceS,
        Hook::MayPreempt,
        Hook::PreemptRank,
        Hook::Share,
        Hook::MaxHosts,
        Hook::Priority,
        Hook::Overflow,
    ];

    /// The key in the file.
    pub fn key(self) -> &'static str {
        match self {
            Hook::Start => "start",
            Hook::Rank => "rank",
            Hook::Vacate => "vacate",
            Hook::GraceS => "grace_s",
            Hook::MayPreempt => "may_preempt",
            Hook::PreemptRank => "preempt_rank",
            Hook::Share => "share",
            Hook::MaxHosts => "max_hosts",
            Hook::Priority => "priority",
            Hook::Overflow => "overflow",
        }
    }

    pub fn from_key(key: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.key() == key)
    }

    pub fn kind(self) -> Kind {
        match self {
            Hook::Start | Hook::Vacate | Hook::MayPreempt | Hook::Overflow => Kind::Bool,
            _ => Kind::Number,
        }
    }

    /// The variables bound when this hook runs; reading another one is a load error.
    pub fn vars(self) -> &'static [Var] {
        use Var::*;
        match self {
            Hook::Start | Hook::Rank | Hook::Vacate | Hook::GraceS => &[Host, Job, User, Lab, Now],
            Hook::MayPreempt | Hook::PreemptRank => &[Host, Job, Holder, User, Lab, Now],
            Hook::Share | Hook::MaxHosts | Hook::Priority | Hook::Overflow => {
                &[Job, User, Lab, Now]
            }
        }
    }

    /// The expression used when the file does not set this hook, and when the file's
    /// expression fails at run time on some input. `None`: the hook has no value and the
    /// broker's own rule applies (`grace_s`: the lab's `reclaim_grace_s`; `max_hosts`: no
    /// limit; `priority`: arrival order).
    pub fn default_source(self) -> Option<&'static str> {
        match self {
            Hook::Start => Some(DEFAULT_START),
            Hook::Rank => Some(DEFAULT_RANK),
            Hook::Vacate => Some(DEFAULT_VACATE),
            Hook::GraceS | Hook::MaxHosts | Hook::Priority => None,
            Hook::MayPreempt => Some(DEFAULT_MAY_PREEMPT),
            Hook::PreemptRank => Some(DEFAULT_PREEMPT_RANK),
            Hook::Share => Some("1"),
            Hook::Overflow => Some(DEFAULT_OVERFLOW),
        }
    }

    /// Whether `n` is a value this (number) hook may give: `grace_s` and `max_hosts` are
    /// finite and not negative, `share` is finite and positive; the rest take any number.
    pub(crate) fn check_range(self, n: f64) -> Result<(), String> {
        let wrong = match self {
            Hook::GraceS | Hook::MaxHosts => !(n.is_finite() && n >= 0.0),
            Hook::Share => !(n.is_finite() && n > 0.0),
            _ => false,
        };
        if !wrong {
            return Ok(());
        }
        let want = if self == Hook::Share {
            "a finite number above 0"
        } else {
            "a finite number, 0 or more"
        };
        Err(format!("gives {n}, but `{}` must give {want}", self.key()))
    }

    /// The value given when the default expression itself cannot be evaluated (only on
    /// facts the broker should never produce): refuse, rank last, keep the host.
    pub(crate) fn fail_safe(self) -> Option<Answer> {
        match self {
            Hook::Start | Hook::Vacate | Hook::MayPreempt | Hook::Overflow => {
                Some(Answer::Bool(false))
            }
            Hook::Rank | Hook::PreemptRank => Some(Answer::Number(0.0)),
            Hook::Share => Some(Answer::Number(1.0)),
            Hook::GraceS | Hook::MaxHosts | Hook::Priority => None,
        }
    }
}

/// The paper: public hosts to anyone; private hosts only to adaptive jobs, owner away.
const DEFAULT_START: &str = concat!(
    "!host.private || (job.adaptive && ",
    "(host.owner_idle_s != null && host.owner_idle_s >= 300))"
);

/// Today's choice order as a number: quiet first, then least load per CPU (unknown load
/// last), then public before private.
const DEFAULT_RANK: &str = concat!(
    "((host.keyboard_idle_s != null && host.keyboard_idle_s >= 300) ? 1000000.0 : 0.0)",
    " - (host.load1 == null ? 100000.0",
    " : 10.0 * host.load1 / double(host.cpus > 0 ? host.cpus : 1))",
    " - (host.private ? 1.0 : 0.0)"
);

/// The paper: an adaptive job gives a private host back as soon as its owner is back.
const DEFAULT_VACATE: &str = concat!(
    "host.private && job.adaptive && ",
    "host.owner_idle_s != null && host.owner_idle_s < 300"
);

/// The paper's even partition, weighted by `share`: only adaptive jobs lose hosts, and an
/// adaptive requester only takes a host when the holder, one host fewer, still holds at
/// least as many per share as the requester with one more. With every share 1 that is
/// the paper's "at least two more hosts than it has"; a job with share 2 keeps about twice
/// the hosts of a share-1 job.
const DEFAULT_MAY_PREEMPT: &str = concat!(
    "holder.adaptive && (!job.adaptive || ",
    "double(holder.hosts_held - 1) / holder.share >= double(job.hosts_held + 1) / job.share)"
);

/// Ask Slurm for a node (with `[overflow.slurm]`) for a request that has waited about a
/// second: long enough for a host being released in the lab to come first.
const DEFAULT_OVERFLOW: &str = "job.waited_s >= 1.0";

/// The job holding the most hosts per share loses first; ties: the newest job.
const DEFAULT_PREEMPT_RANK: &str =
    "double(holder.hosts_held) / holder.share * 10000000000.0 + double(holder.started_s)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for h in Hook::ALL {
            assert_eq!(Hook::from_key(h.key()), Some(h));
        }
        assert_eq!(Hook::from_key("let"), None);
    }
}
