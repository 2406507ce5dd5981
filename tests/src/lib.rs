//! Shared helpers for the black-box tests: finding (and if needed building) the real
//! binaries, running a broker in a temp dir that is killed on drop, polling with deadlines.
//!
//! Tests never use fixed ports (the broker binds port 0 and publishes the real one in
//! `broker.json`) and never sleep to wait for a condition: they poll with [`wait_until`].

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use proto::report::{HostState, HostStatus};

pub mod apps;
pub mod faults;
pub mod labtier;
pub mod logind;
pub mod mw;
pub mod raw_agent;
pub mod slurm;

/// Directory holding the workspace's binaries (`target/<profile>`), built on first use.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let mut dir = exe
            .parent()
            .expect("executable has a directory")
            .to_path_buf();
        if dir.ends_with("deps") || dir.ends_with("examples") {
            dir.pop();
        }
        build_binaries(&dir);
        dir
    })
}

/// `cargo test` builds only the binaries of the package under test; build the others
/// (cheap when they are up to date). A test binary started outside cargo uses what is there.
fn build_binaries(dir: &Path) {
    let Ok(cargo) = std::env::var("CARGO") else {
        return;
    };
    let release = dir.ends_with("release");
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build", "--quiet", "-p", "broker", "-p", "hostd", "-p", "rb", "-p", "lab", "-p", "bench",
        "-p", "agent", "-p", "rsh-shim", "-p", "pvm-add", "-p", "lam-add", "-p", "jel-cli", "-p",
        "rb-bnb", "--bins",
    ]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "building the workspace binaries failed");
}

/// Path of one of the project's binaries.
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// `rb-jel-host` (jel's example that hosts a JEL pool by hand, job events on its stdin),
/// built once: it needs the jel crate's `tokio` feature, which no binary of the workspace has.
pub fn jel_host_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let dir = bin_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "jel", "--features", "tokio"]);
        cmd.args(["--example", "rb-jel-host"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("cargo").success(),
            "building rb-jel-host"
        );
        dir.join("examples/rb-jel-host")
    })
}

/// Polls `cond` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_until<T>(timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fields of `/proc/PID/stat` after the command name: state, ppid, pgrp, session, ….
pub fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.split_whitespace().map(String::from).collect())
}

