//! `rb-bnb --cities C --seed S`: the shortest closed tour through C random cities, by
//! branch and bound over the job's hosts. Last line of output: `tour=<cost>`.

use std::{net::SocketAddr, process::ExitCode};

use clap::Parser;
use rb_bnb::{
    master::{self, MasterConfig},
    tsp::{Instance, MAX_BRUTE_FORCE, MAX_CITIES},
    worker::{self, WorkerConfig},
};

/// Exit code for bad command-line use (sysexits EX_USAGE).
const USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "rb-bnb",
    about = "Branch-and-bound TSP under ResourceBroker: grows with `rsh anyLinux` while tasks wait, \
             hands a vacated or dead worker's task on (JEL). Run it as an adaptive job: \
             agent rb-bnb --cities 11 --seed 1 -- '(adaptive=yes)'"
)]
struct Args {
    /// Number of cities (3 to 24).
    #[arg(long)]
    cities: usize,
    /// Seed of the random instance (the same on every host).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Tasks are the tours' first 1 + DEPTH cities.
    #[arg(long, default_value_t = 3, value_name = "DEPTH")]
    split_depth: usize,
    /// Each task lasts at least this long, in milliseconds (demos, tests).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    task_ms: u64,
    /// Most workers on granted hosts at once.
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_workers: usize,
    /// Workers in the master's own process.
    #[arg(long, default_value_t = 1, value_name = "N")]
    local_workers: usize,
    /// Try every tour instead (cities ≤ 11), on this host alone, outside any job: the check.
    #[arg(long)]
    brute_force: bool,
    /// Run as a worker (the master starts these).
    #[arg(long, hide = true)]
    worker: bool,
    #[arg(long, hide = true, value_delimiter = ',')]
    master: Vec<SocketAddr>,
    #[arg(long, hide = true)]
    launch: Option<u64>,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(USAGE);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    if let Err(why) = check(&args) {
        eprintln!("rb-bnb: {why}");
        return ExitCode::from(USAGE);
    }
    let result = if args.brute_force {
        let tour = Instance::random(args.cities, args.seed).brute_force();
        print_tour(&tour.cities, tour.cost);
        Ok(())
    } else if args.worker {
        worker::run(&WorkerConfig {
            master: args.master.clone(),
            cities: args.cities,
            seed: args.seed,
            task_ms: args.task_ms,
            launch: args.launch,
        })
    } else {
        run_master(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rb-bnb: {e}");
            ExitCode::from(e.exit_code().clamp(1, 255) as u8)
        }
    }
}

fn check(args: &Args) -> Result<(), String> {
    if !(3..=MAX_CITIES).contains(&args.cities) {
        return Err(format!(
            "--cities {} is out of range: give 3 to {MAX_CITIES}",
            args.cities
        ));
    }
    if args.brute_force && args.cities > MAX_BRUTE_FORCE {
        return Err(format!(
            "--brute-force tries every tour: give at most {MAX_BRUTE_FORCE} cities, not {}",
            args.cities
        ));
    }
    if args.worker && args.master.is_empty() {
        return Err(
            "--worker needs --master ADDR[,ADDR…] (the master starts workers itself)".into(),
        );
    }
    if !args.worker && args.local_workers == 0 && args.max_workers == 0 {
        return Err("no workers: give --local-workers or --max-workers above 0".into());
    }
    Ok(())
}

fn run_master(args: &Args) -> Result<(), rb_bnb::BnbError> {
    let exe = std::env::current_exe().map_err(rb_bnb::BnbError::Listen)?;
    let outcome = master::run(&MasterConfig {
        cities: args.cities,
        seed: args.seed,
        split_depth: args.split_depth,
        task_ms: args.task_ms,
        max_workers: args.max_workers,
        local_workers: args.local_workers,
        exe,
    })?;
    eprintln!(
        "rb-bnb: {} tasks, {} handed out again ({} at a vacate, {} at a death, {} at a lost connection), {} workers on granted hosts",
        outcome.tasks,
        outcome.handed_out_again,
        outcome.at_vacate,
        outcome.at_death,
        outcome.at_lost_connection,
        outcome.remote_workers
    );
    print_tour(&outcome.best.cities, outcome.best.cost);
    Ok(())
}

fn print_tour(cities: &[usize], cost: u64) {
    let list: Vec<String> = cities.iter().map(|c| c.to_string()).collect();
    println!("cities={}", list.join(","));
    println!("tour={cost}");
}
