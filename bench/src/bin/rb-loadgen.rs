//! `rb-loadgen`: N simulated host daemons against a real broker. Each connects over TCP,
//! completes the real HMAC handshake as role `hostd`, and sends a realistic report every
//! interval (start times spread over the first interval). Stops after `--seconds`. The
//! reports repeat each other but for their counter, unless `--changing`: then each one's
//! idle times grow by the interval and its load moves, as a real daemon's do. As a real
//! daemon, each sends its reports after the first as what changed when the broker's
//! welcome offers it (`proto::report_changes`), unless `--whole-reports`.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bench::report_shape::{report, Shape};
use clap::Parser;
use proto::{
    auth::Secret,
    frame::FramedConn,
    handshake::{client_handshake_welcomed, ClientAuth},
    msg::{Role, ToBroker},
    report::HostReport,
    report_changes::Changes,
};
use tokio::{
    net::{TcpSocket, TcpStream},
    sync::Semaphore,
};

#[derive(Debug, Parser)]
#[command(name = "rb-loadgen")]
struct Args {
    #[arg(long)]
    broker: String,
    #[arg(long)]
    secret_file: PathBuf,
    /// Number of simulated hosts, named `<prefix>00001`…
    #[arg(long)]
    hosts: usize,
    #[arg(long, default_value = "load")]
    prefix: String,
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// How long to keep reporting once connected.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Every report differs from the one before, as a real daemon's do (idle times grow
    /// by the interval, the load moves); without it they differ only in their counter.
    #[arg(long)]
    changing: bool,
    /// Spread the connections over this many source addresses, 127.0.0.1 … 127.0.0.N, for
    /// more simulated hosts than one address has ports (about 28k): the broker must listen
    /// on loopback.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=254))]
    source_addresses: u8,
    /// Every report whole, even where the broker takes them as what changed (as a daemon
    /// from before `report_changes`).
    #[arg(long)]
    whole_reports: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    startup::raise_open_files();
    if args.source_addresses > 1 && !broker_on_loopback(&args.broker) {
        anyhow::bail!(
            "--source-addresses {}: the broker `{}` is not on 127.0.0.0/8; give a loopback \
             address (IP:PORT) or leave the option out",
            args.source_addresses,
            args.broker
        );
    }
    let secret = Arc::new(Secret::load(&args.secret_file)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args, secret))
}

async fn run(args: Args, secret: Arc<Secret>) -> anyhow::Result<()> {
    let connected = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(Semaphore::new(256));
    let interval = Duration::from_millis(args.interval_ms);
    let stop_at = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::with_capacity(args.hosts);
    for i in 1..=args.hosts {
        let name = format!("{}{i:05}", args.prefix);
        let source = (args.source_addresses > 1).then(|| {
            let k = (i - 1) % usize::from(args.source_addresses);
            Ipv4Addr::new(127, 0, 0, 1 + k as u8)
        });
        let ctx = (
            (args.broker.clone(), source),
            secret.clone(),
            connected.clone(),
            sent.clone(),
            gate.clone(),
        );
        let offset = interval.mul_f64(i as f64 / args.hosts as f64);
        let shape = Shape {
            changing: args.changing,
            interval,
        };
        let how = (shape, !args.whole_reports);
        tasks.push(tokio::spawn(simulate(name, ctx, how, offset, stop_at)));
    }
    let mut failures = 0;
    for t in tasks {
        if !matches!(t.await, Ok(Ok(()))) {
            failures += 1;
        }
    }
    println!(
        "{{\"hosts\":{},\"connected\":{},\"reports\":{},\"failed\":{}}}",
        args.hosts,
        connected.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed),
        failures
    );
    Ok(())
}

type Ctx = (
    (String, Option<Ipv4Addr>),
    Arc<Secret>,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    Arc<Semaphore>,
);

/// One simulated daemon: its reports' shape, and whether it may send them as what changed.
async fn simulate(
    name: String,
    ctx: Ctx,
    (shape, changes_wanted): (Shape, bool),
    offset: Duration,
    stop_at: tokio::time::Instant,
) -> anyhow::Result<()> {
    let (broker, secret, connected, sent, gate) = ctx;
    let (mut conn, changes_offered) = connect(&broker, &secret, &name, &gate, stop_at).await?;
    let as_changes = changes_wanted && changes_offered;
    connected.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(offset).await;
    let mut seq = 0;
    // The last report sent, when the next go as what changed.
    let mut last: Option<HostReport> = None;
    let mut tick = tokio::time::interval(shape.interval);
    while tokio::time::Instant::now() < stop_at {
        tick.tick().await;
        seq += 1;
        let new = report(&name, seq, shape);
        if as_changes {
            match &last {
                Some(old) => conn.send(&Changes::new(old, &new)).await?,
                None => conn.send(&ToBroker::Report(Box::new(new.clone()))).await?,
            }
            last = Some(new);
        } else {
            // Whole reports: nothing kept, nothing copied.
            conn.send(&ToBroker::Report(Box::new(new))).await?;
        }
        sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Connects and completes the handshake as `name`, trying again after a failure (a broker
/// busy with thousands of handshakes at once times some out, as a real daemon's supervisor
/// would start it again) until `stop_at`.
async fn connect(
    (broker, source): &(String, Option<Ipv4Addr>),
    secret: &Secret,
    name: &str,
    gate: &Semaphore,
    stop_at: tokio::time::Instant,
) -> anyhow::Result<(FramedConn<TcpStream>, bool)> {
    let mut backoff = Duration::from_millis(200);
    loop {
        let attempt = async {
            let _permit = gate.acquire().await?;
            let stream = match source {
                Some(ip) => {
                    let socket = TcpSocket::new_v4()?;
                    socket.bind(SocketAddr::from((*ip, 0)))?;
                    socket.connect(broker.parse()?).await?
                }
                None => TcpStream::connect(broker.as_str()).await?,
            };
            let mut conn = FramedConn::new(stream);
            let welcome =
                client_handshake_welcomed(&mut conn, Role::Hostd, name, ClientAuth::Secret(secret))
                    .await?;
            anyhow::Ok((conn, welcome.report_changes))
        };
        match attempt.await {
            Ok(connected) => return Ok(connected),
            Err(e) if tokio::time::Instant::now() + backoff >= stop_at => return Err(e),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Whether `broker` is an `IP:PORT` on 127.0.0.0/8.
fn broker_on_loopback(broker: &str) -> bool {
    broker
        .parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback() && a.is_ipv4())
}
