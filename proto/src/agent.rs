//! The job-local protocol between the `rsh` shim (and, later, JEL clients) and their job's
//! agent, over the agent's unix socket (`RB_AGENT`, mode 0600, SO_PEERCRED-checked).
//!
//! Same framing as everything else (one JSON object per line). No handshake: the socket is
//! private to the job's user. The shim opens one connection per `rsh` call and keeps it open
//! while it waits: closing it cancels a queued request.
//!
//! ```text
//! shim → agent  {"t":"allocate","symbolic":"anyLinux","pid":4711}
//! agent → shim  {"t":"queued","position":2,"reason":"2 matching host(s): 2 held by jobs"}
//!                                                          (zero or more times, while waiting)
//! agent → shim  {"t":"granted","alloc":7,"host":"node03","address":"10.77.0.3",
//!                "remote_shell":["ssh","-F","/x/cfg"],"subagent":["/opt/rb/bin/rb-subagent","--agent","10.77.0.2:41234","--alloc","7"]}
//! agent → shim  {"t":"refused","message":"no host matches anyFoo"}
//! agent → shim  {"t":"lost","name":"anyLinux-1","host":"node03","message":"…"}  (exit 255)
//! shim → agent  {"t":"attach","host":"node03","pid":4712}  (a real host already allocated to the job)
//! job  → agent  {"t":"resolved","symbolic":"anyLinux","pid":4713}  (no reply; see below)
//! shim → agent  {"t":"named","host":"node05","pid":4714,"via":"ssh: node05: pass-through to /usr/bin/ssh"}
//!                                                          (no reply: a pass-through call)
//! shim → agent  {"t":"used","host":"anyLinux-1","pid":4715,"via":"ssh: anyLinux-1: granted node03 (allocation 2) over ssh"}
//!                                                          (no reply: a granted call starts)
//! shim → agent  {"t":"taken_back","alloc":7,"pid":4712}  (its remote shell exited 0: was the host taken?)
//! agent → shim  {"t":"taken_back","alloc":7,"host":"node03","message":"…"}   (exit 143)
//! agent → shim  {"t":"not_taken_back","alloc":7}                              (the shell's 0)
//! ```
//!
//! `resolved` comes from `librb_preload.so` in a module job's processes when one looks a
//! symbolic name up (PVM's master pvmd on `add anyLinux`, `lamgrow anyLinux`): the program
//! will run `rsh anyLinux …` next, so a module job's request (phase 1) starts there, some
//! milliseconds before the shim's own call, which then counts as the same request. The
//! sender connects, writes the line and closes without waiting.
//!
//! An instance name (`anyLinux-1`, see [`crate::symbolic`]) is bound by the agent to the
//! host its first call got; later `allocate` calls for it are answered `granted` with that
//! host at once. When the broker has taken that host back, the next call is answered
//! `lost` (the shim exits 255, as ssh does when it cannot reach a host: whatever ran there
//! is gone) and the call after it binds a new host.
//!
//! `taken_back`: a shim that ran a command on a granted host does not exec the
//! remote shell but waits for it. The remote status is lost over rsh (netkit rsh exits 0
//! when the subagent ended the command for a reclaim), so when the remote shell exits 0
//! the shim asks, on a new connection, whether the broker took that allocation back
//! (reclaimed it: `rb release`, the policy, an owner back) while the command ran. The
//! agent remembers the last [`TAKEN_BACK_MEMORY`] allocations the broker took back from the
//! job. `taken_back` makes the shim exit 143, as ssh does when the subagent ended the
//! command with SIGTERM, after one line on stderr; `not_taken_back` (or no answer: the job
//! is ending) keeps the remote shell's 0.

use serde::{Deserialize, Serialize};

/// Environment variable naming the agent's socket.
pub const ENV_AGENT: &str = "RB_AGENT";
/// Environment variable with the job id.
pub const ENV_JOB: &str = "RB_JOB";
/// Environment variable naming the file that lists hosts allocated to the job, one per line
/// (`NAME ADDRESS ALLOC`); the shim reads it to decide pass-through without a round trip.
pub const ENV_HOSTS_FILE: &str = "RB_HOSTS_FILE";
/// The real remote shell (program and leading arguments, JSON array) for pass-through.
pub const ENV_REAL_RSH: &str = "RB_REAL_RSH";
/// Recursion guard: how many shims are above us.
pub const ENV_SHIM_DEPTH: &str = "RB_SHIM_DEPTH";

