//! The policy section's `profile` part: where the broker's CPU goes at 10k simulated hosts,
//! `--broker-compared`'s broker beside today's, every report changing and repeating.
//!
//! Each broker runs under `rb-loadgen` (the paper policy) until every host is up; then
//! `perf record` samples it over [`WINDOW`] while its CPU is read from /proc over the same
//! time. Each sample is counted under the kind of work of the function it fell in (its own
//! time: a caller is not charged for what it calls), and the kinds' shares of the samples
//! times the broker's CPU read as percent of one core. The kinds are named by crate and
//! library ([`Kind::of`]), not by function, so that two builds years apart compare row by
//! row where their functions no longer do. Without `perf` (Debian: `linux-perf`) the part
//! says so and measures nothing.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use tests::Broker;

/// How long each broker is sampled.
const WINDOW: Duration = Duration::from_secs(10);

/// Samples a second (a prime, off the kernel's timer ticks).
const FREQUENCY: u32 = 997;

/// The kinds of work a sample is counted under, in the order of the table's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Kernel,
    Runtime,
    Serde,
    Allocation,
    Bytes,
    Maps,
    Policy,
    Allocator,
    Broker,
    Protocol,
    Rest,
}

impl Kind {
    const ALL: [Kind; 11] = [
        Kind::Kernel,
        Kind::Runtime,
        Kind::Serde,
        Kind::Allocation,
        Kind::Bytes,
        Kind::Maps,
        Kind::Policy,
        Kind::Allocator,
        Kind::Broker,
        Kind::Protocol,
        Kind::Rest,
    ];

    /// The row's name.
    fn label(self) -> &'static str {
        match self {
            Kind::Kernel => "the kernel (sockets, epoll, switching threads)",
            Kind::Runtime => "tokio and mio (tasks, wakes, readiness)",
            Kind::Serde => "serde and JSON (reports read, rows and trace lines written, numbers)",
            Kind::Allocation => "memory allocation (jemalloc, `__rust_alloc`)",
            Kind::Bytes => "bytes copied, compared and checked (`memcpy`, `memcmp`, slices, UTF-8)",
            Kind::Maps => "hash and B-tree maps (hashbrown, indexmap, std's B-trees)",
            Kind::Policy => "the policy's expressions (crates `policies`, `cel`)",
            Kind::Allocator => "the allocator (crate `allocation`)",
            Kind::Broker => "the broker's own code (crate `broker`)",
            Kind::Protocol => "frames and reports (crates `proto`, `proto_types`)",
            Kind::Rest => "the rest (std, core, functions without a name)",
        }
    }

    /// The kind of a sample in `sym` of `dso`, as `perf report` names them (`[k] …` for the
    /// kernel's functions, `[.] …` for a program's or a library's). The first rule that
    /// matches decides: serde's impls of our types are serde's work, a map of ours is a map.
    fn of(dso: &str, sym: &str) -> Kind {
        let (space, name) = match sym.split_once("] ") {
            Some((space, name)) => (space.trim_start_matches('['), name),
            None => ("", sym),
        };
        if space == "k" || dso.starts_with("[kernel") || dso == "[vdso]" {
            return Kind::Kernel;
        }
        let krate = crate_of(name);
        if name.contains("serde")
            || ["zmij::", "ryu::", "itoa::"]
                .iter()
                .any(|c| name.contains(c))
        {
            Kind::Serde
        } else if is_allocation(name) {
            Kind::Allocation
        } else if is_bytes(name) {
            Kind::Bytes
        } else if matches!(krate, "hashbrown" | "indexmap")
            || name.contains("collections::btree")
            || name.starts_with("allocation::host_map::")
        {
            Kind::Maps
        } else {
            match krate {
                "tokio" | "mio" => Kind::Runtime,
                "policies" | "cel" | "cel_interpreter" | "cel_parser" => Kind::Policy,
                "allocation" => Kind::Allocator,
                "broker" => Kind::Broker,
                "proto" | "proto_types" => Kind::Protocol,
                _ => Kind::Rest,
            }
        }
    }
}

