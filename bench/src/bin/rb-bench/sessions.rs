//! The policy section's `sessions` part: what one host report costs the whole broker —
//! reading it, its session, the turns, the core — in instructions counted by callgrind,
//! beside what reading and parsing it alone costs (`rb-readfloor --parse`). The broker's
//! CPU at 10k hosts moves by ±30 % between runs on this machine; these counts repeat to
//! 1–3 %, so a change of the sessions of several percent shows here and nowhere else.
//!
//! Each row: the program under `valgrind --tool=callgrind`, `rb-loadgen` of [`HOSTS`]
//! simulated hosts against it for [`SHORT_S`] and, in another run, [`LONG_S`] seconds;
//! the instructions of the longer run less the shorter's, over the reports sent in the
//! difference (the start, the handshakes and the stop fall out). The decision trace is off
//! (`trace_files_kept = 0`): its files' rotations fall at other reports from run to run.

use std::{
    path::{Path, PathBuf},
    process::Child,
    time::Duration,
};

use tests::Broker;

/// Simulated hosts: few enough for valgrind to keep up with their reports.
const HOSTS: usize = 300;
/// The two runs' lengths, seconds.
const SHORT_S: u64 = 10;
const LONG_S: u64 = 30;

/// What one program is made to do in a row.
#[derive(Clone, Copy)]
enum Reader {
    Broker,
    /// `rb-readfloor --parse`: the frames read and parsed, nothing else.
    Floor,
}

pub fn run(compared: Option<&(String, PathBuf)>) -> anyhow::Result<()> {
    println!("### The host daemons' sessions counted (`callgrind`)\n");
    println!(
        "Instructions per report of the whole process (all its threads), counted by \
         `valgrind --tool=callgrind`: the program under `rb-loadgen --hosts {HOSTS}` for \
         {LONG_S} s less the same for {SHORT_S} s, over the reports sent in the difference; \
         the paper policy, the decision trace off. The broker's rows include reading and \
         parsing (the floor's rows), the sessions, the turns (100 a second, here over only \
         {HOSTS} hosts' reports) and the core. Repeats to 1–3 % between runs; a \
         comparison of builds, not a speed: what valgrind runs is not what the processor \
         waits for (the core's misses, see \"The order reports arrive in\").\n"
    );
    if !crate::core_cost::has_valgrind() {
        println!("valgrind is not installed here: no counts.\n");
        return Ok(());
    }
    println!("| program | reports | instructions a report |");
    println!("|---|---|---:|");
    let mut programs = Vec::new();
    if let Some((label, path)) = compared {
        programs.push((format!("rb-broker ({label})"), Reader::Broker, path.clone()));
    }
    programs.push(("rb-broker".into(), Reader::Broker, tests::bin("rb-broker")));
    programs.push((
        "reading alone (`rb-readfloor --parse`)".into(),
        Reader::Floor,
        tests::bin("rb-readfloor"),
    ));
    for (changing, reports) in [
        (false, "repeating (quiet)"),
        (true, "every report changing"),
    ] {
        for (label, reader, program) in &programs {
            let counted = per_report(*reader, program, changing)
                .map_or_else(|e| format!("- ({e:#})"), |n| format!("{n:.0}"));
            println!("| {label} | {reports} | {counted} |");
        }
    }
    println!();
    Ok(())
}

/// Instructions per report: the long run's count less the short run's, over the reports
/// sent in the difference.
fn per_report(reader: Reader, program: &Path, changing: bool) -> anyhow::Result<f64> {
    let (short_count, short_reports) = counted_run(reader, program, changing, SHORT_S)?;
    let (long_count, long_reports) = counted_run(reader, program, changing, LONG_S)?;
    let reports = long_reports.saturating_sub(short_reports);
    anyhow::ensure!(reports > 0, "no more reports in the longer run");
    Ok(long_count.saturating_sub(short_count) as f64 / reports as f64)
}

/// One run: the program under callgrind and `rb-loadgen` for `seconds`; the instructions
/// callgrind counted and the reports the generator sent.
fn counted_run(
    reader: Reader,
    program: &Path,
    changing: bool,
    seconds: u64,
) -> anyhow::Result<(u64, u64)> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("callgrind.out");
    let wrapper = dir.path().join("under-callgrind");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file='{}' '{}' \"$@\" 2>/dev/null\n",
            out.display(),
            program.display()
        ),
    )?;
    make_executable(&wrapper)?;
    let reports = match reader {
        Reader::Broker => {
            let lab = crate::manual_lab(HOSTS).replacen(
                "[broker]\n",
                "[broker]\npolicy = \"paper\"\ntrace_files_kept = 0\n",
                1,
            );
            let mut broker = Broker::start_program(&wrapper, &lab);
            let gen = crate::spawn_loadgen(&broker, HOSTS, changing, seconds)?;
            let reports = reports_sent(gen);
            broker.stop();
            reports?
        }
        Reader::Floor => {
            let secret = dir.path().join("secret");
            proto::auth::write_new_secret(&secret, false)?;
            // Its output kept open until it ends: it says `all N connected` meanwhile.
            let (mut floor, addr, said) =
                crate::spawn_readfloor(&wrapper, HOSTS, crate::ReadFloor::AS_THE_BROKER, &secret)?;
            let sending = crate::Reports::as_today(changing);
            let gen = crate::spawn_loadgen_at(&addr, &secret, HOSTS, sending, seconds)?;
            let reports = reports_sent(gen);
            stop(&mut floor);
            drop(said);
            reports?
        }
    };
    Ok((instructions(&out)?, reports))
}

/// Waits for `rb-loadgen` to end and reads the reports it sent from its summary line.
fn reports_sent(gen: Child) -> anyhow::Result<u64> {
    let out = gen.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| anyhow::anyhow!("rb-loadgen's summary {text:?}: {e}"))?;
    summary["reports"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no report count in {text:?}"))
}

/// SIGTERM, then the process's end (callgrind writes its counts as it ends).
fn stop(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let ended = tests::wait_until(Duration::from_secs(20), || child.try_wait().ok().flatten());
    if ended.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The instructions of a callgrind output file (its `summary:` line).
fn instructions(out: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(out)
        .map_err(|e| anyhow::anyhow!("no callgrind output {}: {e}", out.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no summary in {}", out.display()))
}

fn make_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}