/// Shim → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum ShimRequest {
    /// A machine chosen now for `symbolic` (`anyHost`, `anyLinux`, `any<Label>`).
    Allocate { symbolic: String, pid: u32 },
    /// `host` (a real name or address) is listed in `RB_HOSTS_FILE`: run there under a
    /// subagent so the broker can reclaim it. Answered with `Granted` or `Refused`.
    Attach { host: String, pid: u32 },
    /// A process of the job looked `symbolic` up; the phase-1 request of a module job
    /// starts now (ignored in other jobs). Not answered.
    Resolved { symbolic: String, pid: u32 },
    /// The shim passes a call to `host`, a real host not allocated to the job, through to
    /// the real remote shell: the job uses that host by name (a module job is then never
    /// granted it). `via` (optional): which remote shell, as the shim's `RB_VERBOSE` line
    /// says it (`ssh: node05: pass-through to /usr/bin/ssh`), kept as a job note for
    /// `rb jobs`. Not answered.
    Named {
        host: String,
        pid: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<String>,
    },
    /// A shim runs a call on a host granted to the job: `via` says which remote shell
    /// (`ssh: anyLinux-1: granted node03 (allocation 2) over ssh`), kept as a job note for
    /// `rb jobs`. Not answered.
    Used { host: String, pid: u32, via: String },
    /// The shim's remote shell for `alloc` exited 0: did the broker take `alloc` back from
    /// the job? Answered with `TakenBack` or `NotTakenBack`.
    TakenBack { alloc: u64, pid: u32 },
}

/// How many allocations the broker took back an agent remembers for
/// [`ShimRequest::TakenBack`] (the oldest are forgotten first).
pub const TAKEN_BACK_MEMORY: usize = 1024;

/// Agent → shim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ShimReply {
    /// Waiting for a host; `position` 1 = next; `reason` says why (from the broker).
    Queued {
        position: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Use this host: run `remote_shell… address 'subagent…' -c 'CMD'`.
    Granted {
        alloc: u64,
        host: String,
        address: String,
        remote_shell: Vec<String>,
        subagent: Vec<String>,
    },
    Refused {
        message: String,
    },
    /// Instance `name` was bound to `host`, which the broker has taken back: what ran there
    /// is lost. The shim prints `message` and exits 255; the next call binds a new host.
    Lost {
        name: String,
        host: String,
        message: String,
    },
    /// The broker took `alloc` (on `host`) back from the job: the command that ran there
    /// was ended. The shim prints `message` and exits 143.
    TakenBack {
        alloc: u64,
        host: String,
        message: String,
    },
    /// The broker did not take `alloc` back: the remote shell's status stands.
    NotTakenBack {
        alloc: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_encoding_is_stable() {
        let text = serde_json::to_string(&ShimRequest::Allocate {
            symbolic: "anyLinux".into(),
            pid: 1,
        })
        .expect("encode");
        assert_eq!(text, r#"{"t":"allocate","symbolic":"anyLinux","pid":1}"#);
        let text = serde_json::to_string(&ShimRequest::Resolved {
            symbolic: "anyLinux".into(),
            pid: 2,
        })
        .expect("encode");
        assert_eq!(text, r#"{"t":"resolved","symbolic":"anyLinux","pid":2}"#);
        let text =
            serde_json::to_string(&ShimRequest::TakenBack { alloc: 7, pid: 3 }).expect("encode");
        assert_eq!(text, r#"{"t":"taken_back","alloc":7,"pid":3}"#);
    }

    #[test]
    fn taken_back_replies_are_stable() {
        let reply = ShimReply::TakenBack {
            alloc: 7,
            host: "node03".into(),
            message: "gone".into(),
        };
        let text = serde_json::to_string(&reply).expect("encode");
        assert_eq!(
            text,
            r#"{"t":"taken_back","alloc":7,"host":"node03","message":"gone"}"#
        );
        let text = serde_json::to_string(&ShimReply::NotTakenBack { alloc: 7 }).expect("encode");
        assert_eq!(text, r#"{"t":"not_taken_back","alloc":7}"#);
        let back: ShimReply = serde_json::from_str(&text).expect("decode");
        assert_eq!(back, ShimReply::NotTakenBack { alloc: 7 });
    }
}
