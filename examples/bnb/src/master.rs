//! The master: wins the job's `master` election, splits the search into tasks, runs its own
//! in-process workers, grows onto granted hosts while tasks wait (`rsh anyLinux rb-bnb
//! --worker …`, one request at a time), and hands out again the task of any worker that
//! will not finish it: its host vacated (the JEL `vacate` event, before its processes get
//! SIGTERM), its pool member died or left, or its connection dropped.
//!
//! Every input — worker lines, the job's JEL stream, launches ending — reaches one loop
//! through one channel, in order; the decisions are the [`Board`]'s.

use std::{
    collections::BTreeMap,
    io::{BufReader, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc::{self, Receiver, Sender},
};

use jel::{Event, EventKind};

use crate::{
    board::{Board, WorkerId},
    tsp::{Instance, Tour},
    wire::{self, FromWorker, ToWorker},
    BnbError,
};

/// How a master runs.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    pub cities: usize,
    pub seed: u64,
    /// Tasks are the tour prefixes of `1 + split_depth` cities.
    pub split_depth: usize,
    pub task_ms: u64,
    /// Most workers on granted hosts at once.
    pub max_workers: usize,
    /// Workers in the master's own process.
    pub local_workers: usize,
    /// This program, started by absolute path on granted hosts.
    pub exe: PathBuf,
}

/// What a finished run found and did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub best: Tour,
    pub tasks: usize,
    pub handed_out_again: usize,
    /// Of those, handed on at a `vacate` (before the worker was told to end).
    pub at_vacate: usize,
    /// Of those, handed on at a `died` or `left` of the worker's pool member.
    pub at_death: usize,
    /// Of those, handed on when the worker's connection dropped first (a crashed host).
    pub at_lost_connection: usize,
    pub remote_workers: usize,
}

/// Launches in a row that end before their worker calls back, before growing stops.
const LAUNCH_FAILURES_MAX: u32 = 3;

/// Everything the master's loop hears, in the order it happened.
enum Input {
    Connected(WorkerId, TcpStream),
    From(WorkerId, FromWorker),
    Gone(WorkerId),
    Pool(Event),
    LaunchEnded(u64, Option<i32>),
}

struct Worker {
    out: TcpStream,
    member: Option<u64>,
    /// `pid P on HOST` (or `in the master`), for the log.
    label: String,
    task: Option<usize>,
    /// Vacated, dead or leaving: gets no more tasks.
    retiring: bool,
}

/// Runs the job to its answer.
pub fn run(cfg: &MasterConfig) -> Result<Outcome, BnbError> {
    let mut member = jel::Client::connect()?.join(Some("master"))?;
    let won = member.elect("master")?;
    match won.winner {
        Some(w) if w.id == member.id() => {}
        other => {
            let winner = other.map_or("none".into(), |w| w.id.to_string());
            return Err(BnbError::NotMaster { winner });
        }
    }
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(BnbError::Listen)?;
    let port = listener.local_addr().map_err(BnbError::Listen)?.port();
    let (tx, rx) = mpsc::channel();
    accept_workers(listener, tx.clone());
    watch_pool(member.watch(member.joined_seq())?, tx.clone());
    let inst = Instance::random(cfg.cities, cfg.seed);
    for _ in 0..cfg.local_workers {
        let inst = inst.clone();
        let task_ms = cfg.task_ms;
        std::thread::spawn(move || {
            if let Ok(s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                let hello = FromWorker::Hello {
                    member: None,
                    launch: None,
                    pid: std::process::id(),
                    host: None,
                };
                crate::worker::serve(s, hello, &inst, task_ms);
            }
        });
    }
    let mut master = Master::new(cfg, inst, addresses(port), tx);
    let outcome = master.serve(rx);
    master.stop();
    let _ = member.leave();
    outcome
}

/// Accepts workers' connections; one reader thread each.
fn accept_workers(listener: TcpListener, tx: Sender<Input>) {
    std::thread::spawn(move || {
        for (id, stream) in (1..).zip(listener.incoming()) {
            let Ok(stream) = stream else { continue };
            let _ = stream.set_nodelay(true);
            let Ok(reader) = stream.try_clone() else {
                continue;
            };
            if tx.send(Input::Connected(id, stream)).is_err() {
                return;
            }
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(reader);
                while let Ok(Some(msg)) = wire::read::<FromWorker>(&mut reader) {
                    if tx.send(Input::From(id, msg)).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Input::Gone(id));
            });
        }
    });
}

