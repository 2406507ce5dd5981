//! The host table: up and down, replaced connections, pilots, changes and repeated reports.

use super::*;

fn table() -> HostTable {
    let entries = ["node02", "node03"]
        .iter()
        .map(|n| HostEntry {
            name: n.to_string(),
            address: n.to_string(),
            labels: vec!["public".into()],
            owner: None,
        })
        .collect::<Vec<_>>();
    HostTable::new(&entries, Duration::from_secs(6))
}

fn report(host: &str) -> HostReport {
    HostReport {
        hostname: host.into(),
        cpus: Some(2),
        load: Some([0.5, 0.4, 0.3]),
        labels: vec!["linux".into(), "x86_64".into()],
        ..HostReport::default()
    }
}

#[test]
fn host_is_down_until_it_reports() {
    let mut t = table();
    let now = Instant::now();
    assert_eq!(t.status(now)[0].state, HostState::Down);
    assert!(t.connected("node02", 1).is_empty());
    assert_eq!(t.status(now)[0].state, HostState::Down);
    assert!(t.report("node02", 1, report("node02"), now));
    let row = &t.status(now)[0];
    assert_eq!(row.state, HostState::Up);
    assert_eq!(row.labels, vec!["linux", "public", "x86_64"]);
    assert_eq!(row.load1, Some(0.5));
    assert!(!row.users_known);
}

#[test]
fn newer_connection_replaces_older_and_stale_reports_are_ignored() {
    let mut t = table();
    let now = Instant::now();
    t.connected("node02", 1);
    let effects = t.connected("node02", 2);
    assert!(matches!(&effects[..], [Effect::CloseConn { conn: 1, .. }]));
    assert!(!t.report("node02", 1, report("node02"), now));
    t.disconnected("node02", 1, "eof");
    assert!(t.report("node02", 2, report("node02"), now));
    assert_eq!(t.status(now)[0].state, HostState::Up);
}

#[test]
fn a_pilot_joins_as_a_public_slurm_host_and_is_never_restarted() {
    let mut t = table();
    let _ = t.take_changed_rows(Instant::now());
    let start = Instant::now();
    t.add_pilot("slurm-node09", "10.77.0.9");
    let rows = t.take_changed_rows(start);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].name, "slurm-node09");
    assert_eq!(rows[0].address, "10.77.0.9");
    assert_eq!(rows[0].labels, ["public", "slurm"]);
    assert_eq!(rows[0].owner, None);
    t.connected("slurm-node09", 7);
    t.report("slurm-node09", 7, report("slurm-node09"), start);
    let up = |t: &HostTable| {
        t.status(start)
            .iter()
            .any(|r| r.name == "slurm-node09" && r.state == HostState::Up)
    };
    assert!(up(&t));
    let effects = t.tick(start + Duration::from_secs(30));
    assert!(
        effects
            .iter()
            .all(|e| !matches!(e, Effect::RestartDaemon { host, .. } if host == "slurm-node09")),
        "{effects:?}"
    );
    // Back on another address: the row follows; a lab-file host is never replaced.
    t.add_pilot("slurm-node09", "10.77.0.19");
    assert!(t
        .status(start)
        .iter()
        .any(|r| r.name == "slurm-node09" && r.address == "10.77.0.19"));
    let before = t.status(start).into_iter().find(|r| r.name == "node02");
    t.add_pilot("node02", "10.9.9.9");
    assert_eq!(
        t.status(start).into_iter().find(|r| r.name == "node02"),
        before
    );
}

#[test]
fn silence_takes_host_down_and_restarts_daemon() {
    let mut t = table();
    let start = Instant::now();
    t.daemon_started("node02", start);
    t.connected("node02", 1);
    t.report("node02", 1, report("node02"), start);
    assert!(t.tick(start + Duration::from_secs(5)).is_empty());
    let effects = t.tick(start + Duration::from_secs(7));
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert!(matches!(&effects[1], Effect::RestartDaemon { host, .. } if host == "node02"));
    let row = &t.status(start + Duration::from_secs(7))[0];
    assert_eq!(row.state, HostState::Down);
    assert!(row
        .down_reason
        .as_deref()
        .is_some_and(|r| r.starts_with("no report for")));
    assert!(
        t.tick(start + Duration::from_secs(8)).is_empty(),
        "restart asked once"
    );
}

