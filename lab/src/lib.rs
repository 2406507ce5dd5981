//! The lab harness: a network of real test hosts on this one Linux machine, for
//! ResourceBroker's tier-3 tests and for people trying the system (`rb lab up`).
//!
//! Each lab host is a set of namespaces with real daemons in it:
//! - a **network** namespace (`<prefix>S-nodeNN`) whose `eth0` has 10.77.S.N/24 on a veth
//!   bridged (`rbbrS`) to the root namespace, which holds the gateway 10.77.S.1 (the
//!   front-end machine, called `node01`/`gateway` inside; the broker listens there). No
//!   default route: nothing leaves the lab.
//! - **UTS** (its own hostname), **mount** (private /tmp, /run with its own utmp,
//!   /var/log and /dev/shm; an overlay on /etc with the host's own hosts, passwd, …) and
//!   **PID** namespaces, with [`init`] (`rb-lab-init`) as PID 1 reaping children and running
//!   sshd (and inetd + in.rshd with `rsh`).
//!
//! Hosts are named node02, node03, …; S is a subnet number unique among the labs of the
//! machine, so labs can coexist (tests run in parallel). A lab-only user (`rblab`, uid 4242)
//! exists inside the hosts, with a home shared by all hosts and passwordless ssh and rsh.
//!
//! ```no_run
//! # fn main() -> Result<(), lab::LabError> {
//! let lab = lab::Lab::up(&lab::LabSpec::default())?;
//! let out = lab.exec("node03", &["hostname"])?;
//! assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "node03");
//! lab.crash("node02")?;
//! lab.boot("node02")?;
//! # Ok(()) }   // dropping `lab` tears everything down
//! ```
//!
//! # Layout
//! - [`lab`](Lab): [`LabSpec`], [`Lab::up`]/[`Lab::attach`]/[`Lab::detach`]/[`Lab::down`],
//!   teardown on drop (`lab.rs`); operations on a running lab (`ops.rs`).
//! - `host.rs`: booting and killing one host; `net.rs`: bridge, netns, veths;
//!   `provision.rs`: keys, overlays, daemon configs, the lab directory layout.
//! - `manifest.rs`: the JSON manifest and the race-safe subnet choice; [`registry`]:
//!   [`list_labs`] and [`reap_stale`]; [`creator`]: who made a lab and from which
//!   checkout, and which labs a bare `rb lab down` takes ([`plan_down`]).
//! - [`slurm`]: a real Slurm cluster (munged, slurmctld, one slurmd per host) made of lab
//!   hosts, for the overflow tests ([`SlurmCluster`]).
//! - [`utmp`]: fake logins ([`FakeLogin`]); [`init`]: the hosts' PID 1.
//! - [`cli`]: `rb lab up|down|status|exec|crash|boot|partition|heal`.
//! - `process.rs`: pid + start-time identities, polling with deadlines; `cmd.rs`: running
//!   tools; `error.rs`: [`LabError`].
//!
//! # Running
//! Everything needs root; the lab tests print `skipped: lab tests need root (network
//! namespaces)` and pass when not root. As root: `cargo test -p lab`. Hosts run
//! `rb-lab-init`, found through `$RB_LAB_INIT` or next to the running executable (or one
//! directory up, for test binaries in `target/<profile>/deps/`); `cargo test -p lab` builds
//! it, other crates' tests need `cargo build -p lab --bin rb-lab-init` first.
//!
//! A test process killed before its `Lab` is dropped leaves its lab behind; the next
//! [`Lab::up`] on the machine (or [`reap_stale`], or `rb lab down DIR`) removes it. Labs of
//! `rb lab up` are detached and stay until `rb lab down`.
//!
//! Never resolve lab host names in the root namespace (they are only in the hosts'
//! `/etc/hosts`): use the addresses, or the generated ssh config.

pub mod cli;
mod cmd;
pub mod creator;
mod error;
mod host;
pub mod init;
mod lab;
mod manifest;
mod net;
mod ops;
mod process;
mod provision;
pub mod registry;
pub mod slurm;
pub mod utmp;

pub use creator::{plan_down, Creator, DownPlan};
pub use error::LabError;
pub use host::{find_init, INIT_ENV};
pub use lab::{require_root, Lab, LabHost, LabSpec, LabUser};
pub use manifest::{LAB_ROOT, LOCK_PATH};
pub use process::ProcRef;
pub use registry::{list_labs, reap_stale, HostSummary, LabSummary};
pub use slurm::SlurmCluster;
pub use utmp::FakeLogin;
