//! The lab manifest (`manifest.json` in the lab directory), the machine-wide registry of
//! labs built from those manifests, and the race-safe choice of a subnet.
//!
//! The manifest is written before anything is created and again after every change, so a
//! lab can be torn down from its manifest alone: by `Lab::attach` (`rb lab down`) or by
//! [`crate::reap_stale`] after the creating process died. Every name a lab uses derives from
//! its subnet number S, which is unique among the labs of the machine:
//! directory `/var/tmp/rb-lab-S`, bridge `rbbrS`, veths `rbSnNN`, netns `<prefix>S-nodeNN`.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::creator::Creator;
use crate::process::ProcRef;
use crate::LabError;

/// Where lab directories live. Not /tmp: every host has its own private /tmp.
pub const LAB_ROOT: &str = "/var/tmp";
/// The lock taken while choosing a subnet and while reaping.
pub const LOCK_PATH: &str = "/var/tmp/rb-lab.lock";
/// File name of the manifest inside the lab directory.
pub const MANIFEST: &str = "manifest.json";
/// Format version of the manifest.
const VERSION: u32 = 1;

/// Everything needed to use and to tear down a lab.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub version: u32,
    pub dir: PathBuf,
    pub subnet: u8,
    pub prefix: String,
    /// The process whose `Lab` tears the lab down on drop; `None` once detached.
    pub owner: Option<ProcRef>,
    pub detached: bool,
    /// Who made the lab, from which checkout (absent in labs of earlier versions).
    #[serde(default)]
    pub made_by: Option<Creator>,
    pub rsh: bool,
    pub init: PathBuf,
    pub bridge: String,
    pub user: UserRecord,
    pub hosts: Vec<HostRecord>,
    pub created_unix: u64,
}

/// The lab user as written to the overlays.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserRecord {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// One host: its names, and its running processes if booted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostRecord {
    pub name: String,
    pub address: Ipv4Addr,
    pub netns: String,
    pub veth: String,
    /// The `unshare` process holding the host's PID namespace.
    pub unshare: Option<ProcRef>,
    /// PID 1 of the host (`rb-lab-init`), in the root PID namespace.
    pub init: Option<ProcRef>,
    pub partitioned: bool,
}

impl Manifest {
    /// Reads the manifest of the lab in `dir`.
    pub fn read(dir: &Path) -> Result<Manifest, LabError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| LabError::Manifest {
            path: path.clone(),
            reason: e.to_string(),
            help: "is this a lab directory (/var/tmp/rb-lab-S)? `rb lab status` lists labs".into(),
        })?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| LabError::Manifest {
            path: path.clone(),
            reason: e.to_string(),
            help: "the manifest was written by another version; remove the lab by hand".into(),
        })?;
        if m.version != VERSION {
            return Err(LabError::Manifest {
                path,
                reason: format!("version {} (this build reads {VERSION})", m.version),
                help: "use the rb build that created the lab".into(),
            });
        }
        Ok(m)
    }

    /// Writes the manifest atomically (temporary file + rename).
    pub fn write(&self) -> Result<(), LabError> {
        let path = self.dir.join(MANIFEST);
        let tmp = self.dir.join(format!(".{MANIFEST}.{}", std::process::id()));
        let text = serde_json::to_string_pretty(self).map_err(|e| LabError::Manifest {
            path: path.clone(),
            reason: e.to_string(),
            help: "this is a bug in the lab crate".into(),
        })?;
        let help = "is /var/tmp writable and not full?";
        std::fs::write(&tmp, text).map_err(LabError::io("write", &tmp, help))?;
        std::fs::rename(&tmp, &path).map_err(LabError::io("rename into place", &path, help))
    }

    /// The record of host `name`.
    pub fn host(&self, name: &str) -> Result<&HostRecord, LabError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| self.unknown(name))
    }

    /// The record of host `name`, mutably.
    pub fn host_mut(&mut self, name: &str) -> Result<&mut HostRecord, LabError> {
        let err = self.unknown(name);
        self.hosts.iter_mut().find(|h| h.name == name).ok_or(err)
    }

    fn unknown(&self, name: &str) -> LabError {
        LabError::UnknownHost {
            host: name.to_string(),
            known: self
                .hosts
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The gateway address (the bridge in the root namespace), 10.77.S.1.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, 1)
    }

    /// The per-host state directory (configs, logs, private /tmp and /run).
    pub fn host_dir(&self, name: &str) -> PathBuf {
        self.dir.join("hosts").join(name)
    }
}