#[test]
fn disconnect_marks_down_at_once() {
    let mut t = table();
    let now = Instant::now();
    t.connected("node03", 4);
    t.report("node03", 4, report("node03"), now);
    t.disconnected("node03", 4, "connection reset");
    let row = &t.status(now)[1];
    assert_eq!(row.state, HostState::Down);
    assert_eq!(
        row.down_reason.as_deref(),
        Some("daemon disconnected: connection reset")
    );
}

/// Found by the fault suite's long run (daemon_kill, seed 1795629648255279181): a
/// daemon killed after 76 s of reports was restarted "because it never connected"
/// (its disconnect came before the transport's word that it exited).
#[test]
fn daemon_that_disconnected_is_not_said_to_have_never_connected() {
    let mut t = table();
    let start = Instant::now();
    t.daemon_started("node02", start);
    t.connected("node02", 1);
    let later = start + Duration::from_secs(76);
    t.report("node02", 1, report("node02"), later);
    t.disconnected("node02", 1, "connection closed");
    let effects = t.tick(later);
    let [Effect::RestartDaemon { host, reason }] = &effects[..] else {
        panic!("one restart expected: {effects:?}");
    };
    assert_eq!(host, "node02");
    assert!(!reason.contains("never connected"), "{reason}");
    assert!(reason.contains("disconnected"), "{reason}");
}

#[test]
fn daemon_that_never_connects_is_restarted() {
    let mut t = table();
    let start = Instant::now();
    t.daemon_started("node03", start);
    assert!(t.tick(start + Duration::from_secs(9)).is_empty());
    let effects = t.tick(start + FIRST_REPORT_GRACE + Duration::from_secs(1));
    assert!(matches!(&effects[..], [Effect::RestartDaemon { host, .. }] if host == "node03"));
}

#[test]
fn changes_are_every_host_at_start_then_only_those_that_changed() {
    let mut t = table();
    let now = Instant::now();
    let names = |rows: Vec<HostStatus>| rows.into_iter().map(|r| r.name).collect::<Vec<_>>();
    assert_eq!(names(t.take_changed_rows(now)), ["node02", "node03"]);
    assert!(t.take_changed_rows(now).is_empty());
    t.connected("node03", 1);
    t.report("node03", 1, report("node03"), now);
    t.daemon_started("node02", now);
    let rows = t.take_changed_rows(now);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].name.as_str(), rows[0].state),
        ("node03", HostState::Up)
    );
    let later = now + Duration::from_secs(7);
    t.tick(later);
    let rows = t.take_changed_rows(later);
    assert_eq!(
        (rows[0].name.as_str(), rows[0].state),
        ("node03", HostState::Down)
    );
}

#[test]
fn a_repeated_report_is_listed_apart_and_a_changed_field_is_a_change() {
    let mut t = table();
    let now = Instant::now();
    t.connected("node02", 1);
    t.report("node02", 1, report("node02"), now);
    let _ = t.take_changed_rows(now);
    // Only the counter and the trigger differ: the row changes only in age.
    let again = HostReport {
        seq: 2,
        trigger: Some(proto::report::ReportTrigger::Interval),
        ..report("node02")
    };
    let later = now + Duration::from_secs(1);
    assert!(t.report("node02", 1, again.clone(), later));
    assert!(t.take_changed_rows(later).is_empty());
    assert_eq!(t.take_repeated(), ["node02"]);
    assert!(t.take_repeated().is_empty());
    let row = t.row("node02", later).expect("a row");
    assert_eq!(row.state, HostState::Up);
    assert_eq!(
        row.last_report_age_s,
        Some(0.0),
        "the age is the repeated report's"
    );
    // Any other field that differs is a change, with its new value in the row.
    let changes: [fn(&mut HostReport); 5] = [
        |r| r.load = Some([0.9, 0.4, 0.3]),
        |r| r.users = Some(vec![]),
        |r| r.console_idle_s = Some(7),
        |r| r.job_load = Some(1.0),
        |r| r.labels.push("gpu".into()),
    ];
    let mut last = again;
    for (i, change) in changes.into_iter().enumerate() {
        let mut next = last.clone();
        change(&mut next);
        let at = later + Duration::from_secs(i as u64 + 1);
        t.report("node02", 1, next.clone(), at);
        assert!(t.take_repeated().is_empty(), "change {i}");
        let rows = t.take_changed_rows(at);
        assert_eq!(rows.len(), 1, "change {i}");
        assert_eq!(Some(&rows[0]), t.status(at).first(), "change {i}");
        last = next;
    }
    assert_eq!(t.status(later)[0].load1, Some(0.9));
    assert_eq!(t.status(later)[0].console_idle_s, Some(7));
}

