//! Tier 2, `rb report TRACE_DIR --svg FILE`: a real broker of virtual hosts records its
//! decision trace while a job holds a host, an admin drains one, an owner comes back to
//! another and a host daemon dies; the chart drawn from that trace must carry, state by
//! state, the host-seconds `rb policy replay` reports for it (the areas' `data-host-s`, the
//! `<desc>` totals, and the per-host rows' sums). Plus `rb report`'s exit codes.

use std::{path::Path, process::Output, time::Duration};

use proto::report::HostState;
use tests::{local_lab, rb, wait_until, Broker};

const STATES: [&str; 5] = ["lent", "free", "owner", "drained", "down"];

/// Four virtual hosts; vhost04 is alice's workstation.
fn lab() -> String {
    local_lab(4).replace(
        "name = \"vhost04\"\nlabels = [\"public\"]",
        "name = \"vhost04\"\nowner = \"alice\"",
    )
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The values of `attr="…"` in `doc`, in order.
fn values<'a>(doc: &'a str, attr: &str) -> Vec<&'a str> {
    let key = format!(" {attr}=\"");
    doc.match_indices(&key)
        .map(|(i, _)| {
            let rest = &doc[i + key.len()..];
            &rest[..rest.find('"').expect("closing quote")]
        })
        .collect()
}

fn number(v: &str) -> f64 {
    v.parse().unwrap_or_else(|_| panic!("not a number: {v:?}"))
}

/// `host states: lent L, free F, owner O, drained D, down W host-s` of `rb policy replay`.
fn replay_states(dir: &Path) -> Vec<f64> {
    let paper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/paper.toml");
    let out = rb(&[
        "policy",
        "replay",
        dir.to_str().expect("utf8"),
        "--policy",
        paper.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("host states: "))
        .unwrap_or_else(|| panic!("no host states line:\n{stdout}"));
    let line = line.strip_suffix(" host-s").expect("unit");
    let parts: Vec<(&str, &str)> = line
        .split(", ")
        .map(|p| p.split_once(' ').expect("NAME VALUE"))
        .collect();
    let names: Vec<&str> = parts.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, STATES, "{stdout}");
    parts.iter().map(|(_, v)| number(v)).collect()
}

/// Writes alice's overlay on vhost04: her console was used 5 s ago.
fn owner_back(broker: &Broker) {
    let overlay = broker.state_dir().join("hosts/vhost04/overlay.toml");
    let tmp = overlay.with_extension("tmp");
    std::fs::write(&tmp, "console_idle_s = 5\n").expect("write overlay");
    std::fs::rename(&tmp, &overlay).expect("rename overlay");
    broker.wait_host("vhost04", Duration::from_secs(20), "alice back", |h| {
        h.console_idle_s == Some(5)
    });
}

/// A daemon killed: the host is down until the broker has started another.
fn daemon_dies(broker: &Broker, host: &str) {
    let pid = broker.local_hostd_pid(host).expect("hostd pid");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    broker.wait_host(host, Duration::from_secs(20), "down", |h| {
        h.state == HostState::Down
    });
    broker.wait_host(host, Duration::from_secs(30), "up again", |h| {
        h.state == HostState::Up
    });
}

