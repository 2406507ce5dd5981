//! The `rb status` table: one row per host, a `condor_status`-style summary, and the
//! reasons of down hosts underneath.

use proto::report::{HostState, HostStatus, UserSession};

/// Renders the whole table as text.
pub fn render(hosts: &[HostStatus]) -> String {
    let header = [
        "HOST", "STATE", "LOAD", "CPUS", "MEM", "USERS", "IDLE", "LABELS", "OWNER", "AGE",
    ];
    let rows: Vec<[String; 10]> = hosts.iter().map(row).collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    push_line(&mut out, &header.map(String::from), &widths);
    for r in &rows {
        push_line(&mut out, r, &widths);
    }
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
            h.name,
            h.down_reason.as_deref().unwrap_or("down")
        ));
    }
    out
}

fn push_line(out: &mut String, cells: &[String; 10], widths: &[usize; 10]) {
    let line: Vec<String> = cells
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect();
    out.push_str(line.join("  ").trim_end());
    out.push('\n');
}

fn row(h: &HostStatus) -> [String; 10] {
    [
        h.name.clone(),
        h.state.to_string(),
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
    ]
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

/// Renders `rb jobs`: one line per job (JSON objects from the broker).
pub fn render_jobs(jobs: &[serde_json::Value]) -> String {
    let mut out = format!(
        "{:<6} {:<10} {:<8} {:<24} {:<16} {}\n",
        "JOB", "USER", "STATE", "HOSTS", "QUEUED", "COMMAND"
    );
    for j in jobs {
        let list = |key: &str| {
            j[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "-".into())
        };
        let argv = j["argv"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<6} {:<10} {:<8} {:<24} {:<16} {}\n",
            j["id"],
            j["user"].as_str().unwrap_or("?"),
            j["state"].as_str().unwrap_or("?"),
            list("hosts"),
            list("queued"),
            argv
        ));
        if let Some(note) = j["notes"].as_array().and_then(|n| n.last()?.as_str()) {
            let first_line = note.lines().next().unwrap_or_default();
            out.push_str(&format!("{:<6} note: {first_line}\n", ""));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, state: HostState) -> HostStatus {
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
            managed_procs: Some(0),
            labels: vec!["linux".into(), "public".into()],
            owner: Some("alice".into()),
            last_report_age_s: Some(0.4),
            daemon_starts: 1,
        }
    }

    #[test]
    fn table_has_rows_summary_and_reasons() {
        let text = render(&[
            host("node02", HostState::Up),
            host("node03", HostState::Down),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("HOST"), "{text}");
        assert!(lines[1].starts_with("node02  up"), "{text}");
        assert!(lines[1].contains("alice(5m)"), "{text}");
        assert!(lines[1].contains("1.0/2.0G"), "{text}");
        assert!(text.contains("2 hosts: 1 up, 1 down"), "{text}");
        assert!(text.contains("node03: no report for 6.2 s"), "{text}");
    }

    #[test]
    fn durations_are_compact() {
        assert_eq!(duration(5), "5s");
        assert_eq!(duration(600), "10m");
        assert_eq!(duration(3 * 3600), "3h");
        assert_eq!(duration(5 * 86400), "5d");
    }
}
