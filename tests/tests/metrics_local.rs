//! Tier 2, the broker's `[web]` listener: a real Prometheus (Debian's `prometheus`) scrapes
//! `/metrics` from a broker of virtual hosts while jobs run, and its query API must agree
//! with `rb status --json`; `promtool check metrics` accepts the exposition; job details
//! need the web token; `rb check` refuses public job details on a non-loopback listener.
//! Without the `prometheus` package (test.sh installs it as root) the Prometheus test is
//! skipped, saying why.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use tests::{bin, is_root, local_lab, rb, wait_until, Broker};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

fn web_lab(n: usize) -> String {
    format!("{}\n[web]\nlisten = \"127.0.0.1:0\"\n", local_lab(n))
}

/// The bound `[web]` address, from `STATE_DIR/broker.json`.
fn web_addr(broker: &Broker) -> SocketAddr {
    let info = std::fs::read_to_string(broker.state_dir().join("broker.json")).expect("info");
    let info: serde_json::Value = serde_json::from_str(&info).expect("json");
    info["web"]
        .as_str()
        .expect("web address in broker.json")
        .parse()
        .expect("addr")
}

/// A plain HTTP/1.1 GET: (status, body).
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, dechunk(head, body))
}

fn dechunk(head: &str, body: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

/// `agent --broker SOCKET -- rsh anyHost sleep 120`, killed on drop.
struct Job(Child);

impl Job {
    fn start(broker: &Broker) -> Job {
        let child = Command::new(bin("agent"))
            .arg("--broker")
            .arg(broker.socket())
            .args(["--grace-s", "1", "--", "rsh", "anyHost", "sleep", "120"])
            .env_remove("RB_AGENT")
            .env_remove("RB_LAB")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent");
        Job(child)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Prometheus server on loopback, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("rb-prometheus-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: rb\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .expect("config");
        let addr = free_port();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).expect("log"))
            .spawn()
            .expect("start prometheus");
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The value of instant query `q`, if it has exactly one sample.
    fn query(&self, q: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let stream = TcpStream::connect(self.addr).ok()?;
        drop(stream);
        let (status, body) = get(self.addr, &path, &[]);
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = v["data"]["result"].as_array()?;
        if result.len() != 1 {
            return None;
        }
        result[0]["value"][1].as_str()?.parse().ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Waits until `n` hosts are held by jobs.
fn wait_held(broker: &Broker, n: usize) {
    let held = wait_until(Duration::from_secs(60), || {
        (broker.held_hosts().len() == n).then_some(())
    });
    assert!(
        held.is_some(),
        "{n} hosts never held: {:?}\n{}",
        broker.held_hosts(),
        broker.log()
    );
}

fn prometheus_missing() -> bool {
    if Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists() {
        return false;
    }
    assert!(
        !is_root(),
        "{PROMETHEUS} is missing: install Debian's `prometheus` (test.sh's LAB_PACKAGES)"
    );
    eprintln!("skipped: {PROMETHEUS} is not installed (test.sh installs it as root)");
    true
}

#[test]
fn prometheus_scrapes_what_rb_status_shows() {
    if prometheus_missing() {
        return;
    }
    let broker = Broker::start(&web_lab(4));
    broker.wait_all_up(Duration::from_secs(60));
    let web = web_addr(&broker);
    let _jobs = [Job::start(&broker), Job::start(&broker)];
    wait_held(&broker, 2);
    let prometheus = Prometheus::start(web);

    let status = broker.status().expect("rb status --json");
    let up = status
        .iter()
        .filter(|h| h.state.to_string() == "up")
        .count() as f64;
    let held = status.iter().filter(|h| h.held_by.is_some()).count() as f64;
    // Nothing was released yet: every grant is a held host.
    let expect = [
        ("rb_grants_total", held),
        ("rb_hosts{state=\"up\"}", up),
        ("rb_hosts{state=\"down\"}", status.len() as f64 - up),
        ("sum(rb_hosts)", status.len() as f64),
        ("rb_hosts_alloc{alloc_state=\"held\"}", held),
        ("sum(rb_jobs{state=\"running\"})", 2.0),
    ];
    for (q, want) in expect {
        let got = wait_until(Duration::from_secs(90), || {
            prometheus.query(q).filter(|v| *v == want)
        });
        assert_eq!(
            got,
            Some(want),
            "Prometheus' {q} is {:?}, rb status says {want}\n{}",
            prometheus.query(q),
            prometheus.log()
        );
    }
    let reports = prometheus
        .query("rb_reports_total")
        .expect("reports counted");
    assert!(reports > 0.0, "{reports}");
}

#[test]
fn promtool_accepts_the_exposition_and_openmetrics_is_served_on_request() {
    if prometheus_missing() {
        return;
    }
    let broker = Broker::start(&web_lab(2));
    broker.wait_all_up(Duration::from_secs(60));
    let _job = Job::start(&broker);
    wait_held(&broker, 1);
    let web = web_addr(&broker);
    let (status, text) = get(web, "/metrics", &[]);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("# TYPE rb_grants_total counter"), "{text}");
    assert!(text.contains("rb_grants_total 1"), "{text}");
    assert!(text.contains("rb_grant_latency_seconds_bucket"), "{text}");
    assert!(!text.contains("# EOF"), "{text}");
    let mut check = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = check.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics refused it:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let accept = [("Accept", "application/openmetrics-text; version=1.0.0")];
    let (status, om) = get(web, "/metrics", &accept);
    assert_eq!(status, 200);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE rb_grants counter"), "{om}");
}

#[test]
fn job_details_need_the_web_token_host_states_do_not() {
    let broker = Broker::start(&web_lab(2));
    broker.wait_all_up(Duration::from_secs(60));
    let _job = Job::start(&broker);
    wait_held(&broker, 1);
    let web = web_addr(&broker);

    let (status, body) = get(web, "/api/status", &[]);
    assert_eq!(status, 200, "{body}");
    let hosts: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(hosts["hosts"].as_array().map(Vec::len), Some(2), "{body}");
    assert!(
        !body.contains("sleep"),
        "host view shows job details: {body}"
    );

    let (status, body) = get(web, "/api/jobs", &[]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("web-token"), "{body}");
    let (status, _) = get(
        web,
        "/api/jobs",
        &[("Authorization", "Bearer 0123456789abcdef0123456789abcdef")],
    );
    assert_eq!(status, 401);

    let token_file = broker.state_dir().join("web-token");
    let mode =
        std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&token_file).expect("token"));
    assert_eq!(mode & 0o077, 0, "web-token readable by others: {mode:o}");
    let token = std::fs::read_to_string(&token_file).expect("token");
    let bearer = format!("Bearer {}", token.trim());
    let (status, body) = get(web, "/api/jobs", &[("Authorization", &bearer)]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("sleep"), "the job's command line: {body}");
}