/// Whether `pid` is a live process (zombies have ended).
pub fn process_running(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

/// Runs `rb ARGS` and returns its output.
pub fn rb(args: &[&str]) -> Output {
    Command::new(bin("rb"))
        .args(args)
        .env_remove("RB_BROKER")
        .env_remove("RB_LAB")
        .output()
        .expect("run rb")
}

/// A broker process in its own temp dir; killed (whole process group) on drop.
pub struct Broker {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub lab_file: PathBuf,
    /// The `rb-broker` executable it runs (this workspace's unless started with
    /// [`start_program`](Self::start_program)).
    program: PathBuf,
    /// Environment variables it runs with besides `RB_LOG` (test knobs).
    env: Vec<(String, String)>,
}

impl Broker {
    /// Writes `lab_text` (with `@STATE@` and `@SECRET@` replaced) and starts `rb-broker` on it.
    pub fn start(lab_text: &str) -> Broker {
        Self::start_prepared(lab_text, |_| {})
    }

    /// [`start`](Self::start), calling `prepare` with the state dir (not yet created) before
    /// the broker starts: e.g. to mount a small tmpfs there.
    pub fn start_prepared(lab_text: &str, prepare: impl FnOnce(&Path)) -> Broker {
        Self::launch(bin("rb-broker"), lab_text, prepare, &[])
    }

    /// [`start`](Self::start) with environment variables set for the broker (test knobs
    /// such as `RB_AGENT_OUTBOX`).
    pub fn start_env(lab_text: &str, env: &[(&str, &str)]) -> Broker {
        Self::launch(bin("rb-broker"), lab_text, |_| {}, env)
    }

    /// [`start`](Self::start) with another `rb-broker` executable: a benchmark's baseline
    /// built from an older commit (it must accept `lab_text` and serve `rb status --json`).
    pub fn start_program(program: &Path, lab_text: &str) -> Broker {
        Self::launch(program.to_path_buf(), lab_text, |_| {}, &[])
    }

    fn launch(
        program: PathBuf,
        lab_text: &str,
        prepare: impl FnOnce(&Path),
        env: &[(&str, &str)],
    ) -> Broker {
        let dir = tempfile::Builder::new()
            .prefix("rb-test-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let secret = dir.path().join("secret");
        proto::auth::write_new_secret(&secret, false).expect("secret");
        let state = dir.path().join("state");
        prepare(&state);
        let text = lab_text
            .replace("@STATE@", &state.display().to_string())
            .replace("@SECRET@", &secret.display().to_string());
        let lab_file = dir.path().join("lab.toml");
        std::fs::write(&lab_file, text).expect("write lab");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let child = spawn_broker(&program, &lab_file, &dir.path().join("broker.log"), &env);
        let broker = Broker {
            child,
            dir,
            lab_file,
            program,
            env,
        };
        let sock = broker.socket();
        assert!(
            wait_until(Duration::from_secs(10), || sock.exists().then_some(())).is_some(),
            "broker did not start:\n{}",
            broker.log()
        );
        broker.assert_info_is_mine();
        broker
    }

    /// Once the control socket exists, `broker.json` describes this broker (scripts that
    /// wait for the socket read the TCP address from it at once).
    fn assert_info_is_mine(&self) {
        let path = self.state_dir().join("broker.json");
        let info: Option<serde_json::Value> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let pid = info.as_ref().and_then(|v| v["pid"].as_u64());
        assert_eq!(
            pid,
            Some(u64::from(self.child.id())),
            "the control socket is up, so {} names this broker: {info:?}\n{}",
            path.display(),
            self.log()
        );
    }

    /// Stops the broker: SIGTERM, SIGKILL when it has not stopped 8 s later (what dropping
    /// it does, before its directory is removed). Stopping a stopped broker does nothing.
    pub fn stop(&mut self) {
        // Ended and reaped: its pid may be another process's now.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let stopped = wait_until(Duration::from_secs(8), || {
            self.child.try_wait().ok().flatten()
        });
        if stopped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// SIGKILLs the broker and starts a new one on the same lab file and state dir.
    pub fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.socket());
        self.child = spawn_broker(
            &self.program,
            &self.lab_file,
            &self.dir.path().join("broker.log"),
            &self.env,
        );
        let sock = self.socket();
        let up = wait_until(Duration::from_secs(10), || sock.exists().then_some(()));
        assert!(up.is_some(), "broker did not restart:\n{}", self.log());
        self.assert_info_is_mine();
    }

    /// The broker process's pid (to stop it with SIGSTOP in a test).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn socket(&self) -> PathBuf {
        self.state_dir().join("broker.sock")
    }

    /// `agent --broker SOCKET --grace-s 1 -- ARGS…` with this broker's lab, outside any job.
    pub fn agent(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("agent"));
        cmd.arg("--broker")
            .arg(self.socket())
            .arg("--grace-s")
            .arg("1")
            .arg("--")
            .args(args);
        cmd.env_remove("RB_AGENT").env_remove("RB_LAB");
        cmd
    }

    pub fn secret(&self) -> PathBuf {
        self.dir.path().join("secret")
    }

    /// The TCP address the broker really listens on.
    pub fn tcp_addr(&self) -> std::net::SocketAddr {
        let text =
            std::fs::read_to_string(self.state_dir().join("broker.json")).expect("broker.json");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["listen"].as_str().expect("listen").parse().expect("addr")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// `rb --broker <socket> ARGS`.
    pub fn rb(&self, args: &[&str]) -> Output {
        let sock = self.socket().display().to_string();
        let mut all = vec!["--broker", sock.as_str()];
        all.extend_from_slice(args);
        rb(&all)
    }

    /// `rb jobs --json`, parsed; empty if the broker did not answer.
    pub fn jobs(&self) -> Vec<serde_json::Value> {
        serde_json::from_slice(&self.rb(&["jobs", "--json"]).stdout).unwrap_or_default()
    }

    /// Hosts held by running jobs, in job order.
    pub fn held_hosts(&self) -> Vec<String> {
        self.jobs()
            .iter()
            .filter(|j| j["state"] == "running")
            .flat_map(|j| {
                serde_json::from_value::<Vec<String>>(j["hosts"].clone()).unwrap_or_default()
            })
            .collect()
    }

    /// `rb status --json`, parsed; `None` if the broker did not answer.
    pub fn status(&self) -> Option<Vec<HostStatus>> {
        let out = self.rb(&["status", "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    pub fn host(&self, name: &str) -> Option<HostStatus> {
        self.status()?.into_iter().find(|h| h.name == name)
    }

    /// Waits until `pred` holds for host `name`; panics with the broker log otherwise.
    pub fn wait_host(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&HostStatus) -> bool,
    ) -> HostStatus {
        match wait_until(timeout, || self.host(name).filter(|h| pred(h))) {
            Some(h) => h,
            None => panic!(
                "{name}: {what} not seen within {timeout:?}; last: {:#?}\nbroker log:\n{}",
                self.host(name),
                self.log()
            ),
        }
    }

    /// Waits until every host is up.
    pub fn wait_all_up(&self, timeout: Duration) -> Vec<HostStatus> {
        let got = wait_until(timeout, || {
            self.status()
                .filter(|hs| !hs.is_empty() && hs.iter().all(|h| h.state == HostState::Up))
        });
        got.unwrap_or_else(|| {
            panic!(
                "not all hosts up within {timeout:?}: {:#?}\nbroker log:\n{}",
                self.status(),
                self.log()
            )
        })
    }

    /// Pid of a virtual host's daemon, from its lock file.
    pub fn local_hostd_pid(&self, host: &str) -> Option<i32> {
        let path = self
            .state_dir()
            .join("hosts")
            .join(host)
            .join(format!("hostd-{host}.lock"));
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_broker(program: &Path, lab_file: &Path, log: &Path, env: &[(String, String)]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    Command::new(program)
        .arg("--lab")
        .arg(lab_file)
        .env("RB_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start rb-broker")
}

/// A lab file for `n` virtual hosts on this machine (local transport), fast intervals.
pub fn local_lab(n: usize) -> String {
    local_lab_timed(n, 0.5, 2.0)
}

/// Like [`local_lab`], with the report interval and silence limit given (seconds).
pub fn local_lab_timed(n: usize, interval_s: f64, down_after_s: f64) -> String {
    let mut text = format!(
        "[broker]\nlisten = \"127.0.0.1:0\"\ntransport = \"local\"\nstate_dir = \"@STATE@\"\nsecret_file = \"@SECRET@\"\nreport_interval_s = {interval_s}\ndown_after_s = {down_after_s}\nrestart_backoff_max_s = 1\n",
    );
    for i in 1..=n {
        text.push_str(&format!(
            "\n[[host]]\nname = \"vhost{i:02}\"\nlabels = [\"public\"]\n"
        ));
    }
    text
}

/// True when running as root (the lab tier needs it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