/// A report its connection found the same text as the last one but for the counter
/// (`report_same`) is what the same report parsed again would be: repeated, its age the new
/// one's, its counter kept; refused on a stale connection or before any report.
#[test]
fn the_same_report_again_is_taken_as_the_report_parsed_again() {
    let (mut parsed, mut same) = (table(), table());
    let now = Instant::now();
    for t in [&mut parsed, &mut same] {
        t.connected("node02", 1);
        assert!(!t.report_same("node02", 1, 1, now), "no report yet");
        t.report("node02", 1, report("node02"), now);
        let _ = t.take_changed_rows(now);
    }
    let later = now + Duration::from_secs(1);
    let again = HostReport {
        seq: 7,
        ..report("node02")
    };
    assert!(parsed.report("node02", 1, again, later));
    assert!(same.report_same("node02", 1, 7, later));
    for t in [&mut parsed, &mut same] {
        assert!(t.take_changed_rows(later).is_empty());
        assert_eq!(t.take_repeated(), ["node02"]);
    }
    let status = |t: &HostTable| serde_json::to_string(&t.status(later)).expect("encodes");
    assert_eq!(status(&same), status(&parsed));
    assert_eq!(
        same.hosts["node02"]
            .last_report
            .as_ref()
            .map(|(at, r)| (*at, r.seq)),
        Some((later, 7))
    );
    assert!(
        !same.report_same("node02", 2, 8, later),
        "a stale connection"
    );
    assert!(!same.report_same("nodeXX", 1, 8, later), "an unknown host");
    assert!(same.take_repeated().is_empty());
}

#[test]
fn a_report_repeating_one_from_before_a_disconnect_is_a_change() {
    let mut t = table();
    let now = Instant::now();
    t.connected("node02", 1);
    t.report("node02", 1, report("node02"), now);
    t.disconnected("node02", 1, "eof");
    t.connected("node02", 2);
    let _ = t.take_changed_rows(now);
    t.report("node02", 2, report("node02"), now);
    assert!(t.take_repeated().is_empty());
    assert_eq!(t.take_changed_rows(now)[0].state, HostState::Up);
    // A NaN is never equal to itself: such a report always reaches the allocator.
    let nan = HostReport {
        cpu_util: Some(f64::NAN),
        ..report("node02")
    };
    t.report("node02", 2, nan.clone(), now);
    let _ = t.take_changed_rows(now);
    t.report("node02", 2, nan, now);
    assert!(t.take_repeated().is_empty());
    assert_eq!(t.take_changed_rows(now).len(), 1);
}

#[test]
fn unknown_host_is_ignored() {
    let mut t = table();
    assert!(t.connected("nodeXX", 1).is_empty());
    assert!(!t.report("nodeXX", 1, report("x"), Instant::now()));
    assert!(!t.contains("nodeXX"));
}

/// The rows `rb status` joins from parts are the rows of `status`, field for field: before
/// any change was taken, after, with a change not yet taken (its fixed part is built
/// afresh, not the kept one), after a repeated report (the kept one), and for a host gone
/// silent (live fields only).
/// The rows `rb status` gets: the table's status parts joined as the broker writes them.
fn joined(t: &HostTable, now: Instant) -> Vec<HostStatus> {
    let mut rows = Vec::new();
    crate::requests::join_rows_into(&mut rows, &t.status_parts(now, |_, _| {})).expect("rows");
    serde_json::from_slice(&rows).expect("rows as JSON")
}

#[test]
fn status_parts_join_to_the_status_rows_whatever_was_taken() {
    let mut t = table();
    let start = Instant::now();
    assert_eq!(joined(&t, start), t.status(start), "nothing taken yet");
    let _ = t.take_changed_rows(start);
    t.connected("node02", 1);
    t.report("node02", 1, report("node02"), start);
    assert_eq!(joined(&t, start), t.status(start), "a change not taken yet");
    let _ = t.take_changed_rows(start);
    let later = start + Duration::from_millis(1500);
    let mut busier = report("node02");
    busier.load = Some([1.5, 0.4, 0.3]);
    t.report("node02", 1, busier, later);
    assert_eq!(
        joined(&t, later),
        t.status(later),
        "changed again, not taken"
    );
    let _ = t.take_changed_rows(later);
    let mut same = report("node02");
    same.load = Some([1.5, 0.4, 0.3]);
    same.seq = 9;
    t.report("node02", 1, same, later + Duration::from_secs(1));
    assert!(
        t.take_changed_rows(later).is_empty(),
        "a repeated report changes no row"
    );
    let silent = later + Duration::from_secs(20);
    assert_eq!(joined(&t, silent), t.status(silent), "aged and silent");
    assert_eq!(t.status(silent)[0].state, HostState::Down);
}

