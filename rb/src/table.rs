//! The `rb status` table (one row per host with its allocation state, a
//! `condor_status`-style summary, a NOTE column saying why the policy would start no job on
//! a free host now, the reasons of down hosts underneath) and the `rb jobs`
//! table (one row per job, its waiting requests and last note underneath). Columns are
//! aligned to their widest cell.
//!
//! Every text in them comes from a peer (argv, notes, host and user names, reasons): a
//! control character in it (a newline, an escape sequence) is shown escaped
//! ([`printable`]), so that it can neither break a row into two (and shift the rows after
//! it) nor reach the terminal. `--json` prints the texts exactly.

use proto::report::{HostState, HostStatus, UserSession};

/// Renders the whole table as text.
pub fn render(hosts: &[HostStatus]) -> String {
    let header = [
        "HOST", "STATE", "ALLOC", "LOAD", "CPUS", "MEM", "USERS", "IDLE", "LABELS", "OWNER", "AGE",
        "NOTE",
    ];
    let rows: Vec<Vec<String>> = hosts.iter().map(row).collect();
    let mut out = aligned(&header, &rows);
    let up = hosts.iter().filter(|h| h.state == HostState::Up).count();
    out.push_str(&format!(
        "\n{} hosts: {} up, {} down\n",
        hosts.len(),
        up,
        hosts.len() - up
    ));
    for h in hosts.iter().filter(|h| h.state == HostState::Down) {
        out.push_str(&format!(
            "  {}: {}\n",
            printable(&h.name),
            printable(h.down_reason.as_deref().unwrap_or("down"))
        ));
    }
    for h in hosts {
        for warning in &h.warnings {
            out.push_str(&format!(
                "  {}: warning: {}\n",
                printable(&h.name),
                printable(warning)
            ));
        }
    }
    out
}

