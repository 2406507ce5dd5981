//! `rb-readfloor`: what reading the host daemons' reports costs when nothing is done with
//! them: the floor under the broker's CPU at N simulated hosts (`rb-bench`'s footprint
//! rows put it beside the broker's).
//!
//! It listens on 127.0.0.1 (the address is the first line it prints), takes each
//! `rb-loadgen` connection through the broker's own handshake (the lab secret), welcomes it,
//! then reads its frames as the broker's host daemons' sessions do where io_uring cannot be
//! used (or with `RB_HOSTD_READ=epoll`): on one thread of their own, a current-thread tokio
//! runtime run in 10 ms turns, each connection a task reading lines with
//! `FramedConn::recv_line`. With `--parse` each frame also goes through the
//! broker's decoder (`HostdFrames::decode`: a repeated report found by its text, any other
//! parsed). Nothing else happens: no core, no host table, no allocator, no trace. Prints
//! `all N connected` once the N of `--hosts` are, then reads until killed.
//!
//! With `--uring` the welcomed connections are read through io_uring instead, in the same
//! turns ([`uring`]), as the broker reads them where the kernel allows it.

mod uring;

use std::{
    io::Write,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};

use clap::Parser;
use proto::{
    auth::Secret,
    frame::FramedConn,
    handshake::{authenticate, ServerAuth},
    msg::FromBroker,
    repeats::HostdFrames,
};
use tokio::net::{TcpListener, TcpStream};

/// The broker's turn (`broker::server::turns::TURN`).
const TURN: Duration = Duration::from_millis(10);

#[derive(Debug, Parser)]
#[command(name = "rb-readfloor")]
struct Args {
    /// The lab secret the connections prove (as `rb-loadgen --secret-file`).
    #[arg(long)]
    secret_file: PathBuf,
    /// Connections expected: `all N connected` is printed once that many are read.
    #[arg(long)]
    hosts: usize,
    /// Also parse each frame with the broker's decoder.
    #[arg(long)]
    parse: bool,
    /// Read through io_uring (one multishot receive a connection, one system call a turn)
    /// instead of epoll and tokio's tasks.
    #[arg(long)]
    uring: bool,
}

/// Where a welcomed connection goes to be read.
#[derive(Clone)]
enum Readers {
    /// A task on the readers' runtime, as the broker's sessions.
    Tasks(tokio::runtime::Handle),
    /// The io_uring thread.
    Uring(mpsc::Sender<OwnedFd>),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secret = Arc::new(Secret::load(&args.secret_file)?);
    let readers = if args.uring {
        match uring::start(args.parse) {
            Ok(fds) => Readers::Uring(fds),
            Err(e) => {
                eprintln!("rb-readfloor: cannot read through io_uring here: {e}");
                std::process::exit(3);
            }
        }
    } else {
        Readers::Tasks(reading_runtime()?)
    };
    let accept = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    accept.block_on(serve(args, secret, readers))
}

/// The readers' runtime, run in turns on a thread of its own, as the broker's.
fn reading_runtime() -> std::io::Result<tokio::runtime::Handle> {
    let readers = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .event_interval(u32::MAX)
        .build()?;
    let reading = readers.handle().clone();
    std::thread::Builder::new()
        .name("readers".into())
        .spawn(move || loop {
            readers.block_on(tokio::task::yield_now());
            std::thread::sleep(TURN);
        })?;
    Ok(reading)
}

async fn serve(args: Args, secret: Arc<Secret>, readers: Readers) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let connected = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let (secret, readers, connected) = (secret.clone(), readers.clone(), connected.clone());
        let (hosts, parse) = (args.hosts, args.parse);
        tokio::spawn(async move {
            let Some(conn) = welcomed(stream, &secret).await else {
                return;
            };
            match readers {
                Readers::Tasks(runtime) => {
                    let Ok(conn) = conn.map_stream(TcpStream::into_std) else {
                        return;
                    };
                    drop(runtime.spawn(read_all(conn, parse)));
                }
                Readers::Uring(fds) => {
                    // Its own copy of the socket: tokio's is closed with `conn`.
                    let Ok(fd) = conn.get_ref().as_fd().try_clone_to_owned() else {
                        return;
                    };
                    drop(conn);
                    if fds.send(fd).is_err() {
                        return;
                    }
                }
            }
            if connected.fetch_add(1, Ordering::AcqRel) + 1 == hosts {
                println!("all {hosts} connected");
                let _ = std::io::stdout().flush();
            }
        });
    }
}

/// The broker's handshake and welcome; `None` when the peer failed either.
async fn welcomed(stream: TcpStream, secret: &Secret) -> Option<FramedConn<TcpStream>> {
    let mut conn = FramedConn::new(stream);
    authenticate(&mut conn, ServerAuth::Secret(secret))
        .await
        .ok()?;
    // As the broker's: its decoder takes the reports as what changed, as the broker's does.
    let welcome = FromBroker::Welcome {
        report_interval_ms: 1000,
        report_changes: true,
    };
    conn.send(&welcome).await.ok()?;
    Some(conn)
}

/// Reads the connection's frames until it ends (parsing each with `parse`).
async fn read_all(conn: FramedConn<std::net::TcpStream>, parse: bool) {
    let Ok(mut conn) = conn.map_stream(TcpStream::from_std) else {
        return;
    };
    let mut frames = HostdFrames::default();
    while let Ok(line) = conn.recv_line().await {
        if parse {
            let _ = frames.decode(line);
        }
    }
}