/// Passes the job's JEL stream on, event by event.
fn watch_pool(watcher: jel::Watcher, tx: Sender<Input>) {
    std::thread::spawn(move || {
        for event in watcher.flatten() {
            if tx.send(Input::Pool(event)).is_err() {
                return;
            }
        }
    });
}

/// Every IPv4 address of this host with `port`, loopback last: a granted host reaches one.
fn addresses(port: u16) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = nix::ifaddrs::getifaddrs()
        .map(|addrs| {
            addrs
                .filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
                .filter(|ip| !ip.is_loopback())
                .map(|ip| SocketAddr::new(IpAddr::V4(ip), port))
                .collect()
        })
        .unwrap_or_default();
    out.push(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    out
}

struct Master<'a> {
    cfg: &'a MasterConfig,
    inst: Instance,
    tasks: Vec<Vec<usize>>,
    board: Board,
    best: Tour,
    workers: BTreeMap<WorkerId, Worker>,
    addrs: Vec<SocketAddr>,
    tx: Sender<Input>,
    /// Launches whose worker has not called back: launch number → the `rsh`'s pid.
    pending: BTreeMap<u64, u32>,
    launched: u64,
    failures: u32,
    remote_workers: usize,
    at_vacate: usize,
    at_death: usize,
    at_lost_connection: usize,
}

impl<'a> Master<'a> {
    fn new(
        cfg: &'a MasterConfig,
        inst: Instance,
        addrs: Vec<SocketAddr>,
        tx: Sender<Input>,
    ) -> Self {
        let tasks = inst.tasks(cfg.split_depth);
        Master {
            cfg,
            board: Board::new(tasks.len()),
            best: inst.greedy(),
            inst,
            tasks,
            workers: BTreeMap::new(),
            addrs,
            tx,
            pending: BTreeMap::new(),
            launched: 0,
            failures: 0,
            remote_workers: 0,
            at_vacate: 0,
            at_death: 0,
            at_lost_connection: 0,
        }
    }

