//! `rb-bnb`, the branch-and-bound example application (issue 18), local tier: a real agent
//! with virtual hosts. The answer is checked against `rb-bnb --brute-force` (every tour
//! tried) while the job grows onto granted hosts, loses one to `rb release` (its `vacate`
//! hands the task on), and loses a worker to SIGKILL (`died`).

use std::{
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use tests::{bin, local_lab, wait_until, Broker};

/// The exact optimum, by `rb-bnb --brute-force`.
fn brute_force(cities: u32, seed: u32) -> String {
    let out = Command::new(bin("rb-bnb"))
        .args([
            "--cities",
            &cities.to_string(),
            "--seed",
            &seed.to_string(),
            "--brute-force",
        ])
        .output()
        .expect("rb-bnb --brute-force");
    assert!(out.status.success(), "{out:?}");
    last_line(&out.stdout)
}

fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines().last().unwrap_or_default().to_string()
}

/// `agent rb-bnb --cities C --seed S --task-ms MS -- '(adaptive=yes)'`, stdout and stderr piped.
fn start_job(broker: &Broker, cities: u32, seed: u32, task_ms: u32) -> Child {
    let bnb = bin("rb-bnb").display().to_string();
    let (c, s, ms) = (cities.to_string(), seed.to_string(), task_ms.to_string());
    broker
        .agent(&[
            &bnb,
            "--cities",
            &c,
            "--seed",
            &s,
            "--task-ms",
            &ms,
            "--",
            "(adaptive=yes)",
        ])
        .env_remove("RB_JEL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent")
}

fn finish(job: Child) -> (Output, String) {
    let out = job.wait_with_output().expect("wait for the job");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the job failed: {err}");
    (out, err)
}

/// The number before `what` in rb-bnb's summary on stderr (`… 3 handed out again …`).
fn summary_count(stderr: &str, what: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("rb-bnb:") && l.contains(what))
        .unwrap_or_else(|| panic!("no summary with {what:?} in {stderr}"));
    let before = &line[..line.find(what).expect("what")];
    let word = before.split_whitespace().last().expect("a number");
    word.trim_start_matches(['(', ','])
        .parse()
        .expect("a count")
}

#[test]
fn it_grows_onto_granted_hosts_and_finds_the_optimum() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    let job = start_job(&broker, 10, 7, 10);
    let (out, err) = finish(job);
    assert_eq!(last_line(&out.stdout), brute_force(10, 7), "{err}");
    assert!(
        summary_count(&err, "workers on granted hosts") >= 2,
        "it grew onto the free hosts: {err}"
    );
}

#[test]
fn a_released_host_hands_its_task_on_and_the_answer_stays_right() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    // 504 tasks of at least 40 ms: about 5 s on 4 workers, so the release comes mid-run
    // while every worker holds a task.
    let job = start_job(&broker, 10, 11, 40);
    wait_until(Duration::from_secs(20), || {
        broker
            .held_hosts()
            .iter()
            .any(|h| h == "vhost01")
            .then_some(())
    })
    .expect("the job is granted vhost01");
    let out = broker.rb(&["release", "vhost01", "--grace-s", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (out, err) = finish(job);
    assert_eq!(last_line(&out.stdout), brute_force(10, 11), "{err}");
    assert!(
        summary_count(&err, "at a vacate") >= 1,
        "the vacated worker's task was handed on at the vacate: {err}"
    );
}

/// The pids of this job's workers: rb-bnb processes started with `--worker` and our seed.
fn worker_pids(seed: u32) -> Vec<i32> {
    let seed_arg = seed.to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_bnb = args.first().is_some_and(|a| a.ends_with(b"rb-bnb"));
            let seeded = args
                .windows(2)
                .any(|w| w[0] == b"--seed" && w[1] == seed_arg.as_bytes());
            is_bnb && args.contains(&&b"--worker"[..]) && seeded
        })
        .collect()
}

/// How many sockets process `pid` has open.
fn sockets(pid: i32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

#[test]
fn a_worker_killed_mid_task_is_seen_dead_and_its_task_is_redone() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let seed = 4242;
    let job = start_job(&broker, 10, seed, 40);
    // A worker that has joined the pool and called the master back (two sockets) has said
    // hello in the same breath, and is handed a task at once: the tasks outnumber the workers.
    let pid = wait_until(Duration::from_secs(20), || {
        worker_pids(seed).into_iter().find(|&pid| sockets(pid) >= 2)
    })
    .expect("a worker on a granted host is connected");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    let (out, err) = finish(job);
    assert_eq!(last_line(&out.stdout), brute_force(10, seed), "{err}");
    assert!(
        summary_count(&err, "handed out again") >= 1,
        "the dead worker's task was handed out again: {err}"
    );
}