/// The directory of the lab with subnet `s`.
pub(crate) fn lab_dir(s: u8) -> PathBuf {
    Path::new(LAB_ROOT).join(format!("rb-lab-{s}"))
}

/// The subnet number of a lab directory name (`rb-lab-S`).
fn subnet_of_dir_name(name: &str) -> Option<u8> {
    name.strip_prefix("rb-lab-")?.parse().ok()
}

/// All lab directories on this machine, with or without a readable manifest.
pub(crate) fn lab_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(LAB_ROOT) else {
        return Vec::new();
    };
    let mut dirs: Vec<(u8, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((subnet_of_dir_name(e.file_name().to_str()?)?, e.path())))
        .filter(|(_, p)| p.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter().map(|(_, p)| p).collect()
}

/// The machine-wide lab lock (an flock on [`LOCK_PATH`]), held while alive. The file also
/// holds the subnet number to try next, so subnets are handed out round-robin and a number
/// freed by one lab is not reused at once by the next (no stale ARP entries or sockets,
/// and tests can tell an old lab's leftovers from a new lab).
pub(crate) struct MachineLock(Flock<File>);

impl MachineLock {
    /// Blocks until the lock is ours.
    pub fn take() -> Result<MachineLock, LabError> {
        let help = "is /var/tmp writable?";
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(LOCK_PATH)
            .map_err(LabError::io("open lock file", LOCK_PATH, help))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map(MachineLock)
            .map_err(|(_, e)| LabError::io("lock", LOCK_PATH, help)(e.into()))
    }

    /// Chooses a subnet not in `used`, starting after the last one handed out.
    pub fn next_subnet(&mut self, used: &BTreeSet<u8>) -> Result<u8, LabError> {
        let help = "is /var/tmp writable?";
        let io = |action| LabError::io(action, LOCK_PATH, help);
        let file: &mut File = &mut self.0;
        let mut text = String::new();
        file.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
        file.read_to_string(&mut text).map_err(io("read"))?;
        let start = text.trim().parse::<u8>().unwrap_or(1);
        let s = first_free(used, start)?;
        file.set_len(0).map_err(io("truncate"))?;
        file.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
        writeln!(file, "{}", if s == 254 { 1 } else { s + 1 }).map_err(io("write"))?;
        Ok(s)
    }
}

/// Subnet numbers already in use: lab directories, 10.77.S.x addresses, and interfaces or
/// netns that look like a lab's. Call with the [`MachineLock`] held.
pub(crate) fn used_subnets() -> BTreeSet<u8> {
    let mut used: BTreeSet<u8> = lab_dirs()
        .iter()
        .filter_map(|p| subnet_of_dir_name(p.file_name()?.to_str()?))
        .collect();
    if let Ok(out) = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
    {
        used.extend(subnets_in_addr_listing(&String::from_utf8_lossy(
            &out.stdout,
        )));
    }
    for dir in ["/sys/class/net", "/run/netns"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            used.extend(
                entries
                    .flatten()
                    .filter_map(|e| subnet_of_lab_name(e.file_name().to_str()?)),
            );
        }
    }
    used
}

/// The S of every `10.77.S.x` address in `ip -o -4 addr` output.
fn subnets_in_addr_listing(text: &str) -> impl Iterator<Item = u8> + '_ {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("10.77.")?.split('.').next()?.parse().ok())
}