/// A changing report rewrites the members that move at the end of the row's kept text, in
/// the text's own buffer, while no `rb status` answer holds it; an answer under way keeps
/// the text it took, and the row gets a buffer of its own. Either way `rb status` reads the
/// rows as they are.
#[test]
fn a_rows_text_is_rewritten_in_place_unless_an_answer_holds_it() {
    let text = |t: &HostTable| {
        let rec = t.hosts.get("node02").expect("a record");
        Arc::clone(rec.fixed_json.as_ref().expect("a text"))
    };
    let load = |l: f64| HostReport {
        load: Some([l, 0.4, 0.3]),
        ..report("node02")
    };
    // As today's daemons send them: what changed since the last report.
    let changed = |t: &mut HostTable, from: f64, to: f64, now: Instant| {
        let text = proto::report_changes::encode(&load(from), &load(to)).expect("encodes");
        let mut patch = proto::report_changes::parse(&text).expect("parses");
        assert!(t.report_changes("node02", 1, &mut patch, now));
        t.take_changes(now, |_, _| {});
    };
    let mut t = table();
    let mut now = Instant::now();
    t.connected("node02", 1);
    t.report("node02", 1, load(0.5), now);
    t.take_changes(now, |_, _| {});
    now += Duration::from_secs(1);
    changed(&mut t, 0.5, 1.5, now);
    // A text made anew is allocated while the last one still lives: the same address is
    // the same buffer.
    let buffer = Arc::as_ptr(&text(&t));
    now += Duration::from_secs(1);
    changed(&mut t, 1.5, 2.5, now);
    assert_eq!(Arc::as_ptr(&text(&t)), buffer, "the same buffer");
    assert_eq!(joined(&t, now), t.status(now));
    let answer = t.status_parts(now, |_, _| {});
    let answered = answer[0].fixed_json.to_vec();
    now += Duration::from_secs(1);
    changed(&mut t, 2.5, 3.5, now);
    assert_eq!(
        *answer[0].fixed_json, answered,
        "the answer's text as it took it"
    );
    assert_ne!(Arc::as_ptr(&text(&t)), buffer, "a buffer of the row's own");
    assert_eq!(joined(&t, now), t.status(now));
    assert_eq!(t.status(now)[0].load1, Some(3.5));
}

/// What the core is handed for a changed host (the fixed part borrowed from the record, its
/// labels kept from report to report) is what the host's status row gives, in every state:
/// no report yet, reports whose labels differ in case from the lab file's, change, and go
/// away, users unknown, logind and warnings, a host gone silent.
#[test]
fn a_changed_hosts_parts_are_its_rows_whatever_its_reports_said() {
    let mut t = table();
    let start = Instant::now();
    let same_as_row = |t: &HostTable, at: Instant, when: &str| {
        for (name, rec) in &t.hosts {
            let row = status_row(rec, at, t.down_after);
            assert_eq!(
                fixed_json(&rec.fixed_part()),
                fixed_json(&row.fixed_part()),
                "{name}, {when}"
            );
        }
    };
    same_as_row(&t, start, "no report");
    assert!(t.connected("node02", 1).is_empty());
    let mixed = HostReport {
        labels: vec!["Public".into(), "GPU".into(), "linux".into()],
        users: None,
        logind: Some(Vec::new()),
        logind_error: Some("no system bus".into()),
        warnings: vec!["runtime dir moved".into()],
        ..report("node02")
    };
    t.report("node02", 1, mixed.clone(), start);
    same_as_row(&t, start, "labels in another case");
    assert_eq!(*t.hosts["node02"].labels, ["gpu", "linux", "public"]);
    let fewer = HostReport {
        labels: vec!["linux".into()],
        ..mixed
    };
    t.report("node02", 1, fewer, start);
    same_as_row(&t, start, "labels changed");
    assert_eq!(*t.hosts["node02"].labels, ["linux", "public"]);
    let rows = t.take_changed_rows(start);
    assert_eq!(rows[0].labels, ["linux", "public"], "{rows:?}");
    let _replaced = t.connected("node02", 2);
    same_as_row(&t, start, "connected again, no report");
    assert_eq!(*t.hosts["node02"].labels, ["public"]);
    t.report("node02", 2, report("node02"), start);
    let silent = start + Duration::from_secs(60);
    let _ = t.tick(silent);
    same_as_row(&t, silent, "gone silent");
    assert_eq!(*t.hosts["node02"].labels, ["public"]);
}