/// `text` with every control character escaped as Rust writes it (`\n`, `\u{1b}`), and a
/// backslash doubled so that an escape cannot be forged: one line, nothing a terminal
/// interprets.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\\' || c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Left-aligned columns two spaces apart, each as wide as its widest cell (in characters);
/// no trailing spaces.
pub fn aligned(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| printable(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for cells in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn row(h: &HostStatus) -> Vec<String> {
    vec![
        h.name.clone(),
        h.state.to_string(),
        alloc(h),
        h.load1.map_or("-".into(), |l| format!("{l:.2}")),
        h.cpus.map_or("-".into(), |c| c.to_string()),
        memory(h),
        users(h),
        h.console_idle_s.map_or("?".into(), duration),
        if h.labels.is_empty() {
            "-".into()
        } else {
            h.labels.join(",")
        },
        h.owner.clone().unwrap_or_else(|| "-".into()),
        h.last_report_age_s
            .map_or("-".into(), |a| format!("{a:.1}s")),
        note(h),
    ]
}

/// Why the policy starts no job on this free host now, and a Slurm pilot's lease (empty
/// otherwise).
fn note(h: &HostStatus) -> String {
    let lease = h.slurm_job.as_ref().map(|job| {
        let left = h
            .lease_left_s
            .map_or("?".into(), |s| duration(s.max(0.0) as u64));
        match h.lease_ending {
            true => format!("slurm job {job}, lease ending: {left} left"),
            false => format!("slurm job {job}, lease {left} left"),
        }
    });
    [h.policy_note.clone(), lease]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// `free`, `drained`, or the state with the holding job: `held(3)`, `reserved(3)`…
/// (`-` from a broker that does not say).
fn alloc(h: &HostStatus) -> String {
    match (h.alloc_state.as_str(), h.held_by) {
        ("", _) => "-".into(),
        (state, Some(job)) => format!("{state}({job})"),
        (state, None) => state.into(),
    }
}

fn memory(h: &HostStatus) -> String {
    match (h.mem_available_kb, h.mem_total_kb) {
        (Some(avail), Some(total)) => format!("{}/{}G", gib(avail), gib(total)),
        (None, Some(total)) => format!("?/{}G", gib(total)),
        _ => "-".into(),
    }
}

fn gib(kb: u64) -> String {
    format!("{:.1}", kb as f64 / (1024.0 * 1024.0))
}

fn users(h: &HostStatus) -> String {
    if !h.users_known {
        return if h.state == HostState::Up {
            "?".into()
        } else {
            "-".into()
        };
    }
    if h.users.is_empty() {
        return "0".into();
    }
    h.users.iter().map(session).collect::<Vec<_>>().join(",")
}

fn session(s: &UserSession) -> String {
    match s.idle_s {
        Some(idle) => format!("{}({})", s.user, duration(idle)),
        None => format!("{}(?)", s.user),
    }
}

/// Compact duration: `42s`, `7m`, `3h`, `2d`.
pub fn duration(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Renders `rb jobs`: one line per job (JSON objects from the broker), and under it one
/// line per waiting request (position, age, why it waits) and the job's last note.
/// `utc_offset_s` is the local time zone's offset, for the start and end times.
pub fn render_jobs(jobs: &[serde_json::Value], utc_offset_s: i64) -> String {
    let header = [
        "JOB", "USER", "STATE", "STARTED", "ENDED", "HOSTS", "QUEUED", "COMMAND",
    ];
    let mut rows = Vec::new();
    for j in jobs {
        let time = |key: &str| {
            j[key]
                .as_i64()
                .map_or("-".into(), |t| clock(t, utc_offset_s))
        };
        rows.push(vec![
            j["id"].to_string(),
            j["user"].as_str().unwrap_or("?").to_string(),
            j["state"].as_str().unwrap_or("?").to_string(),
            time("started_at"),
            time("ended_at"),
            list(&j["hosts"], ","),
            list(&j["queued"], ","),
            list(&j["argv"], " "),
        ]);
        for w in j["waiting"].as_array().into_iter().flatten() {
            let slurm = w["slurm"]
                .as_str()
                .map_or(String::new(), |s| format!("; {s}"));
            rows.push(sub_row(format!(
                "waits: {} #{} for {}: {}{slurm}",
                w["symbolic"].as_str().unwrap_or("?"),
                w["position"],
                w["age_s"]
                    .as_f64()
                    .map_or("?".into(), |a| duration(a as u64)),
                w["reason"].as_str().unwrap_or("?")
            )));
        }
        if let Some(note) = j["notes"].as_array().and_then(|n| n.last()?.as_str()) {
            let first_line = note.lines().next().unwrap_or_default();
            rows.push(sub_row(format!("note: {first_line}")));
        }
    }
    // Sub-rows span the columns after JOB: align the rest on job rows only.
    let job_rows: Vec<Vec<String>> = rows.iter().filter(|r| r.len() > 2).cloned().collect();
    let table = aligned(&header, &job_rows);
    let mut lines = table.lines();
    let mut out = String::new();
    out.push_str(lines.next().unwrap_or_default());
    out.push('\n');
    let width = header[0]
        .len()
        .max(rows.iter().map(|r| r[0].len()).max().unwrap_or(0));
    for r in &rows {
        if r.len() > 2 {
            out.push_str(lines.next().unwrap_or_default());
        } else {
            out.push_str(format!("{:<width$}  {}", "", printable(&r[1])).trim_end());
        }
        out.push('\n');
    }
    out
}

/// A line under a job: an empty JOB cell and free text.
fn sub_row(text: String) -> Vec<String> {
    vec![String::new(), text]
}

/// The strings of a JSON array joined by `sep`, or `-` when there are none.
fn list(v: &serde_json::Value, sep: &str) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(sep)
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "-".into())
}

/// Unix seconds as local `MM-DD HH:MM:SS`, given the zone's offset from UTC.
pub fn clock(unix_s: i64, utc_offset_s: i64) -> String {
    let t = unix_s + utc_offset_s;
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let (_, month, day) = localtime::civil_from_days(days);
    format!(
        "{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn host(name: &str, state: HostState) -> HostStatus {
        HostStatus {
            name: name.into(),
            address: "10.77.0.2".into(),
            state,
            down_reason: (state == HostState::Down).then(|| "no report for 6.2 s".into()),
            hostname: Some(name.into()),
            cpus: Some(2),
            load1: Some(0.25),
            load5: None,
            load15: None,
            cpu_util: None,
            mem_total_kb: Some(2 * 1024 * 1024),
            mem_available_kb: Some(1024 * 1024),
            os: Some("linux".into()),
            arch: Some("x86_64".into()),
            users: vec![UserSession {
                user: "alice".into(),
                tty: "pts/1".into(),
                idle_s: Some(300),
                from: None,
            }],
            users_known: true,
            console_idle_s: None,
            logind: None,
            logind_error: None,
            warnings: Vec::new(),
            managed_procs: Some(0),
            job_load: None,
            labels: vec!["linux".into(), "public".into()],
            owner: Some("alice".into()),
            last_report_age_s: Some(0.4),
            daemon_starts: 1,
            alloc_state: "free".into(),
            held_by: None,
            drained: false,
            policy_note: None,
            slurm_job: None,
            lease_left_s: None,
            lease_ending: false,
        }
    }

    /// A Slurm pilot's node shows its Slurm job and the lease left in NOTE.
    #[test]
    fn a_pilots_node_shows_its_slurm_job_and_lease() {
        let mut pilot = host("slurm-node04", HostState::Up);
        pilot.slurm_job = Some("4242".into());
        pilot.lease_left_s = Some(292.0);
        let mut ending = pilot.clone();
        (ending.name, ending.lease_ending, ending.lease_left_s) =
            ("slurm-node05".into(), true, Some(25.0));
        ending.alloc_state = "leaving".into();
        let text = render(&[pilot, ending]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].ends_with("slurm job 4242, lease 4m left"),
            "{text}"
        );
        assert!(
            lines[2].contains("leaving")
                && lines[2].ends_with("slurm job 4242, lease ending: 25s left"),
            "{text}"
        );
    }

    #[test]
    fn table_has_rows_summary_and_reasons() {
        let text = render(&[
            host("node02", HostState::Up),
            host("node03", HostState::Down),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("HOST"), "{text}");
        assert!(lines[1].starts_with("node02  up     free"), "{text}");
        assert!(lines[1].contains("alice(5m)"), "{text}");
        assert!(lines[1].contains("1.0/2.0G"), "{text}");
        assert!(text.contains("2 hosts: 1 up, 1 down"), "{text}");
        assert!(text.contains("node03: no report for 6.2 s"), "{text}");
    }

    #[test]
    fn a_hosts_warnings_are_lines_under_the_table_escaped() {
        let mut warned = host("node02", HostState::Up);
        warned.warnings = vec!["runtime directory /tmp/rb-1000 refused\u{1b}[31m".into()];
        let text = render(&[warned, host("node03", HostState::Up)]);
        assert!(
            text.contains("  node02: warning: runtime directory /tmp/rb-1000 refused\\u{1b}[31m\n"),
            "{text}"
        );
        assert_eq!(text.matches("warning:").count(), 1, "{text}");
    }

    #[test]
    fn durations_are_compact() {
        assert_eq!(duration(5), "5s");
        assert_eq!(duration(600), "10m");
        assert_eq!(duration(3 * 3600), "3h");
        assert_eq!(duration(5 * 86400), "5d");
    }

    #[test]
    fn alloc_column_names_the_holder_and_the_drain() {
        let mut held = host("node02", HostState::Up);
        (held.alloc_state, held.held_by) = ("reserved".into(), Some(4));
        let mut drained = host("node03", HostState::Up);
        (drained.alloc_state, drained.drained) = ("drained".into(), true);
        let text = render(&[held, drained]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("HOST    STATE  ALLOC "), "{text}");
        assert!(
            lines[1].starts_with("node02  up     reserved(4)  "),
            "{text}"
        );
        assert!(
            lines[2].starts_with("node03  up     drained      "),
            "{text}"
        );
    }

    /// A newline in one job's argv broke its row into two, and every later job fell off
    /// the table; an escape sequence in a note reached the terminal raw.
    #[test]
    fn peer_texts_are_escaped_and_never_hide_later_rows() {
        let jobs = serde_json::json!([
            {"id": 1, "user": "eve", "state": "running", "started_at": 0, "ended_at": null,
             "hosts": ["vhost01\nvhost09"], "queued": [], "argv": ["sh", "-c", "a\nb\r"],
             "notes": ["\u{1b}[31mred\u{1b}[0m \\u001b"], "waiting": []},
            {"id": 2, "user": "ann", "state": "running", "started_at": 0, "ended_at": null,
             "hosts": [], "queued": [], "argv": ["sim"], "notes": [], "waiting": []},
        ]);
        let text = render_jobs(jobs.as_array().expect("array"), 0);
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "header, two jobs, one note: {text}");
        assert!(lines[1].contains("sh -c a\\nb\\r"), "{text}");
        assert!(lines[1].contains("vhost01\\nvhost09"), "{text}");
        assert!(
            lines[2].contains("note: \\u{1b}[31mred\\u{1b}[0m \\\\u001b"),
            "{text}"
        );
        assert!(lines[3].starts_with("2 "), "job 2 is shown: {text}");

        let mut down = host("evil\u{1b}]0;title\u{7}", HostState::Down);
        down.down_reason = Some("no report\nnode02: up".into());
        down.policy_note = Some("x\ny".into());
        let text = render(&[down, host("node02", HostState::Up)]);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains("no report\\nnode02: up"), "{text}");
        assert_eq!(
            text.lines().count(),
            6,
            "header, 2 hosts, blank, summary, 1 reason: {text}"
        );
    }

    #[test]
    fn printable_escapes_controls_and_backslashes_only() {
        assert_eq!(printable("héllo wörld"), "héllo wörld");
        assert_eq!(printable("a\tb\u{9b}c\\"), "a\\tb\\u{9b}c\\\\");
    }

    #[test]
    fn jobs_show_times_waiting_requests_and_aligned_columns() {
        let jobs = serde_json::json!([
            {"id": 3, "user": "alice", "state": "running", "started_at": 1_764_000_000,
             "ended_at": null, "hosts": ["node02"], "queued": ["anyLinux"],
             "argv": ["app", "-x"], "notes": [],
             "waiting": [{"req": 9, "symbolic": "anyLinux", "position": 1, "age_s": 75.2,
                          "reason": "1 matching host(s): 1 held by jobs",
                          "reason_code": "all_held"}]},
            {"id": 12, "user": "bob", "state": "ended", "started_at": 1_764_000_000,
             "ended_at": 1_764_003_661, "hosts": [], "queued": [], "argv": ["sim"],
             "notes": ["grow failed"], "waiting": []},
            {"id": 13, "user": "root", "state": "running", "started_at": 1_764_000_000,
             "ended_at": null, "hosts": [], "queued": ["anyLinux"], "argv": ["sh"],
             "notes": [],
             "waiting": [{"req": 10, "symbolic": "anyLinux", "position": 2, "age_s": 3.0,
                          "reason": "1 matching host(s): 1 held by jobs",
                          "reason_code": "all_held",
                          "slurm": "waits for Slurm: 1 pilot(s) queued"}]}
        ]);
        let text = render_jobs(jobs.as_array().expect("array"), 3600);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "JOB  USER   STATE    STARTED         ENDED           HOSTS   QUEUED    COMMAND",
                "3    alice  running  11-24 17:00:00  -               node02  anyLinux  app -x",
                "     waits: anyLinux #1 for 75s: 1 matching host(s): 1 held by jobs",
                "12   bob    ended    11-24 17:00:00  11-24 18:01:01  -       -         sim",
                "     note: grow failed",
                "13   root   running  11-24 17:00:00  -               -       anyLinux  sh",
                "     waits: anyLinux #2 for 3s: 1 matching host(s): 1 held by jobs; waits for Slurm: 1 pilot(s) queued",
            ],
            "{text}"
        );
    }

    #[test]
    fn clock_is_local_month_day_and_time() {
        assert_eq!(clock(0, 0), "01-01 00:00:00");
        assert_eq!(clock(951_782_400, 0), "02-29 00:00:00", "leap day 2000");
        assert_eq!(clock(1_764_000_000, -3600), "11-24 15:00:00");
    }
}