/// A job holding a host (`rsh anyHost sleep 300`), killed on drop.
struct Job(std::process::Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the lab through every state, stops the broker, and returns it (its trace kept)
/// with the hosts it drained and whose daemon it killed (two public hosts the job does not
/// hold: a held host stays lent whatever else happens to it).
fn recorded_run() -> (Broker, String, String) {
    let mut broker = Broker::start(&lab());
    broker.wait_all_up(Duration::from_secs(30));
    owner_back(&broker);
    let job = Job(broker
        .agent(&["rsh", "anyHost", "sleep", "300"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("agent"));
    let held = wait_until(Duration::from_secs(60), || {
        (broker.held_hosts().len() == 1).then_some(())
    });
    assert!(held.is_some(), "no host held:\n{}", broker.log());
    let held = broker.held_hosts();
    let mut others = ["vhost01", "vhost02", "vhost03"]
        .into_iter()
        .filter(|h| !held.iter().any(|x| x == h));
    let (drained, dead) = (
        others.next().expect("a public host not held").to_string(),
        others.next().expect("another").to_string(),
    );
    let out = broker.rb(&["drain", &drained]);
    assert!(out.status.success(), "{}", text(&out));
    daemon_dies(&broker, &dead);
    drop(job);
    let out = broker.rb(&["shutdown"]);
    assert!(out.status.success(), "{}", text(&out));
    let stopped = wait_until(Duration::from_secs(30), || {
        broker.child.try_wait().ok().flatten()
    });
    assert!(
        stopped.is_some(),
        "the broker did not stop:\n{}",
        broker.log()
    );
    (broker, drained, dead)
}

#[test]
fn the_chart_carries_the_replays_host_seconds_per_state() {
    let (broker, drained, dead) = recorded_run();
    let dir = broker.state_dir().join("trace");
    let want = replay_states(&dir);
    let svg = broker.dir.path().join("usage.svg");
    let out = rb(&[
        "report",
        dir.to_str().expect("utf8"),
        "--svg",
        svg.to_str().expect("utf8"),
        "--title",
        "a <test> lab",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc = std::fs::read_to_string(&svg).expect("the chart");
    let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-usage.svg");
    let _ = std::fs::write(&keep, &doc);
    eprintln!("chart kept as {}", keep.display());
    assert!(
        doc.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{doc}"
    );
    assert!(doc.contains("<title>a &lt;test&gt; lab</title>"), "{doc}");
    let out = rb(&[
        "report",
        dir.to_str().expect("utf8"),
        "--svg",
        "-",
        "--title",
        "a <test> lab",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        doc,
        "`--svg -`: the same chart"
    );

    // The areas: one per state, in order, with the replay's host-seconds (printed to 0.1).
    let areas: Vec<(&str, f64)> = values(&doc, "data-state")
        .into_iter()
        .zip(values(&doc, "data-host-s").into_iter().map(number))
        .collect();
    for ((state, got), (name, want)) in areas.iter().zip(STATES.iter().zip(&want)) {
        assert_eq!(state, name);
        assert!(
            (got - want).abs() <= 0.051,
            "{state}: chart {got}, replay {want}"
        );
    }
    assert_eq!(areas.len(), 5, "{doc}");
    for (i, state) in ["lent", "owner", "drained", "down"].iter().enumerate() {
        let got = areas.iter().find(|(s, _)| s == state).expect("area").1;
        assert!(got > 0.0, "no {state} time recorded ({i}): {areas:?}");
    }

    // The rows: one per host, summing to the areas.
    let hosts = values(&doc, "data-host");
    assert_eq!(hosts, ["vhost01", "vhost02", "vhost03", "vhost04"], "{doc}");
    for (state, total) in &areas {
        let rows: f64 = values(&doc, &format!("data-{state}-s"))
            .into_iter()
            .map(number)
            .sum();
        assert!(
            (rows - total).abs() <= 1e-6 * total.max(1.0),
            "{state}: rows {rows}, area {total}"
        );
    }
    let row = |host: &str, state: &str| {
        let i = hosts.iter().position(|h| *h == host).expect("row");
        number(values(&doc, &format!("data-{state}-s"))[i])
    };
    assert!(row(&drained, "drained") > 0.0, "{drained} drained");
    assert!(row("vhost04", "owner") > 0.0, "alice at vhost04");
    assert!(row(&dead, "down") > 0.0, "{dead}'s daemon killed");

    // The <desc> totals are the areas'.
    let desc = &doc[doc.find("<desc>").expect("desc") + 6..doc.find("</desc>").expect("end")];
    let desc: serde_json::Value = serde_json::from_str(desc).expect("desc is JSON");
    for (state, total) in &areas {
        let got = desc["host_s"][state].as_f64().expect("a number");
        assert!(
            (got - total).abs() <= 1e-9 * total.max(1.0),
            "{state}: {desc}"
        );
    }
    assert_eq!(desc["hosts"], 4, "{desc}");
}

#[test]
fn rb_report_says_what_is_wrong_with_its_input_and_output() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let svg = dir.join("out.svg");
    let run = |trace: &Path, svg: &Path| {
        rb(&[
            "report",
            trace.to_str().expect("utf8"),
            "--svg",
            svg.to_str().expect("utf8"),
        ])
    };
    let out = run(&dir.join("no-such-dir"), &svg);
    assert_eq!(out.status.code(), Some(66), "{}", text(&out));
    assert!(
        text(&out).contains("cannot read the trace directory"),
        "{}",
        text(&out)
    );
    let out = run(dir, &svg);
    assert_eq!(out.status.code(), Some(66), "{}", text(&out));
    assert!(text(&out).contains("no trace files"), "{}", text(&out));
    let trace = dir.join("trace");
    std::fs::create_dir(&trace).expect("mkdir");
    std::fs::write(trace.join("trace-000001.jsonl"), "{\"t_us\": oops\n").expect("write");
    let out = run(&trace, &svg);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(
        text(&out).contains("trace-000001.jsonl:1:"),
        "{}",
        text(&out)
    );
    assert!(!svg.exists(), "no chart from a bad trace");
    for (bad, why) in [
        (dir.join("no-dir/u.svg"), "its directory does not exist"),
        (dir.to_path_buf(), "it is a directory"),
    ] {
        let out = run(&trace, &bad);
        assert_eq!(out.status.code(), Some(73), "{}", text(&out));
        assert!(text(&out).contains(why), "{}", text(&out));
    }
}
