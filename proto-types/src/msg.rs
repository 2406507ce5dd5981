//! Protocol messages: [`ToBroker`] (anything a peer sends the broker) and [`FromBroker`].
//!
//! Encoded as JSON objects with a `"t"` tag, one per frame (see `proto::frame`).
//! Unknown tags or fields fail to decode; the broker answers with [`FromBroker::Error`] and
//! closes the connection.

use serde::{Deserialize, Serialize};

use crate::report::{HostReport, HostStatus};

/// What kind of peer opens a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A host daemon (`rb-hostd`); `name` is the lab host name it reports for.
    Hostd,
    /// A command-line client (`rb`): requests and responses.
    Client,
    /// A job's agent; `name` is a label for logs (the app's name).
    Agent,
    /// A subagent connecting to its job's agent; `name` is the allocation id.
    Subagent,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Hostd => "hostd",
            Role::Client => "client",
            Role::Agent => "agent",
            Role::Subagent => "subagent",
        })
    }
}

/// First message of every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub proto: u32,
    pub role: Role,
    /// Host name for `hostd`; free text (e.g. "rb") for clients.
    pub name: String,
    /// Client nonce, hex; used on TCP connections, ignored on unix sockets.
    pub nonce: String,
    /// TCP only: the user whose credential (`proto::credential`) the peer proves instead
    /// of the lab secret. Absent = the lab secret. A broker older than this field refuses a
    /// hello that has it (unknown field), so the failure is explicit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Requests a client can make once welcomed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The status of every host in the lab.
    Status,
    /// Stop the broker (local control socket only).
    Shutdown,
    /// Every job with its hosts and queued requests.
    Jobs,
    /// Reclaim `host` from whatever job holds it (graceful, then forced after `grace_ms`).
    Release { host: String, grace_ms: Option<u64> },
    /// No new grants on `host`.
    Drain { host: String },
    /// Grants on `host` again.
    Resume { host: String },
    /// Load the lab's policy file again; answered with [`Response::Policy`], or an error
    /// (the old policy stays).
    PolicyReload,
    /// The policy in force: [`Response::Policy`].
    PolicyShow,
    /// Each policy hook's value on `host` and the inputs it read, for `job` (default: a
    /// sample job of the caller's, see PROTOCOL.md): [`Response::Explain`].
    PolicyExplain { host: String, job: Option<u64> },
    /// Create a credential for user `name`; the broker writes it to `out` (an absolute
    /// path on the broker's machine; default `STATE_DIR/credentials/NAME`) and answers
    /// [`Response::UserAdded`]. The broker's owner only.
    UserAdd { name: String, out: Option<String> },
    /// The users with a credential: [`Response::Users`]. The broker's owner only.
    UserList,
    /// Remove user `name`'s credential and drop their connections. The owner only.
    UserRevoke { name: String },
}

/// One user with a credential (`rb user list`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub name: String,
    /// When the credential was made, Unix seconds.
    pub created_unix: i64,
    /// The last time the user authenticated, Unix seconds (`None`: never).
    pub last_seen_unix: Option<i64>,
}

/// The allocation policy in force (`rb policy show`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInfo {
    /// The file it came from (`policies/NAME.toml` for a shipped one).
    pub path: String,
    /// SHA-256 of the file's bytes, hex.
    pub sha256: String,
    /// When it was loaded, Unix seconds.
    pub loaded_at_unix: i64,
    /// The one-line summary `rb policy check` prints.
    pub summary: String,
    /// Why the last reload was refused, if it was (cleared by a good reload).
    pub last_reload_error: Option<String>,
}

/// Answers to [`Request`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    Status {
        hosts: Vec<HostStatus>,
    },
    /// One JSON object per job (`id`, `user`, `state`, `hosts`, `spec`, …).
    Jobs {
        jobs: Vec<serde_json::Value>,
    },
    Ok,
    /// What happened, for people (e.g. "reclaiming node03 from job 4").
    Done {
        message: String,
    },
    /// The policy in force (after a reload: the new one).
    Policy {
        policy: PolicyInfo,
    },
    /// `rb policy explain`: `{host, job, policy_sha256, hooks: [{key, set, expression,
    /// value, error, inputs: [[field, value]]}]}`.
    Explain {
        explain: serde_json::Value,
    },
    /// `rb user add`: the credential of `name` is in `path` (on the broker's machine).
    UserAdded {
        name: String,
        path: String,
    },
    /// `rb user list`.
    Users {
        users: Vec<UserInfo>,
    },
}

