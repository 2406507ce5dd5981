//! Using a running [`Lab`]: where things are, running commands inside hosts, ssh, and the
//! fault injections (crash/boot, partition/heal).
//!
//! Commands enter a host with `nsenter -t <host PID 1> -n -u -m -p` (not `ip netns exec`,
//! which would make a new mount namespace without the host's private /tmp and /run), then
//! `setpriv` drops to the lab user when asked and sets a parent-death signal, so killing the
//! returned `nsenter` child also kills the process inside the host.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cmd;
use crate::host;
use crate::lab::{Lab, LabHost, LabUser};
use crate::net;
use crate::process::{children, poll, ProcRef};
use crate::provision;
use crate::utmp::FakeLogin;
use crate::LabError;

/// PATH inside hosts.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Lab {
    /// The hosts, node02 first.
    pub fn hosts(&self) -> &[LabHost] {
        &self.hosts
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Result<&LabHost, LabError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| LabError::UnknownHost {
                host: name.into(),
                known: self
                    .hosts
                    .iter()
                    .map(|h| h.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The subnet number S of 10.77.S.0/24.
    pub fn subnet(&self) -> u8 {
        self.manifest().subnet
    }

    /// The root-namespace side of the lab (the bridge), 10.77.S.1: where a broker running
    /// in the root namespace listens. Hosts know it as `node01` and `gateway`.
    pub fn gateway(&self) -> Ipv4Addr {
        self.manifest().gateway()
    }

    /// The lab's state directory, `/var/tmp/rb-lab-S`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The state directory of `host` (in the lab dir): `console.log` (its init's output),
    /// `sshd.log`, its configs, and the sources of its private /tmp, /run and /var/log.
    pub fn host_dir(&self, host: &str) -> Result<PathBuf, LabError> {
        self.host(host)?;
        Ok(self.manifest().host_dir(host))
    }

    /// The ssh client config for the root namespace (`ssh -F <it> node02`).
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// The private key root uses to ssh into hosts (already in `ssh_config`).
    pub fn root_key(&self) -> PathBuf {
        provision::root_key(&self.manifest())
    }

    /// The lab user.
    pub fn user(&self) -> &LabUser {
        &self.user
    }

    /// Whether hosts run inetd with in.rshd.
    pub fn rsh(&self) -> bool {
        self.manifest().rsh
    }

    /// PID 1 of a running host.
    pub(crate) fn running_init(&self, host: &str) -> Result<ProcRef, LabError> {
        let m = self.manifest();
        let h = m.host(host)?;
        match (h.unshare, h.init) {
            (Some(u), Some(i)) if u.is_alive() && i.is_alive() => Ok(i),
            _ => Err(LabError::HostDown { host: host.into() }),
        }
    }

    /// A command that runs `argv` inside `host` (as root, or as the lab user with HOME,
    /// USER, LOGNAME, SHELL set and the home as working directory) with a clean
    /// environment. Add environment, stdio or arguments before running it.
    pub fn command(&self, host: &str, argv: &[&str], as_user: bool) -> Result<Command, LabError> {
        if argv.is_empty() {
            return Err(LabError::InvalidInput {
                reason: "empty command".into(),
                help: "give the program to run and its arguments".into(),
            });
        }
        let init = self.running_init(host)?;
        let (home, name) = if as_user {
            (self.user.home.clone(), self.user.name.as_str())
        } else {
            (PathBuf::from("/root"), "root")
        };
        let mut c = Command::new("nsenter");
        c.args(["-t", &init.pid.to_string(), "-n", "-u", "-m", "-p"]);
        c.arg(format!(
            "--wd={}",
            if as_user {
                home.as_path()
            } else {
                Path::new("/")
            }
            .display()
        ));
        c.args(["--", "setpriv"]);
        if as_user {
            let (uid, gid) = (self.user.uid.to_string(), self.user.gid.to_string());
            c.args(["--reuid", &uid, "--regid", &gid, "--init-groups"]);
        }
        c.args(["--pdeathsig", "KILL", "--"]).args(argv);
        c.env_clear()
            .env("PATH", PATH)
            .env("HOME", &home)
            .env("USER", name)
            .env("LOGNAME", name)
            .env("SHELL", "/bin/bash")
            .env("LANG", "C.UTF-8");
        Ok(c)
    }

    /// Runs `argv` as root inside `host` and returns its output (any exit status).
    pub fn exec(&self, host: &str, argv: &[&str]) -> Result<Output, LabError> {
        let mut c = self.command(host, argv, false)?;
        cmd::output(
            c.stdin(Stdio::null()),
            "is util-linux (nsenter, setpriv) installed?",
        )
    }

    /// Runs `argv` as the lab user inside `host` and returns its output.
    pub fn exec_as_user(&self, host: &str, argv: &[&str]) -> Result<Output, LabError> {
        let mut c = self.command(host, argv, true)?;
        cmd::output(
            c.stdin(Stdio::null()),
            "is util-linux (nsenter, setpriv) installed?",
        )
    }

    /// Starts a long-running process inside `host` (stdin null, stdout/stderr inherited;
    /// use [`Lab::command`] for other stdio). The returned child is the `nsenter` wrapper
    /// whose exit status is the process's. Stop it with [`Lab::kill_spawned`]; crashing the
    /// host kills it too.
    ///
    /// `Child::kill` alone kills only the wrapper: the process inside then dies by its
    /// parent-death signal but stays a zombie until the machine's init reaps it, and a host
    /// cannot finish dying (crash, teardown) before that.
    pub fn spawn(&self, host: &str, argv: &[&str], as_user: bool) -> Result<Child, LabError> {
        let mut c = self.command(host, argv, as_user)?;
        c.stdin(Stdio::null())
            .spawn()
            .map_err(|source| LabError::Spawn {
                command: cmd::describe(&c),
                source,
                help: "is util-linux (nsenter, setpriv) installed?".into(),
            })
    }

    /// Stops a process started by [`Lab::spawn`] or [`Lab::command`]: SIGKILL to the process
    /// inside the host first (so its wrapper reaps it at once), then waits for the wrapper.
    pub fn kill_spawned(&self, child: &mut Child) -> Result<ExitStatus, LabError> {
        kill_inside(child)
    }

    /// Stops a process started by [`Lab::spawn`] or [`Lab::command`] the polite way: SIGTERM
    /// to the process inside the host (an `agent` then ends its job and its subagents), then
    /// waits for it.
    pub fn stop_spawned(&self, child: &mut Child) -> Result<ExitStatus, LabError> {
        signal_inside(child, Signal::SIGTERM)
    }

    /// An `ssh` command from the root namespace to `host` (as root with the lab's root key,
    /// or as the lab user with the user's key). Append the remote command and run it.
    pub fn ssh(&self, host: &str, as_user: bool) -> Result<Command, LabError> {
        self.host(host)?;
        let mut c = Command::new("ssh");
        c.arg("-F").arg(self.ssh_config());
        if as_user {
            c.arg("-i")
                .arg(&self.user.key)
                .args(["-l", &self.user.name]);
        }
        c.arg(host);
        Ok(c)
    }

    /// Crashes `host`: SIGKILL to its `unshare`, so every process of the host dies at once.
    /// Its netns and veth stay; [`Lab::boot`] starts it again.
    pub fn crash(&self, host: &str) -> Result<(), LabError> {
        self.host(host)?;
        self.kill_host(host)
    }

    /// Boots a crashed `host` with fresh /tmp, /run and /var/log; returns when its sshd
    /// accepts connections (or, while partitioned, listens).
    pub fn boot(&self, host: &str) -> Result<(), LabError> {
        self.host(host)?;
        if self.is_running(host) {
            return Err(LabError::HostRunning { host: host.into() });
        }
        self.kill_host(host)?; // clears a half-dead host (e.g. init gone, unshare not)
        let init = self.start_host(host)?;
        let m = self.manifest().clone();
        host::wait_ready(&m, m.host(host)?, init)
    }

    /// Whether `host`'s process tree is alive.
    pub fn is_running(&self, host: &str) -> bool {
        if let Some(child) = self.children_lock().get_mut(host) {
            let _ = child.try_wait(); // reaps a dead unshare so it is not a zombie
        }
        self.running_init(host).is_ok()
    }

    /// Cuts `host` off the lab network (its veth's root side goes down).
    pub fn partition(&self, host: &str) -> Result<(), LabError> {
        self.set_partitioned(host, true)
    }

    /// Reconnects a partitioned `host`.
    pub fn heal(&self, host: &str) -> Result<(), LabError> {
        self.set_partitioned(host, false)
    }

    fn set_partitioned(&self, host: &str, partitioned: bool) -> Result<(), LabError> {
        let mut m = self.manifest();
        net::set_link(m.host(host)?, !partitioned)?;
        m.host_mut(host)?.partitioned = partitioned;
        m.write()
    }

    /// Whether `host` is partitioned.
    pub fn is_partitioned(&self, host: &str) -> Result<bool, LabError> {
        Ok(self.manifest().host(host)?.partitioned)
    }

    /// Records a login of `user` on `host` with tty `/dev/shm/rbtty-<tty>` (inside that
    /// host only) that has been idle for `idle`. See [`FakeLogin`].
    pub fn fake_login(
        &self,
        host: &str,
        user: &str,
        tty: &str,
        idle: std::time::Duration,
    ) -> Result<FakeLogin, LabError> {
        FakeLogin::start(self, host, user, tty, idle)
    }
}

/// See [`Lab::kill_spawned`]. The wrapper may not have forked its child yet: wait for the
/// child (or the wrapper's exit) before killing, and kill the wrapper only as a last resort.
pub(crate) fn kill_inside(child: &mut Child) -> Result<ExitStatus, LabError> {
    signal_inside(child, Signal::SIGKILL)
}

/// Sends `signal` to the process a wrapper (`nsenter`) runs inside a host, then waits for
/// the wrapper.
pub(crate) fn signal_inside(child: &mut Child, signal: Signal) -> Result<ExitStatus, LabError> {
    let mut inside = Vec::new();
    let found = poll(
        Duration::from_secs(5),
        &format!("the child of nsenter pid {}", child.id()),
        "",
        || {
            if child.try_wait().ok().flatten().is_some() {
                return Ok(true);
            }
            inside = children(child.id());
            Ok(!inside.is_empty())
        },
    );
    if found.is_err() {
        let _ = child.kill();
    }
    for p in inside.into_iter().filter_map(ProcRef::of) {
        p.signal(signal)?;
    }
    child.wait().map_err(LabError::io(
        "wait for",
        format!("/proc/{}", child.id()),
        "was the child already waited for?",
    ))
}