    fn serve(&mut self, rx: Receiver<Input>) -> Result<Outcome, BnbError> {
        while !self.board.all_done() {
            let Ok(input) = rx.recv() else { break };
            self.handle(input);
            self.hand_out();
            self.grow();
            if self.workers.is_empty()
                && self.pending.is_empty()
                && self.failures >= LAUNCH_FAILURES_MAX
            {
                return Err(BnbError::NoWorkers);
            }
        }
        debug_assert_eq!(self.inst.cost(&self.best.cities), self.best.cost);
        Ok(Outcome {
            best: self.best.clone(),
            tasks: self.tasks.len(),
            handed_out_again: self.board.handed_out_again(),
            at_vacate: self.at_vacate,
            at_death: self.at_death,
            at_lost_connection: self.at_lost_connection,
            remote_workers: self.remote_workers,
        })
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Connected(id, out) => {
                let worker = Worker {
                    out,
                    member: None,
                    label: String::new(),
                    task: None,
                    retiring: true, // until it says hello
                };
                self.workers.insert(id, worker);
            }
            Input::From(id, msg) => self.worker_said(id, msg),
            Input::Gone(id) => {
                if self.board.give_back(id).is_some() {
                    self.at_lost_connection += 1;
                }
                self.workers.remove(&id);
            }
            Input::Pool(event) => self.pool_event(event),
            Input::LaunchEnded(launch, status) => {
                if self.pending.remove(&launch).is_some() {
                    self.failures += 1;
                    let status = status.map_or("a signal".into(), |c| c.to_string());
                    eprintln!(
                        "rb-bnb: `rsh anyLinux` ended ({status}) before its worker called back"
                    );
                }
            }
        }
    }

    fn worker_said(&mut self, id: WorkerId, msg: FromWorker) {
        match msg {
            FromWorker::Hello {
                member,
                launch,
                pid,
                host,
            } => {
                if let Some(launch) = launch {
                    self.pending.remove(&launch);
                    self.failures = 0;
                    self.remote_workers += 1;
                }
                if let Some(w) = self.workers.get_mut(&id) {
                    w.member = member;
                    w.label = match host {
                        Some(host) => format!("pid {pid} on {host}"),
                        None => "in the master".into(),
                    };
                    w.retiring = false;
                }
            }
            FromWorker::Better { cost, cities } => self.offer(cost, cities),
            FromWorker::Done { id: task, best } => {
                if let Some(w) = self.workers.get_mut(&id) {
                    if w.task == Some(task) {
                        w.task = None;
                    }
                }
                if self.board.finish(task) {
                    if let Some(found) = best {
                        self.offer(found.cost, found.cities);
                    }
                }
            }
        }
    }

    /// A tour a worker found: kept (and shared) when it is better and really a tour.
    fn offer(&mut self, cost: u64, cities: Vec<usize>) {
        let valid = cities.len() == self.inst.cities() && {
            let mut sorted = cities.clone();
            sorted.sort_unstable();
            sorted.iter().copied().eq(0..self.inst.cities())
        };
        if !valid || cost >= self.best.cost || self.inst.cost(&cities) != cost {
            return;
        }
        self.best = Tour { cost, cities };
        let msg = wire::line(&ToWorker::Bound { cost });
        for w in self.workers.values_mut().filter(|w| !w.retiring) {
            let _ = w.out.write_all(msg.as_bytes());
        }
    }

    fn pool_event(&mut self, event: Event) {
        let (leaving, vacate): (Vec<u64>, bool) = match event.kind {
            EventKind::Vacate { members, .. } => (members.iter().map(|m| m.id).collect(), true),
            EventKind::Died { member, .. } | EventKind::Left { member } => (vec![member.id], false),
            _ => return,
        };
        for (&id, w) in self.workers.iter_mut() {
            if !w.member.is_some_and(|m| leaving.contains(&m)) {
                continue;
            }
            w.retiring = true;
            w.task = None;
            // Its task goes to another worker: it stops now (it ignores SIGTERM, see worker).
            let _ = w.out.write_all(wire::line(&ToWorker::Quit).as_bytes());
            if self.board.give_back(id).is_some() {
                *if vacate {
                    &mut self.at_vacate
                } else {
                    &mut self.at_death
                } += 1;
            }
        }
    }

    /// Every idle worker gets the next waiting task.
    fn hand_out(&mut self) {
        for (&id, w) in self.workers.iter_mut() {
            if w.retiring || w.task.is_some() {
                continue;
            }
            let Some(task) = self.board.take(id) else {
                return;
            };
            w.task = Some(task);
            let msg = ToWorker::Task {
                id: task,
                prefix: self.tasks[task].clone(),
                bound: self.best.cost,
            };
            let _ = w.out.write_all(wire::line(&msg).as_bytes());
            eprintln!("rb-bnb: task {task} to the worker {}", w.label);
        }
    }

    /// One more host while tasks wait for a worker, one request at a time.
    fn grow(&mut self) {
        let remote = self
            .workers
            .values()
            .filter(|w| !w.retiring && w.member.is_some())
            .count();
        let wanted = self.board.waiting() > 0
            && self.pending.is_empty()
            && remote < self.cfg.max_workers
            && self.failures < LAUNCH_FAILURES_MAX;
        if wanted {
            self.launch();
        }
    }

    fn launch(&mut self) {
        self.launched += 1;
        let launch = self.launched;
        let master: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        let mut rsh = Command::new("rsh");
        rsh.arg("anyLinux")
            .arg(&self.cfg.exe)
            .args(["--worker", "--master", &master.join(",")])
            .args(["--cities", &self.cfg.cities.to_string()])
            .args(["--seed", &self.cfg.seed.to_string()])
            .args(["--task-ms", &self.cfg.task_ms.to_string()])
            .args(["--launch", &launch.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        match rsh.spawn() {
            Ok(mut child) => {
                self.pending.insert(launch, child.id());
                let tx = self.tx.clone();
                std::thread::spawn(move || {
                    let status = child.wait().ok().and_then(|s| s.code());
                    let _ = tx.send(Input::LaunchEnded(launch, status));
                });
            }
            Err(e) => {
                self.failures = LAUNCH_FAILURES_MAX;
                eprintln!("rb-bnb: cannot run rsh: {e}; going on without more hosts");
            }
        }
    }

    /// Tells every worker to quit and withdraws the requests still waiting for a host.
    fn stop(&mut self) {
        let quit = wire::line(&ToWorker::Quit);
        for w in self.workers.values_mut() {
            let _ = w.out.write_all(quit.as_bytes());
        }
        for &pid in self.pending.values() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
}