/// Hosts with the same labels share one list; a list no host holds any more goes at the
/// next sweep, so that daemons sending ever new labels do not grow the lists for ever.
#[test]
fn hosts_with_the_same_labels_share_one_list_and_unheld_lists_are_swept() {
    let mut t = table();
    let now = Instant::now();
    for (conn, host) in [(1, "node02"), (2, "node03")] {
        let _ = t.connected(host, conn);
        t.report(host, conn, report(host), now);
    }
    assert!(Arc::ptr_eq(
        &t.hosts["node02"].labels,
        &t.hosts["node03"].labels
    ));
    for i in 0..1000 {
        let odd = HostReport {
            labels: vec![format!("label{i}")],
            ..report("node02")
        };
        t.report("node02", 1, odd, now);
    }
    assert_eq!(*t.hosts["node02"].labels, ["label999", "public"]);
    assert!(
        t.label_lists.0.len() < 200,
        "{} lists kept",
        t.label_lists.0.len()
    );
}

/// A daemon's first report ends its start's grace: from then on the host goes down
/// `down_after` after its last report, which may be before the grace would have ended.
#[test]
fn a_first_report_after_a_daemon_start_ends_the_start_grace() {
    let mut t = table(); // down_after 6 s, the grace 10 s
    let start = Instant::now();
    t.daemon_started("node02", start);
    t.connected("node02", 1);
    t.report(
        "node02",
        1,
        report("node02"),
        start + Duration::from_secs(1),
    );
    assert!(t.tick(start + Duration::from_secs(6)).is_empty());
    let effects = t.tick(start + Duration::from_secs(8));
    assert!(
        matches!(&effects[..], [Effect::CloseConn { conn: 1, .. }, Effect::RestartDaemon { host, .. }] if host == "node02"),
        "{effects:?}"
    );
}

/// A daemon that disconnects long after its start goes down at the next tick (it has not
/// exited: its transport is asked to restart it), not `down_after` after its last report.
#[test]
fn a_daemon_that_disconnects_long_after_its_start_goes_down_at_once() {
    let mut t = table(); // down_after 6 s, the grace 10 s
    let start = Instant::now();
    let at = |s| start + Duration::from_secs(s);
    t.daemon_started("node02", start);
    t.connected("node02", 1);
    for s in [5, 10, 15, 20] {
        t.report("node02", 1, report("node02"), at(s));
        assert!(t.tick(at(s + 1)).is_empty());
    }
    t.disconnected("node02", 1, "connection reset");
    let effects = t.tick(at(22));
    let [Effect::RestartDaemon { host, reason }] = &effects[..] else {
        panic!("one restart expected: {effects:?}");
    };
    assert_eq!(host, "node02");
    assert!(reason.contains("has not exited"), "{reason}");
}

