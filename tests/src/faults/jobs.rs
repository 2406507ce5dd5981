//! The jobs of a fault scenario: agents on the gateway whose apps bind `anyLinux-N`
//! instances running tagged remote commands, and the processes they leave on the hosts.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::{faults_dir, AGENT_EXIT_BOUND, LEFTOVER_BOUND};
use crate::{bin, labtier::LabWithBroker, wait_until};

/// One job of the stream: its agent and the file that ends its app.
#[derive(Debug)]
pub struct Job {
    pub marker: String,
    pub instances: usize,
    pub stop: PathBuf,
    pub child: Child,
    /// When the driver ended the app (created the stop file) or killed the agent.
    pub ended_at: Option<Instant>,
    pub exited: bool,
}

/// The jobs of a scenario, the temp dir of their stop files and the dir of the agents' logs.
pub struct Jobs {
    pub dir: tempfile::TempDir,
    pub logs: PathBuf,
    pub list: Vec<Job>,
    next: usize,
}

impl Jobs {
    /// Agents log (`RB_LOG=info`) to `target/faults/logs/SCENARIO/MARKER.log`.
    pub fn new(scenario: &str) -> Self {
        let logs = faults_dir().join("logs").join(scenario);
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).expect("mkdir logs");
        Self {
            logs,
            dir: tempfile::Builder::new()
                .prefix("rb-faults-")
                .tempdir_in("/var/tmp")
                .expect("tempdir"),
            list: Vec::new(),
            next: 1,
        }
    }

    /// Starts an adaptive job whose app binds `instances` instances (`anyLinux-1..`), each
    /// running a long sleep tagged with the job's marker, then waits for its stop file.
    pub fn start(&mut self, env: &LabWithBroker, instances: usize) -> &Job {
        self.start_running(env, instances, "sleep 600")
    }

    /// [`start`](Self::start) with `body` as each instance's remote command (after the
    /// marker's `export`), e.g. `trap '' TERM; sleep 600` for one that outlasts SIGTERM.
    pub fn start_running(&mut self, env: &LabWithBroker, instances: usize, body: &str) -> &Job {
        let marker = format!("j{}", self.next);
        self.next += 1;
        let stop = self.dir.path().join(format!("stop-{marker}"));
        let mut script = String::new();
        for i in 1..=instances {
            script.push_str(&format!(
                "rsh anyLinux-{i} \"export RBFAULT={marker}; {body}\" </dev/null >/dev/null 2>&1 & "
            ));
        }
        script.push_str(&format!(
            "while [ ! -e {} ]; do sleep 0.1; done",
            stop.display()
        ));
        let log = std::fs::File::create(self.logs.join(format!("{marker}.log"))).expect("log");
        let child = Command::new(bin("agent"))
            .arg("--broker")
            .arg(env.broker.tcp_addr().to_string())
            .arg("--secret-file")
            .arg(env.broker.secret())
            .args(["--grace-s", "1", "--rsl", "(adaptive=yes)", "--"])
            .args(["sh", "-c", &script])
            .env_remove("RB_AGENT")
            .env_remove("RB_LAB")
            .env("RBFAULTJOB", &marker)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .env("RB_LOG", "info")
            .spawn()
            .expect("start agent");
        self.list.push(Job {
            marker,
            instances,
            stop,
            child,
            ended_at: None,
            exited: false,
        });
        self.list.last().expect("just pushed")
    }

    /// Jobs whose app has not been ended.
    pub fn live(&self) -> impl Iterator<Item = &Job> {
        self.list.iter().filter(|j| j.ended_at.is_none())
    }

    /// Ends the app of the `i`th live job (its agent should then end the job and exit).
    pub fn end_app(&mut self, i: usize) -> Option<String> {
        let job = self
            .list
            .iter_mut()
            .filter(|j| j.ended_at.is_none())
            .nth(i)?;
        std::fs::write(&job.stop, b"").expect("stop file");
        job.ended_at = Some(Instant::now());
        Some(job.marker.clone())
    }

    /// SIGKILLs the agent of the `i`th live job.
    pub fn kill_agent(&mut self, i: usize) -> Option<String> {
        let job = self
            .list
            .iter_mut()
            .filter(|j| j.ended_at.is_none())
            .nth(i)?;
        let _ = job.child.kill();
        job.ended_at = Some(Instant::now());
        eprintln!("fault: agent of {} killed", job.marker);
        Some(job.marker.clone())
    }

    /// Reaps exited agents; an agent still running [`AGENT_EXIT_BOUND`] after its app
    /// ended is a violation (and is killed so the run goes on).
    pub fn reap(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for job in self.list.iter_mut().filter(|j| !j.exited) {
            if job.child.try_wait().ok().flatten().is_some() {
                job.exited = true;
            } else if let Some(at) = job.ended_at {
                if at.elapsed() > AGENT_EXIT_BOUND {
                    out.push(format!(
                        "agent of {} still running {:?} after its app ended",
                        job.marker,
                        at.elapsed()
                    ));
                    let _ = job.child.kill();
                    let _ = job.child.wait();
                    job.exited = true;
                }
            }
        }
        out
    }

    /// Ends every app and waits for every agent (bounded); returns the violations.
    pub fn end_all(&mut self) -> Vec<String> {
        while self.end_app(0).is_some() {}
        let mut out = Vec::new();
        wait_until(AGENT_EXIT_BOUND + Duration::from_secs(2), || {
            out.extend(self.reap());
            self.list.iter().all(|j| j.exited).then_some(())
        });
        out.extend(self.reap());
        out
    }

    /// Markers of the jobs whose agent has exited.
    pub fn ended_markers(&self) -> BTreeSet<String> {
        self.list
            .iter()
            .filter(|j| j.exited)
            .map(|j| j.marker.clone())
            .collect()
    }
}