/// What an agent tells the broker about its job when it registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRegistration {
    pub user: String,
    pub cwd: String,
    pub argv: Vec<String>,
    /// The job spec (RSL → JSON), if one was given.
    pub spec: Option<serde_json::Value>,
    pub adaptive: bool,
    /// The job id to resume after a broker restart, if any.
    pub resume: Option<u64>,
    /// The machine the agent runs on, for the broker to find its lab host.
    #[serde(default)]
    pub runs_on: Option<AgentHost>,
    /// The job's module (`module="pvm"` in the spec), if any. A module job is never granted
    /// a host it already uses: the one it runs on, nor those in [`ToBroker::HostsInUse`].
    #[serde(default)]
    pub module: Option<String>,
}

/// Where an agent runs: its host name and its non-loopback addresses. The broker takes the
/// lab host with one of these addresses, else the one with this name (or its first label).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentHost {
    pub hostname: String,
    pub addresses: Vec<String>,
}

/// Everything a peer sends to the broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ToBroker {
    Hello(Hello),
    /// Answer to the broker's challenge: hex HMAC (see `proto::auth`).
    Auth {
        mac: String,
    },
    /// A host daemon's report.
    Report(Box<HostReport>),
    /// A Slurm pilot's host daemon (`rb-hostd --slurm-job`): it runs in Slurm job
    /// `slurm_job`, sent after every welcome; `ending` once Slurm said that it takes the
    /// node back (the lease warning, preemption, `scancel`). The broker reads the job's end
    /// from Slurm itself.
    PilotLease {
        slurm_job: String,
        ending: bool,
    },
    /// A client request; `id` is echoed in the response.
    Request {
        id: u64,
        req: Request,
    },
    /// Agent: register (or resume) the job.
    Register(Box<JobRegistration>),
    /// Agent: a machine for `symbolic`, now; `req` is the agent's own id for the request.
    Allocate {
        req: u64,
        symbolic: String,
    },
    /// Agent: the request is no longer wanted (its shim died).
    Cancel {
        req: u64,
    },
    /// Agent: the job no longer needs this allocation.
    GiveBack {
        alloc: u64,
    },
    /// Agent: a reclaimed allocation is released (its processes are gone).
    Released {
        alloc: u64,
    },
    /// Agent: something about the job people should see in `rb jobs` (e.g. a module that
    /// failed). The broker keeps the last few per job.
    JobNote {
        text: String,
    },
    /// Agent: hosts (names or addresses) the job uses without holding them — added by name
    /// (`pvm> add node05`), or found in its virtual machine by a module. Never granted to
    /// this job. Sent again after a reconnect (the broker keeps them in memory only).
    HostsInUse {
        hosts: Vec<String>,
    },
    /// Agent: the job ended with this status.
    EndJob {
        status: i32,
    },
    /// Subagent → agent: the command runs as process group `pid` on `host`.
    SubStarted {
        pid: u32,
        host: String,
    },
    /// Subagent → agent: the command ended (exit status, 128+signal when killed).
    SubExited {
        status: i32,
    },
    /// Subagent → agent: still alive.
    Heartbeat,
    /// Subagent → agent: a process of its command (`pid` from SO_PEERCRED when known)
    /// connected to the subagent's JEL socket (`RB_JEL` on that host); `conn` is the
    /// subagent's id for it, unique for the subagent's life.
    JelOpen {
        conn: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
    },
    /// Subagent → agent: one line that JEL connection sent, without its newline (at most
    /// [`JEL_RELAY_MAX_LINE`] bytes: a longer one closes the connection on the host).
    JelLine {
        conn: u64,
        line: String,
    },
    /// Subagent → agent: that JEL connection closed (EOF, an error, an over-long line, or the
    /// subagent cut off a member that did not read its lines).
    JelClosed {
        conn: u64,
    },
}