/// A tick looks only at the hosts whose silence check is due; the hosts it takes down are
/// exactly those a look at every host finds silent, whatever happened to them before
/// (connections, reports whole or repeated, disconnections, daemon starts and exits), in
/// name order.
#[test]
fn a_tick_takes_down_exactly_the_silent_hosts() {
    let names: Vec<String> = (0..8).map(|i| format!("node{i:02}")).collect();
    let entries: Vec<HostEntry> = names
        .iter()
        .map(|n| HostEntry {
            name: n.clone(),
            address: n.clone(),
            labels: Vec::new(),
            owner: None,
        })
        .collect();
    let mut t = HostTable::new(&entries, Duration::from_secs(9));
    let mut now = Instant::now();
    let mut seed: u64 = 34;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut conns = vec![0u64; names.len()];
    let mut downs = 0;
    for step in 0..4000u64 {
        now += Duration::from_millis(50 + next(400));
        let i = next(names.len() as u64) as usize;
        let host = names[i].as_str();
        match next(10) {
            0 => {
                conns[i] = step + 1;
                t.connected(host, conns[i]);
            }
            1 => t.disconnected(host, conns[i], "eof"),
            2 => t.daemon_started(host, now),
            3 => t.daemon_exited(host, "exit status 1"),
            4 => {
                t.report_same(host, conns[i], step, now);
            }
            5..=7 => {
                t.report(host, conns[i], report(host), now);
            }
            _ => {
                let silent: Vec<String> = t
                    .hosts
                    .iter()
                    .filter(|(_, rec)| silence(rec, now, t.down_after).is_some())
                    .map(|(name, _)| name.to_string())
                    .collect();
                let taken: Vec<String> = t
                    .tick(now)
                    .into_iter()
                    .filter_map(|e| match e {
                        Effect::RestartDaemon { host, .. } => Some(host),
                        Effect::CloseConn { .. } => None,
                    })
                    .collect();
                assert_eq!(taken, silent, "step {step}");
                downs += taken.len();
            }
        }
    }
    assert!(
        downs > 50,
        "only {downs} hosts went down: the schedule tests little"
    );
}

/// A row read back from its parts (the web page's rows, made off the core) is the row the
/// table builds whole: a host that never reported, one up with a report, one gone down.
#[test]
fn a_row_read_back_from_its_parts_is_the_whole_row() {
    let mut t = table();
    let start = Instant::now();
    t.connected("node02", 1);
    t.report(
        "node02",
        1,
        HostReport {
            logind_error: Some("no system bus".into()),
            warnings: vec!["runtime dir moved".into()],
            ..report("node02")
        },
        start,
    );
    t.daemon_started("node03", start);
    let later = start + Duration::from_secs(11);
    t.tick(later);
    let whole = t.status(later);
    let parts = t.status_parts(later, |_, _| {});
    let read: Vec<HostStatus> = parts.iter().map(|p| p.to_row().expect("a row")).collect();
    assert_eq!(read, whole);
}