impl Drop for Jobs {
    fn drop(&mut self) {
        for job in &mut self.list {
            let _ = job.child.kill();
            let _ = job.child.wait();
        }
    }
}

/// `(host, marker)` for every process on the lab hosts whose environment has `RBFAULT=`.
pub fn job_processes(env: &LabWithBroker) -> Vec<(String, String)> {
    let script = "for f in /proc/[0-9]*/environ; do \
                  m=$(tr '\\0' '\\n' < $f 2>/dev/null | sed -n 's/^RBFAULT=//p'); \
                  [ -n \"$m\" ] && echo \"$m\"; done; true";
    let mut out = Vec::new();
    for host in env.lab.hosts() {
        if !env.lab.is_running(&host.name) {
            continue;
        }
        if let Ok(o) = env.lab.exec(&host.name, &["sh", "-c", script]) {
            for m in String::from_utf8_lossy(&o.stdout).lines() {
                out.push((host.name.clone(), m.trim().to_string()));
            }
        }
    }
    out
}

/// Waits up to [`LEFTOVER_BOUND`] for the processes of the ended jobs `ended` to go;
/// returns those still there (`host: marker`).
pub fn leftovers(env: &LabWithBroker, ended: &BTreeSet<String>) -> Vec<String> {
    let find = || -> Vec<String> {
        job_processes(env)
            .into_iter()
            .filter(|(_, m)| ended.contains(m))
            .map(|(h, m)| format!("{h}: process of ended job {m}"))
            .collect()
    };
    wait_until(LEFTOVER_BOUND, || {
        let left = find();
        left.is_empty().then_some(())
    })
    .map_or_else(find, |()| Vec::new())
}

/// Hosts where processes of two jobs run at once: a host went to a second job while the
/// first one's processes were still there.
pub fn shared_hosts(procs: &[(String, String)]) -> Vec<String> {
    let mut by_host: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (h, m) in procs {
        by_host.entry(h).or_default().insert(m);
    }
    by_host
        .into_iter()
        .filter(|(_, ms)| ms.len() > 1)
        .map(|(h, ms)| format!("{h} runs processes of jobs {ms:?} at once"))
        .collect()
}