/// The longest line a member on a granted host may send (its subagent closes the connection
/// past it): an eighth of a frame, so that a [`ToBroker::JelLine`] fits one frame even when
/// every byte is escaped in JSON (six bytes for a control character).
pub const JEL_RELAY_MAX_LINE: usize = crate::MAX_FRAME_BYTES / 8;

/// Error codes carried by [`FromBroker::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Protocol version mismatch.
    Version,
    /// Authentication failed (wrong secret or credential, wrong uid, revoked user).
    Auth,
    /// Authenticated, but not allowed to do this (e.g. a user's `rb drain`); `rb` exits 77.
    Denied,
    /// The message could not be decoded or was not expected now.
    BadMessage,
    /// The host name is not in the lab file.
    UnknownHost,
    /// The request was understood but could not be carried out.
    Failed,
}

/// Everything the broker sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum FromBroker {
    /// Server nonce and the server's proof that it knows the secret (hex).
    Challenge {
        nonce: String,
        proof: String,
    },
    /// The connection is accepted; hostd should report every `report_interval_ms`, and may
    /// send each report after its first as what changed (`report_changes`,
    /// [`crate::report_changes`]); other roles ignore both. Absent (a broker before it):
    /// whole reports only.
    Welcome {
        report_interval_ms: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        report_changes: bool,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    Response {
        id: u64,
        resp: Response,
    },
    /// Asks a host daemon to exit (the broker is stopping or replaced it).
    Shutdown {
        reason: String,
    },
    /// To a host daemon, on connecting and whenever they change: the allocations of its
    /// host live now (granted or being released, ascending), and that every allocation id
    /// below `issued_below` has been issued (as of that change: grants of other hosts since
    /// do not move it). A process of the daemon's user tagged (`proto::tag`) for an
    /// allocation below `issued_below` that is not in `live` belongs to a host its job no
    /// longer holds: the daemon ends it (SIGTERM, then SIGKILL). Sent only where one daemon
    /// serves one machine (the `ssh` and `rsh` transports). (Brokers before 672babe listed
    /// every live allocation of the lab, and sent the list at each change anywhere.)
    LiveAllocs {
        live: Vec<u64>,
        issued_below: u64,
    },
    /// To a host daemon that reports `allocs_running` (see [`crate::report::HostReport`]),
    /// on connecting and whenever it changes: the allocations of its host whose reclaim
    /// deadline has passed (ascending). The daemon ends every process of its user tagged for one of them
    /// on its machine (SIGTERM, then SIGKILL); the broker holds their hosts until the
    /// daemon's reports no longer list them, or the host is down. Sent on every transport.
    EndAllocs {
        allocs: Vec<u64>,
    },
    /// To an agent: the job is registered as `job`; reach hosts with `remote_shell`.
    /// `secret_file` is where the broker reads the lab secret (a path, never the secret):
    /// agents on the same machine or a shared home use it to authenticate their subagents.
    ///
    /// `hosts_reach_broker_at` is the broker's IP as its hosts reach it (from `listen`):
    /// an agent advertises to its subagents its own address on the route to that IP, which
    /// the hosts can reach too, however the agent itself reached the broker (the control
    /// socket has no address of its own). Absent when unknown.
    Registered {
        job: u64,
        remote_shell: Vec<String>,
        transport: String,
        secret_file: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hosts_reach_broker_at: Option<std::net::IpAddr>,
        /// The lab's public mark (`proto::auth::Secret::lab_mark`): the agent hands it to
        /// its subagents, which put it in their commands' tag, so the lab's host daemons
        /// can sweep what is left of them (subagents prove the job's own key, not the lab
        /// secret, so they cannot derive it). Absent from older brokers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lab_mark: Option<String>,
        /// The lab host the agent runs on (found from its registration's `runs_on`), when
        /// it is one: the lab name of the job's front end, e.g. for its JEL members' `host`.
        /// Absent when the agent runs outside the lab's hosts, and from older brokers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        front_end: Option<String>,
    },
    /// To an agent: request `req` waits; `position` 1 = next; `reason` says why, for people
    /// (absent from brokers before it was added).
    Queued {
        req: u64,
        position: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// To an agent: request `req` got `host` as allocation `alloc`. `instance` is set when
    /// the request's name is an instance (`anyLinux-2`: no label is named `linux-2`): the
    /// agent binds the name to this host for the rest of the job.
    Granted {
        req: u64,
        alloc: u64,
        host: String,
        address: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance: Option<u32>,
    },
    /// To an agent: request `req` can never be served.
    Refused {
        req: u64,
        message: String,
    },
    /// To an agent: give `host` (allocation `alloc`) back within `grace_ms`.
    Reclaim {
        alloc: u64,
        host: String,
        grace_ms: u64,
    },
    /// To an agent, after its `end_job`: the job's end is saved in the broker's state
    /// (a broker killed after this point does not bring the job back). The agent waits
    /// for it (bounded), re-sending `end_job` after a reconnect.
    JobEnded {
        job: u64,
    },
    /// Agent → subagent: end the command's process group (TERM, then KILL after `grace_ms`).
    Terminate {
        grace_ms: u64,
    },
    /// Agent → subagent: write these lines (each ending with its newline), in order, to the
    /// JEL connection `conn` (the subagent's id, from [`ToBroker::JelOpen`]).
    JelSend {
        conn: u64,
        lines: Vec<String>,
    },
    /// Agent → subagent: close the JEL connection `conn` once the lines sent before are
    /// written; `reason` is for the log (`slow_consumer`, `host_gone`, …).
    JelDisconnect {
        conn: u64,
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_with_tag() {
        let hello = ToBroker::Hello(Hello {
            proto: 1,
            role: Role::Hostd,
            name: "node02".into(),
            nonce: "ab".into(),
            user: None,
        });
        let text = serde_json::to_string(&hello).expect("serialise");
        assert!(text.starts_with(r#"{"t":"hello""#), "{text}");
        let back: ToBroker = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, hello);
    }

    #[test]
    fn unknown_hello_field_is_rejected() {
        let text = r#"{"t":"hello","proto":1,"role":"hostd","name":"n","nonce":"","x":1}"#;
        assert!(serde_json::from_str::<ToBroker>(text).is_err());
    }

    #[test]
    fn a_registration_without_the_newer_fields_still_decodes() {
        let text = r#"{"t":"register","user":"u","cwd":"/","argv":[],"spec":null,"adaptive":false,"resume":null}"#;
        let ToBroker::Register(reg) = serde_json::from_str(text).expect("decodes") else {
            panic!("not a registration");
        };
        assert_eq!((reg.runs_on, reg.module), (None, None));
        let text = r#"{"t":"hosts_in_use","hosts":["node05"]}"#;
        assert_eq!(
            serde_json::from_str::<ToBroker>(text).expect("decodes"),
            ToBroker::HostsInUse {
                hosts: vec!["node05".into()]
            }
        );
    }

    #[test]
    fn jel_relay_messages_round_trip() {
        let open = ToBroker::JelOpen { conn: 3, pid: None };
        let text = serde_json::to_string(&open).expect("serialise");
        assert_eq!(text, r#"{"t":"jel_open","conn":3}"#);
        assert_eq!(
            serde_json::from_str::<ToBroker>(&text).expect("parse"),
            open
        );
        let send = FromBroker::JelSend {
            conn: 3,
            lines: vec!["{\"seq\":1}\n".into()],
        };
        let text = serde_json::to_string(&send).expect("serialise");
        assert_eq!(
            serde_json::from_str::<FromBroker>(&text).expect("parse"),
            send
        );
    }

    #[test]
    fn request_encoding_is_stable() {
        let req = ToBroker::Request {
            id: 7,
            req: Request::Status,
        };
        let text = serde_json::to_string(&req).expect("serialise");
        assert_eq!(text, r#"{"t":"request","id":7,"req":{"op":"status"}}"#);
    }
}