/// A daemon that sends what changed (`report_changes`, applied to the host's last report
/// in the table) leaves the table as one sending each report whole: 2000 random reports
/// (each field of the simulated shape changing or not, labels and users among them, the
/// trigger alone, a NaN, a field named with the value it had, fields outside
/// `Fields::MOVING` whose text the table keeps apart), after each the same changed rows, the
/// same repeated hosts and the same status, also as joined from the text kept.
#[test]
fn what_changed_applied_in_the_table_is_the_whole_report() {
    use proto::{
        msg::ToBroker,
        report::{ReportTrigger, UserSession},
        report_changes,
    };
    let (mut whole, mut patched) = (table(), table());
    let mut now = Instant::now();
    let mut seed: u64 = 17;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut last = report("node02");
    for t in [&mut whole, &mut patched] {
        t.connected("node02", 1);
        t.report("node02", 1, last.clone(), now);
        let _ = t.take_changed_rows(now);
    }
    let users = |n: u64| {
        (0..n)
            .map(|i| UserSession {
                user: format!("u{i}"),
                tty: "pts/0".into(),
                idle_s: Some(i * 60),
                from: None,
            })
            .collect::<Vec<_>>()
    };
    let (mut changes, mut repeats) = (0, 0);
    for seq in 2..2002 {
        let mut new = HostReport {
            seq,
            ..last.clone()
        };
        match next(12) {
            0 => new.load = Some([next(100) as f64 / 10.0, 0.4, 0.3]),
            1 => new.console_idle_s = Some(next(3)),
            2 => new.users = [None, Some(users(next(3)))][next(2) as usize].clone(),
            3 => new.labels = vec!["linux".into(), ["x86_64", "GPU"][next(2) as usize].into()],
            4 => new.trigger = [None, Some(ReportTrigger::Interval)][next(2) as usize],
            5 => new.cpu_util = Some(f64::NAN),
            6 => new.mem_available_kb = Some(next(4) * 1000),
            7 => new.os = Some(["linux", "Linux"][next(2) as usize].into()),
            8 => new.warnings = vec!["w".into(); next(2) as usize],
            9 => new.hostname = ["node02", "node02.lab"][next(2) as usize].into(),
            _ => {} // the counter alone
        }
        now += Duration::from_millis(500);
        let mut text = report_changes::encode(&last, &new).expect("encodes");
        if next(20) == 0 {
            // A field named with the value it had.
            let cpus = format!(r#","cpus":{}}}"#, new.cpus.unwrap_or(0));
            text = text.replacen('}', &cpus, 1);
        }
        let mut patch = report_changes::parse(&text).expect("parses");
        // Each way over the wire (where a NaN is `null`).
        let frame =
            proto::frame::encode(&ToBroker::Report(Box::new(new.clone()))).expect("encodes");
        let Ok(ToBroker::Report(on_the_wire)) = proto::msg::decode_from_hostd(&frame) else {
            panic!("{frame}");
        };
        assert!(whole.report("node02", 1, *on_the_wire, now));
        assert!(patched.report_changes("node02", 1, &mut patch, now));
        let (w, p) = (whole.take_changed_rows(now), patched.take_changed_rows(now));
        assert_eq!(w, p, "report {seq}: {text}");
        let (w, p) = (whole.take_repeated(), patched.take_repeated());
        assert_eq!(w, p, "report {seq}: {text}");
        changes += usize::from(!w.is_empty());
        repeats += usize::from(w.is_empty());
        let status = |t: &HostTable| serde_json::to_string(&t.status(now)).expect("encodes");
        assert_eq!(status(&whole), status(&patched), "report {seq}: {text}");
        let joined: Vec<HostStatus> = (patched.status_parts(now, |_, _| {}).iter())
            .map(|p| p.to_row().expect("a row"))
            .collect();
        assert_eq!(joined, patched.status(now), "report {seq}: {text}");
        last = new;
    }
    assert!(changes > 500 && repeats > 500, "{changes} {repeats}");
    // Refused, changing nothing: a stale connection, an unknown host, a host with no
    // report on its connection yet.
    let patch = || report_changes::parse(r#"{"t":"report_changes","seq":9,"cpus":1}"#);
    assert!(!patched.report_changes("node02", 2, &mut patch().expect("parses"), now));
    assert!(!patched.report_changes("nodeXX", 1, &mut patch().expect("parses"), now));
    patched.connected("node03", 5);
    assert!(!patched.report_changes("node03", 5, &mut patch().expect("parses"), now));
    assert!(patched.take_repeated().is_empty());
}

/// A report handed over with its host's row is taken there; a row that holds another
/// connection's record (a host joined before it since, or a wrong hint) or none is not:
/// the host is found by its name then, and a report on a stale connection is refused
/// either way.
#[test]
fn a_report_at_its_hosts_row_is_taken_there_and_a_wrong_row_is_not() {
    let mut t = table();
    let start = Instant::now();
    let at_s = |s: u64| start + Duration::from_secs(s);
    t.connected("node02", 1);
    t.connected("node03", 2);
    let (row02, row03) = (t.row_of("node02"), t.row_of("node03"));
    assert_eq!((row02, row03), (Some(0), Some(1)));
    assert_eq!(t.row_of("nodeXX"), None);
    let at = |row| HostAt {
        name: "node02",
        row,
    };
    let age = |t: &HostTable, i: usize, s: u64| t.status(at_s(s))[i].last_report_age_s;
    assert!(t.report(at(row02), 1, report("node02"), at_s(0)));
    assert!(t.report_same(at(row02), 1, 2, at_s(1)));
    assert_eq!(age(&t, 0, 1), Some(0.0));
    // node03's row (no report yet) for node02's connection: node02's record, by name.
    assert!(t.report_same(at(row03), 1, 3, at_s(2)));
    assert_eq!(age(&t, 0, 2), Some(0.0));
    assert!(
        t.report_same(at(Some(7)), 1, 4, at_s(3)),
        "a row past the table"
    );
    assert_eq!(age(&t, 0, 3), Some(0.0));
    assert_eq!(age(&t, 1, 3), None, "node03 untouched");
    // A stale connection's report, at the right row or not, changes nothing.
    assert!(!t.report_same(at(row02), 9, 5, at_s(4)));
    assert!(!t.report_same(at(None), 9, 5, at_s(4)));
    assert_eq!(age(&t, 0, 4), Some(1.0));
    // A pilot joining before node02 moves it on: its old row is not taken.
    t.add_pilot("node01", "10.77.0.1");
    assert_eq!(t.row_of("node02"), Some(1));
    assert!(t.report_same(at(row02), 1, 6, at_s(5)), "found by name");
    assert_eq!(age(&t, 1, 5), Some(0.0));
}