/// The crate a demangled Rust symbol is in: the first path segment, past a leading `<`,
/// `&` or `mut ` (`<&mio::net::TcpStream as std::io::Read>::read` is mio's).
fn crate_of(sym: &str) -> &str {
    let mut rest = sym;
    loop {
        let trimmed = rest
            .trim_start_matches(['<', '&', '*'])
            .trim_start_matches("mut ")
            .trim_start_matches("dyn ")
            .trim_start_matches("const ");
        if trimmed == rest {
            break;
        }
        rest = trimmed;
    }
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Memory allocation: jemalloc's functions (`_rjem_…`, `je_…`, and its static ones the
/// profile names without a prefix: `tcache_…`, `ticker_…`, …), libc's malloc family and
/// Rust's allocation shims (`__rustc::__rust_alloc`).
fn is_allocation(name: &str) -> bool {
    const JEMALLOC: [&str; 10] = [
        "_rjem_",
        "je_",
        "tikv_jemalloc",
        "tcache_",
        "ticker_",
        "arena_",
        "extent_",
        "emap_",
        "edata_",
        "large_",
    ];
    JEMALLOC.iter().any(|p| name.starts_with(p))
        || ["__rust_alloc", "__rust_dealloc", "__rust_realloc"]
            .iter()
            .any(|f| name.contains(f))
        || matches!(
            name,
            "malloc" | "free" | "realloc" | "calloc" | "cfree" | "_int_malloc" | "_int_free"
        )
}

/// Bytes moved, compared and checked: libc's (`__memmove_avx512_unaligned_erms`,
/// `__memcmp_evex_movbe`, `bcmp`, …), slices compared element by element, UTF-8 checked.
fn is_bytes(name: &str) -> bool {
    let bare = name.trim_start_matches('_');
    [
        "memcpy", "memmove", "memcmp", "memset", "memchr", "bcmp", "strlen",
    ]
    .iter()
    .any(|f| bare.starts_with(f))
        || name.contains("SlicePartialEq")
        || name.starts_with("core::str::converts::from_utf8")
}

/// One broker sampled: its CPU over the window (percent of one core), and its samples in
/// all, by kind and by thread.
#[derive(Debug, Default)]
struct Profiled {
    cpu: f64,
    samples: u64,
    kinds: BTreeMap<Kind, u64>,
    threads: BTreeMap<String, u64>,
}

impl Profiled {
    /// The shares of the lines of `perf report --stdio --no-children -n --sort
    /// comm,dso,sym -g none -t '|'` (`4.79%  | 51  |rb-core  |libc.so.6  |[.] __memmove_…`:
    /// share, samples, thread, object, function); other lines are skipped.
    fn from_report(report: &str) -> Profiled {
        let mut profiled = Profiled::default();
        for line in report.lines().filter(|l| !l.starts_with('#')) {
            let fields: Vec<&str> = line.splitn(5, '|').map(str::trim).collect();
            let [_, samples, comm, dso, sym] = fields.as_slice() else {
                continue;
            };
            let Ok(n) = samples.parse::<u64>() else {
                continue;
            };
            profiled.samples += n;
            *profiled.kinds.entry(Kind::of(dso, sym)).or_default() += n;
            *profiled.threads.entry(comm.to_string()).or_default() += n;
        }
        profiled
    }

    /// `samples` of the broker's, as its part of the broker's CPU (percent of one core).
    fn part(&self, samples: u64) -> f64 {
        match self.samples {
            0 => 0.0,
            all => samples as f64 / all as f64 * self.cpu,
        }
    }

    /// `kind`'s part of the broker's CPU, percent of one core.
    fn of_kind(&self, kind: Kind) -> f64 {
        self.part(self.kinds.get(&kind).copied().unwrap_or(0))
    }

    /// The threads, busiest first, with their part of the broker's CPU.
    fn threads_text(&self) -> String {
        let mut threads: Vec<(&String, &u64)> = self.threads.iter().collect();
        threads.sort_by(|a, b| b.1.cmp(a.1));
        threads
            .iter()
            .map(|(name, n)| (name, self.part(**n)))
            .filter(|(_, cpu)| *cpu >= 0.05)
            .map(|(name, cpu)| format!("`{name}` {cpu:.1} %"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The part: each broker (`compared`'s, then today's) at `n` hosts, every report changing,
/// then repeating.
pub fn run(n: usize, compared: Option<&(String, PathBuf)>) -> anyhow::Result<()> {
    println!("### Where the broker's CPU goes, by kind of work\n");
    if !crate::runs_here("perf") {
        println!("skipped: `perf` is not installed (Debian: `apt-get install linux-perf`)\n");
        return Ok(());
    }
    let ours = ("today's".to_string(), tests::bin("rb-broker"));
    let brokers: Vec<&(String, PathBuf)> = compared.into_iter().chain([&ours]).collect();
    println!(
        "The paper policy, {n} simulated hosts (`rb-loadgen`, one report per host each \
         second), each broker alone; once every host is up, `perf record -F {FREQUENCY}` \
         samples it for {} s while its CPU is read from /proc over the same time. Each \
         sample counts under the kind of work of the function it fell in (its own time, not \
         its callees'); a kind's share of the samples times the broker's CPU is its part, \
         percent of one core. Kinds are crates and libraries, not functions, so that builds \
         far apart compare row by row. perf's sampling costs the broker a little CPU of its \
         own, in both columns alike.\n",
        WINDOW.as_secs()
    );
    let paper = crate::manual_lab(n).replacen("[broker]\n", "[broker]\npolicy = \"paper\"\n", 1);
    let mut columns = Vec::new();
    for (reports, changing) in [("every report changing", true), ("repeating", false)] {
        for (label, program) in &brokers {
            let profiled = profile_broker(program, &paper, n, changing)?;
            columns.push((format!("{label}, {reports}"), profiled));
        }
    }
    print_table(&columns);
    Ok(())
}

/// The table: a row per kind, a column per broker and load; then the totals, the samples
/// and the threads.
fn print_table(columns: &[(String, Option<Profiled>)]) {
    let heads: Vec<&str> = columns.iter().map(|(h, _)| h.as_str()).collect();
    println!("| kind of work | {} |", heads.join(" | "));
    println!("|---|{}", "---:|".repeat(columns.len()));
    let cell = |p: &Option<Profiled>, f: &dyn Fn(&Profiled) -> String| {
        p.as_ref().map_or("-".to_string(), f)
    };
    let row = |name: &str, f: &dyn Fn(&Profiled) -> String| {
        let cells: Vec<String> = columns.iter().map(|(_, p)| cell(p, f)).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    for kind in Kind::ALL {
        row(kind.label(), &|p| format!("{:.1} %", p.of_kind(kind)));
    }
    row("**the broker in all** (samples)", &|p| {
        format!("**{:.1} %** ({})", p.cpu, p.samples)
    });
    row("by thread", &|p| p.threads_text());
    println!();
}

/// `program` over `lab` under `n` simulated hosts (`changing` or repeating reports),
/// sampled (`None`, said on stderr, when not every host came up or perf failed).
fn profile_broker(
    program: &Path,
    lab: &str,
    n: usize,
    changing: bool,
) -> anyhow::Result<Option<Profiled>> {
    let broker = Broker::start_program(program, lab);
    let mut gen = crate::spawn_loadgen(&broker, n, changing, 90)?;
    let profiled = match crate::all_up_within(&broker, n, Duration::from_secs(40)) {
        Some(()) => sample(broker.child.id()),
        None => Err(anyhow::anyhow!("not every host up within 40 s")),
    };
    let _ = gen.kill();
    let _ = gen.wait();
    match profiled {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            eprintln!("rb-bench profile: {}: {e:#}", program.display());
            Ok(None)
        }
    }
}

/// `perf record` of `pid` over [`WINDOW`], its CPU over the same time, and the report.
fn sample(pid: u32) -> anyhow::Result<Profiled> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("perf.data");
    let before = bench::procstat::cpu_seconds(pid);
    let started = std::time::Instant::now();
    let record = Command::new("perf")
        .args(["record", "-q", "-F", &FREQUENCY.to_string(), "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep", &WINDOW.as_secs().to_string()])
        .stdout(Stdio::null())
        .output()?;
    let after = bench::procstat::cpu_seconds(pid);
    let elapsed = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        record.status.success(),
        "perf record: {}",
        String::from_utf8_lossy(&record.stderr).trim()
    );
    let report = Command::new("perf")
        .arg("report")
        .arg("-i")
        .arg(&data)
        .args(["--stdio", "--no-children", "-n", "--sort", "comm,dso,sym"])
        .args(["-g", "none", "-t", "|"])
        .stderr(Stdio::null())
        .output()?;
    anyhow::ensure!(report.status.success(), "perf report failed");
    let mut profiled = Profiled::from_report(&String::from_utf8_lossy(&report.stdout));
    anyhow::ensure!(
        profiled.samples > 0,
        "perf recorded no sample of the broker"
    );
    let (Some(before), Some(after)) = (before, after) else {
        anyhow::bail!("the broker's CPU could not be read from /proc");
    };
    profiled.cpu = (after - before) / elapsed * 100.0;
    Ok(profiled)
}

#[cfg(test)]
mod kind_tests {
    use super::*;

    /// Symbols as perf names them in the broker's profile, each under its kind.
    #[test]
    fn each_sample_is_counted_under_its_kind_of_work() {
        let cases = [
            ("[kernel.kallsyms]", "[k] fdget", Kind::Kernel),
            ("[vdso]", "[.] __vdso_clock_gettime", Kind::Kernel),
            (
                "rb-broker",
                "[.] tokio::runtime::io::scheduled_io::ScheduledIo::poll_readiness",
                Kind::Runtime,
            ),
            (
                "rb-broker",
                "[.] <&mio::net::tcp::stream::TcpStream as std::io::Read>::read",
                Kind::Runtime,
            ),
            (
                "rb-broker",
                "[.] <allocation::delta::Differences as serde_core::ser::Serialize>::serialize",
                Kind::Serde,
            ),
            (
                "rb-broker",
                "[.] <serde_json::read::StrRead as serde_json::read::Read>::parse_str",
                Kind::Serde,
            ),
            ("rb-broker", "[.] _rjem_malloc", Kind::Allocation),
            (
                "rb-broker",
                "[.] _rjem_je_edata_heap_remove_first",
                Kind::Allocation,
            ),
            (
                "rb-broker",
                "[.] tcache_bin_flush_edatas_lookup.constprop.0",
                Kind::Allocation,
            ),
            ("rb-broker", "[.] __rustc::__rust_alloc", Kind::Allocation),
            (
                "rb-broker",
                "[.] <f64 as zmij::private::Sealed>::write_to_zmij_buffer",
                Kind::Serde,
            ),
            (
                "rb-broker",
                "[.] <A as core::slice::cmp::SlicePartialEq<B>>::equal_same_length",
                Kind::Bytes,
            ),
            (
                "libc.so.6",
                "[.] __memmove_avx512_unaligned_erms",
                Kind::Bytes,
            ),
            ("libc.so.6", "[.] __memcmp_evex_movbe", Kind::Bytes),
            (
                "rb-broker",
                "[.] indexmap::map::IndexMap<K,V,S>::get_mut",
                Kind::Maps,
            ),
            (
                "rb-broker",
                "[.] alloc::collections::btree::map::BTreeMap<K,V,A>::insert",
                Kind::Maps,
            ),
            (
                "rb-broker",
                "[.] allocation::host_map::HostMap<V>::get",
                Kind::Maps,
            ),
            (
                "rb-broker",
                "[.] policies::policy::Policy::host_decision",
                Kind::Policy,
            ),
            (
                "rb-broker",
                "[.] allocation::state::Allocator::host_changed",
                Kind::Allocator,
            ),
            (
                "rb-broker",
                "[.] broker::hosts::HostTable::take_changes",
                Kind::Broker,
            ),
            (
                "rb-broker",
                "[.] proto::frame::FramedConn<S>::take_line",
                Kind::Protocol,
            ),
            (
                "rb-broker",
                "[.] <alloc::string::String as core::clone::Clone>::clone",
                Kind::Rest,
            ),
            ("rb-broker", "[.] 0x0000000000a1b2c3", Kind::Rest),
        ];
        for (dso, sym, kind) in cases {
            assert_eq!(Kind::of(dso, sym), kind, "{sym}");
        }
    }

    /// The report's lines become shares by kind and thread, by their sample counts.
    #[test]
    fn a_report_becomes_shares_by_kind_and_thread() {
        let report = "# Samples: 1K of event 'cpu-clock:ppp'\n\
                      # Overhead|     Samples|Command  |Shared Object    |Symbol\n\
                      \x20  50.00%  | 500   |rb-core  |rb-broker        |[.] broker::hosts::HostTable::take_changes\n\
                      \x20  30.00%  | 300   |rb-hostd |[kernel.kallsyms]|[k] fdget\n\
                      \x20  20.00%  | 200   |rb-hostd |rb-broker        |[.] serde_json::de::from_str\n\
                      \n";
        let mut p = Profiled::from_report(report);
        p.cpu = 20.0;
        assert_eq!(p.samples, 1000);
        assert!((p.of_kind(Kind::Broker) - 10.0).abs() < 1e-9);
        assert!((p.of_kind(Kind::Kernel) - 6.0).abs() < 1e-9);
        assert!((p.of_kind(Kind::Serde) - 4.0).abs() < 1e-9);
        assert_eq!(p.of_kind(Kind::Maps), 0.0);
        assert_eq!(p.threads_text(), "`rb-core` 10.0 %, `rb-hostd` 10.0 %");
        assert_eq!(crate_of("<&mut dyn tokio::x::Y as z::W>::f"), "tokio");
    }
}
