//! Tests of `job_load`: the pure average (a table of counter sequences), the `/proc` edge
//! on a fake proc tree (the verdict cache) and against real busy processes.

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use super::*;

const MARK: &str = "0123456789abcdef";
const HZ: f64 = 100.0;

fn u(pid: i32, start: u64, ticks: u64) -> Usage {
    Usage { pid, start, ticks }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The average after one second at `rate` CPUs, from `from`.
fn one_second(from: f64, rate: f64) -> f64 {
    let keep = (-1.0 / TAU_S).exp();
    from * keep + rate * (1.0 - keep)
}

#[test]
fn the_average_follows_cpu_time_like_load1() {
    let s1 = one_second(0.0, 1.0);
    // (name, samples one second apart, expected average after the last)
    let table: Vec<(&str, Vec<Vec<Usage>>, f64)> = vec![
        (
            "the first read is only a baseline",
            vec![vec![u(10, 5, 9000)]],
            0.0,
        ),
        ("no job process", vec![vec![], vec![]], 0.0),
        (
            "one process using one CPU",
            vec![vec![u(10, 5, 0)], vec![u(10, 5, 100)]],
            s1,
        ),
        (
            "two processes using half a CPU each",
            vec![
                vec![u(10, 5, 0), u(11, 6, 0)],
                vec![u(10, 5, 50), u(11, 6, 50)],
            ],
            s1,
        ),
        (
            "a process new since the last read counts all its time",
            vec![vec![], vec![u(12, 7, 100)]],
            s1,
        ),
        (
            "a reused pid is a new process",
            vec![vec![u(10, 5, 5000)], vec![u(10, 8, 100)]],
            s1,
        ),
        (
            "a counter going backwards counts nothing",
            vec![vec![u(10, 5, 500)], vec![u(10, 5, 100)]],
            0.0,
        ),
        (
            "a process gone counts nothing more",
            vec![vec![u(10, 5, 0)], vec![u(10, 5, 100)], vec![]],
            one_second(s1, 0.0),
        ),
    ];
    for (name, samples, want) in table {
        let mut j = JobLoad::new(HZ);
        let t0 = Instant::now();
        let mut got = f64::NAN;
        for (i, s) in samples.iter().enumerate() {
            got = j.advance(s, t0 + Duration::from_secs(i as u64));
        }
        assert!(close(got, want), "{name}: got {got}, want {want}");
    }
}

#[test]
fn a_steady_job_reaches_its_cpus_and_an_ended_one_decays_in_a_minute() {
    let mut j = JobLoad::new(HZ);
    let t0 = Instant::now();
    let mut avg = 0.0;
    for s in 0..=600u64 {
        avg = j.advance(&[u(10, 5, s * 200)], t0 + Duration::from_secs(s));
    }
    assert!(
        (avg - 2.0).abs() < 1e-3,
        "two CPUs busy for 10 minutes: {avg}"
    );
    let after = j.advance(&[], t0 + Duration::from_secs(660));
    assert!(
        (after - 2.0 * (-1.0f64).exp()).abs() < 1e-3,
        "a minute after: {after}"
    );
}

#[test]
fn parse_usage_counts_fields_after_the_command_name() {
    let stat = "4242 (my (odd) cmd) R 1 4242 4242 0 -1 4194304 120 0 0 0 \
                250 37 0 0 20 0 1 0 987654 1234567 100 18446744073709551615";
    assert_eq!(parse_usage(4242, stat), Some(u(4242, 987654, 287)));
    assert_eq!(parse_usage(1, "garbage"), None);
}

fn fake_stat(pid: i32, ticks: u64) -> String {
    format!("{pid} (job) R 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 777 0 0")
}

fn write_proc(root: &Path, pid: i32, tag: Option<&str>, ticks: u64) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).expect("mkdir");
    let env = match tag {
        Some(t) => format!("HOME=/x\0RB_SUBAGENT_TAG={t}\0"),
        None => "HOME=/x\0".to_string(),
    };
    std::fs::write(dir.join("environ"), env).expect("environ");
    std::fs::write(dir.join("stat"), fake_stat(pid, ticks)).expect("stat");
}

#[test]
fn environ_is_read_once_per_pid_and_only_this_labs_tags_count() {
    let root = tempfile::tempdir().expect("tempdir");
    let tag = format!("3.99.{MARK}");
    write_proc(root.path(), 100, Some(&tag), 0);
    write_proc(root.path(), 101, None, 0);
    write_proc(root.path(), 102, Some("3.99.fedcba9876543210"), 0);
    write_proc(root.path(), 103, Some("7.98"), 0);
    let scope = Scope {
        proc_root: root.path(),
        lab_mark: MARK,
        own_tag: None,
    };
    let mut j = JobLoad::new(HZ);
    let t0 = Instant::now();
    assert_eq!(j.sample(&scope, t0), Some(0.0));
    for pid in 100..=103 {
        write_proc(root.path(), pid, None, 100);
    }
    // An untagged pid is read once more (a fork not yet exec'd looks untagged): 101 now
    // carries the tag and counts from here on.
    write_proc(root.path(), 101, Some(&tag), 100);
    // 100's environ no longer has the tag: the verdict of its first read stands.
    let got = j
        .sample(&scope, t0 + Duration::from_secs(1))
        .expect("known");
    // 100 used one CPU; 101 is new to the count and counts all its 100 ticks too.
    assert!(close(got, one_second(0.0, 2.0)), "pids 100 and 101: {got}");
    assert_eq!(j.verdicts.get(&101), Some(&Verdict::Job));
    assert_eq!(
        j.verdicts.get(&102),
        Some(&Verdict::Other),
        "final after two reads"
    );
    std::fs::remove_dir_all(root.path().join("100")).expect("rm");
    j.sample(&scope, t0 + Duration::from_secs(2));
    assert!(!j.verdicts.contains_key(&100), "a pid gone is forgotten");
    let missing = Scope {
        proc_root: Path::new("/nonexistent/proc"),
        ..scope
    };
    assert_eq!(j.sample(&missing, t0), None, "unknown, not 0");
}

/// A busy shell loop, tagged with `tag` when given.
fn busy(tag: Option<&str>) -> Child {
    let mut c = Command::new("sh");
    c.args(["-c", "while :; do :; done"]);
    match tag {
        Some(t) => c.env(proto::tag::SUBAGENT_TAG_VAR, t),
        None => c.env_remove(proto::tag::SUBAGENT_TAG_VAR),
    };
    c.spawn().expect("spawn sh")
}

#[test]
fn a_busy_tagged_process_raises_job_load_and_an_untagged_one_does_not_count() {
    let tag = format!("{}.1.{MARK}", 900_000 + std::process::id());
    let mut job = busy(Some(&tag));
    let mut other = busy(None);
    let scope = Scope {
        proc_root: Path::new("/proc"),
        lab_mark: MARK,
        own_tag: None,
    };
    let mut j = JobLoad::default();
    j.sample(&scope, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut load = 0.0;
    while load <= 0.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        load = j.sample(&scope, Instant::now()).expect("/proc lists");
    }
    let verdict = |c: &Child| j.verdicts.get(&(c.id() as i32)).copied();
    let (job_verdict, other_verdict) = (verdict(&job), verdict(&other));
    for c in [&mut job, &mut other] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(load > 0.0, "the busy job process shows as load");
    assert!(
        load < 0.5,
        "averaged over a minute, not instantaneous: {load}"
    );
    assert_eq!(job_verdict, Some(Verdict::Job));
    assert!(matches!(
        other_verdict,
        Some(Verdict::Other | Verdict::OtherOnce)
    ));
}