#[test]
fn rb_check_refuses_public_job_details_off_loopback() {
    let dir = tempfile::Builder::new()
        .prefix("rb-web-check-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let secret = dir.path().join("secret");
    proto::auth::write_new_secret(&secret, false).expect("secret");
    let lab = local_lab(1)
        .replace("@STATE@", &dir.path().join("state").display().to_string())
        .replace("@SECRET@", &secret.display().to_string());
    let write = |web: &str| {
        let path = dir.path().join("lab.toml");
        std::fs::write(&path, format!("{lab}\n[web]\n{web}")).expect("write");
        rb(&["check", path.to_str().expect("utf8")])
    };
    let out = write("listen = \"0.0.0.0:9770\"\njobs = \"public\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    assert!(
        err.contains("web.jobs") && err.contains("not a loopback address"),
        "{err}"
    );
    let out = write("listen = \"127.0.0.1:9770\"\njobs = \"public\"\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = write("listen = \"0.0.0.0:9770\"\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const CHROMIUM: &str = "/usr/bin/chromium";

/// Headless Chromium on `url` with its background work off and a proxy that goes nowhere
/// (loopback bypasses proxies), in a fresh profile; `what` is e.g. `--dump-dom`.
fn chromium(url: &str, what: &[&str]) -> std::process::Output {
    let profile = tempfile::Builder::new()
        .prefix("rb-chromium-")
        .tempdir_in("/var/tmp")
        .expect("profile dir");
    Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-sync",
            "--proxy-server=http://127.0.0.1:9",
            "--virtual-time-budget=8000",
            "--window-size=1100,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(what)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium")
}

#[test]
fn the_status_page_shows_hosts_holders_and_why_a_request_waits() {
    if !Path::new(CHROMIUM).exists() {
        assert!(
            !is_root(),
            "{CHROMIUM} is missing: install Debian's `chromium` (test.sh's LAB_PACKAGES)"
        );
        eprintln!("skipped: {CHROMIUM} is not installed (test.sh installs it as root)");
        return;
    }
    let broker = Broker::start(&web_lab(2));
    broker.wait_all_up(Duration::from_secs(60));
    let _jobs = [Job::start(&broker), Job::start(&broker)];
    wait_held(&broker, 2);
    let _third = Job::start(&broker);
    let waiting = wait_until(Duration::from_secs(60), || {
        broker.jobs().iter().find_map(|j| {
            let w = j["waiting"].as_array()?.first()?.clone();
            Some((j["id"].as_u64()?, w["reason_code"].as_str()?.to_string()))
        })
    });
    let (waiting_job, code) = waiting.expect("a third job waits");
    let url = format!("http://{}/", web_addr(&broker));

    let out = chromium(&url, &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-refreshed=\""),
        "the page never refreshed from /api/status:\n{dom}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        dom.matches("class=\"host ").count(),
        2,
        "one cell per host:\n{dom}"
    );
    for h in broker.status().expect("status") {
        let job = h.held_by.expect("both hosts held");
        let cell = format!(
            "data-host=\"{}\"><b>{}</b><span>job {job}</span>",
            h.name, h.name
        );
        assert!(dom.contains(&cell), "{cell} missing:\n{dom}");
    }
    let row = format!("<tr data-job=\"{waiting_job}\">");
    assert!(dom.contains(&row), "{row} missing:\n{dom}");
    assert!(
        dom.contains(&format!("<td class=\"code\">{code}</td>")),
        "reason {code} missing:\n{dom}"
    );
    assert!(
        !dom.contains("sleep"),
        "the public page shows a command line:\n{dom}"
    );
    // The utilization chart, refreshed from /api/usage.svg: per-host rows, in total areas.
    assert!(
        dom.contains("<div id=\"usage\" data-refreshed=\""),
        "the chart never refreshed from /api/usage.svg:\n{dom}"
    );
    let chart = &dom[dom.find("<div id=\"usage\"").expect("usage")..];
    assert!(
        chart.contains("class=\"utilization\""),
        "no chart:\n{chart}"
    );
    for h in broker.status().expect("status") {
        let row = format!("<g class=\"host-row\" data-host=\"{}\"", h.name);
        assert!(chart.contains(&row), "{row} missing:\n{chart}");
    }
    assert_eq!(chart.matches("class=\"host-row\"").count(), 2, "{chart}");
    assert!(chart.contains("data-state=\"lent\""), "{chart}");
    let (status, svg) = get(web_addr(&broker), "/api/usage.svg", &[]);
    assert_eq!(status, 200, "{svg}");
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(&url, &[&format!("--screenshot={}", shot.display())]);
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("screenshot: {}", shot.display());
}