/// The S of a lab-style interface (`rbbrS`, `rbSnNN`) or netns (`<letters>S-nodeNN`) name.
fn subnet_of_lab_name(name: &str) -> Option<u8> {
    if let Some(s) = name.strip_prefix("rbbr") {
        return s.parse().ok();
    }
    if let Some((head, _)) = name.split_once("-node") {
        return head
            .trim_start_matches(|c: char| c.is_ascii_lowercase())
            .parse()
            .ok();
    }
    let rest = name.strip_prefix("rb")?;
    let (s, n) = rest.split_once('n')?;
    n.parse::<u16>().ok()?;
    s.parse().ok()
}

/// The first subnet number in 1..=254 not in `used`, searching from `start` and wrapping.
pub(crate) fn first_free(used: &BTreeSet<u8>, start: u8) -> Result<u8, LabError> {
    let start = start.clamp(1, 254);
    (start..=254)
        .chain(1..start)
        .find(|s| !used.contains(s))
        .ok_or(LabError::NoSubnet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_lab_names() {
        assert_eq!(subnet_of_lab_name("rbbr12"), Some(12));
        assert_eq!(subnet_of_lab_name("rb7n02"), Some(7));
        assert_eq!(subnet_of_lab_name("rb200-node13"), Some(200));
        assert_eq!(subnet_of_lab_name("t3-node02"), Some(3));
        assert_eq!(subnet_of_lab_name("eth0"), None);
        assert_eq!(subnet_of_lab_name("rbxn"), None);
        assert_eq!(subnet_of_dir_name("rb-lab-9"), Some(9));
        assert_eq!(subnet_of_dir_name("rb-lab.lock"), None);
    }

    #[test]
    fn finds_subnets_in_addresses() {
        let text = "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255\n9: rbbr3    inet 10.77.3.1/24 scope global rbbr3\n";
        assert_eq!(subnets_in_addr_listing(text).collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn first_free_skips_used() {
        let used: BTreeSet<u8> = [1, 2, 4].into_iter().collect();
        assert_eq!(first_free(&used, 1).expect("free"), 3);
        assert_eq!(first_free(&used, 4).expect("free"), 5);
        assert_eq!(first_free(&used, 0).expect("free"), 3);
        let high: BTreeSet<u8> = (250..=254).collect();
        assert_eq!(first_free(&high, 252).expect("wraps"), 1);
        let all: BTreeSet<u8> = (1..=254).collect();
        assert!(matches!(first_free(&all, 7), Err(LabError::NoSubnet)));
    }

    #[test]
    fn manifest_round_trips() {
        let dir = std::env::temp_dir().join(format!("rb-lab-manifest-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let m = Manifest {
            version: VERSION,
            dir: dir.clone(),
            subnet: 5,
            prefix: "rb".into(),
            owner: ProcRef::current(),
            detached: false,
            made_by: Some(Creator::current()),
            rsh: true,
            init: "/bin/true".into(),
            bridge: "rbbr5".into(),
            user: UserRecord {
                name: "rblab".into(),
                uid: 4242,
                gid: 4242,
                home: dir.join("home/rblab"),
            },
            hosts: vec![HostRecord {
                name: "node02".into(),
                address: Ipv4Addr::new(10, 77, 5, 2),
                netns: "rb5-node02".into(),
                veth: "rb5n02".into(),
                unshare: None,
                init: None,
                partitioned: false,
            }],
            created_unix: 0,
        };
        m.write().expect("write");
        let back = Manifest::read(&dir).expect("read");
        assert_eq!(back.hosts[0].address, m.hosts[0].address);
        assert_eq!(back.gateway(), Ipv4Addr::new(10, 77, 5, 1));
        assert!(back.host("node03").is_err());
        assert_eq!(back.made_by, m.made_by);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
