//! [`Lab`]: building a lab, reattaching to one, and tearing it down.
//!
//! `Lab::up` chooses a free subnet under the machine-wide lock, writes the manifest, then
//! creates files, network and hosts, updating the manifest as it goes. From the moment the
//! manifest exists the `Lab` value owns the lab: dropping it (also while a test panics)
//! tears everything down. Operations on a running lab live in `ops.rs`.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::creator::Creator;
use crate::host::{self, Booted};
use crate::manifest::{self, HostRecord, MachineLock, Manifest, MANIFEST};
use crate::process::ProcRef;
use crate::{net, provision, LabError};

/// What lab to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabSpec {
    /// Number of hosts (node02 …), 1..=200. Default 4.
    pub hosts: usize,
    /// Also run inetd with in.rshd on every host (real rsh). Default false.
    pub rsh: bool,
    /// Prefix of the netns names (`<prefix>S-node02`), lowercase letters, at most 8.
    /// Default `rb`.
    pub prefix: Option<String>,
}

impl Default for LabSpec {
    fn default() -> Self {
        LabSpec {
            hosts: 4,
            rsh: false,
            prefix: None,
        }
    }
}

/// One host of a lab. Host names start at node02: node01 is the front-end machine, i.e. the
/// root namespace itself, reachable from the hosts as `node01`/`gateway` at 10.77.S.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabHost {
    /// Host name, also its hostname inside (node02, node03, …).
    pub name: String,
    /// Its address, 10.77.S.N.
    pub address: Ipv4Addr,
    /// Its network namespace (`ip netns`).
    pub netns: String,
    /// The root-namespace end of its veth (down = partitioned).
    pub veth: String,
}

/// The lab-only unprivileged user, known only inside the hosts (overlaid passwd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabUser {
    /// Login name (`rblab`).
    pub name: String,
    /// uid (4242 unless taken on this machine).
    pub uid: u32,
    /// gid (same as the uid).
    pub gid: u32,
    /// Home, in the lab directory and shared by all hosts.
    pub home: PathBuf,
    /// The user's private ssh key (`~/.ssh/id_ed25519`), authorized on every host.
    pub key: PathBuf,
}

/// What dropping a [`Lab`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnDrop {
    TearDown,
    Leave,
}

/// A running lab. See the crate docs.
pub struct Lab {
    pub(crate) state: Mutex<Manifest>,
    pub(crate) dir: PathBuf,
    pub(crate) hosts: Vec<LabHost>,
    pub(crate) user: LabUser,
    /// `unshare` processes this process started (to reap them).
    pub(crate) children: Mutex<HashMap<String, Child>>,
    on_drop: OnDrop,
}

/// Fails unless the effective uid is 0.
pub fn require_root() -> Result<(), LabError> {
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 {
        Ok(())
    } else {
        Err(LabError::NotRoot { uid })
    }
}

fn validate(spec: &LabSpec) -> Result<String, LabError> {
    if !(1..=200).contains(&spec.hosts) {
        return Err(LabError::InvalidInput {
            reason: format!("{} hosts", spec.hosts),
            help: "a lab has 1 to 200 hosts".into(),
        });
    }
    let prefix = spec.prefix.clone().unwrap_or_else(|| "rb".into());
    if prefix.is_empty() || prefix.len() > 8 || !prefix.chars().all(|c| c.is_ascii_lowercase()) {
        return Err(LabError::InvalidInput {
            reason: format!("prefix {prefix:?}"),
            help: "the prefix is 1 to 8 lowercase ASCII letters".into(),
        });
    }
    Ok(prefix)
}

impl Lab {
    /// Builds a lab and returns when every host's sshd accepts connections.
    /// First tears down stale labs (see [`crate::reap_stale`]).
    pub fn up(spec: &LabSpec) -> Result<Lab, LabError> {
        require_root()?;
        let prefix = validate(spec)?;
        let init = host::find_init()?;
        crate::registry::reap_stale();
        let manifest = {
            let mut lock = MachineLock::take()?;
            let s = lock.next_subnet(&manifest::used_subnets())?;
            let m = plan(spec, s, prefix, init);
            provision::mkdir(&m.dir, 0o755)?;
            m.write()?;
            m
        };
        let lab = Lab::from_manifest(manifest, OnDrop::TearDown);
        lab.build()?;
        Ok(lab)
    }

    /// Reattaches to the lab in `dir` (made by [`Lab::detach`], or still owned by another
    /// process). Dropping the result leaves the lab running; call [`Lab::down`] to end it.
    pub fn attach(dir: &Path) -> Result<Lab, LabError> {
        Ok(Lab::from_manifest(Manifest::read(dir)?, OnDrop::Leave))
    }

    fn from_manifest(m: Manifest, on_drop: OnDrop) -> Lab {
        let hosts = m
            .hosts
            .iter()
            .map(|h| LabHost {
                name: h.name.clone(),
                address: h.address,
                netns: h.netns.clone(),
                veth: h.veth.clone(),
            })
            .collect();
        let user = LabUser {
            name: m.user.name.clone(),
            uid: m.user.uid,
            gid: m.user.gid,
            home: m.user.home.clone(),
            key: provision::user_key(&m),
        };
        Lab {
            dir: m.dir.clone(),
            state: Mutex::new(m),
            hosts,
            user,
            children: Mutex::new(HashMap::new()),
            on_drop,
        }
    }

    /// Files, network, then all hosts booted in parallel.
    fn build(&self) -> Result<(), LabError> {
        let m = self.manifest().clone();
        provision::generate_keys(&m)?;
        provision::write_user_files(&m)?;
        provision::write_overlays(&m)?;
        provision::write_host_files(&m)?;
        provision::write_ssh_config(&m)?;
        net::create_bridge(&m)?;
        for h in &m.hosts {
            net::create_host(&m, h)?;
        }
        for h in &m.hosts {
            self.start_host(&h.name)?;
        }
        let m = self.manifest().clone();
        for h in &m.hosts {
            let init = h.init.ok_or_else(|| LabError::HostDown {
                host: h.name.clone(),
            })?;
            host::wait_ready(&m, h, init)?;
        }
        Ok(())
    }

    /// Starts a host's process tree and records it in the manifest.
    pub(crate) fn start_host(&self, name: &str) -> Result<ProcRef, LabError> {
        let mut m = self.manifest();
        let h = m.host(name)?.clone();
        let Booted {
            child,
            unshare,
            init,
        } = host::start(&m, &h)?;
        self.children_lock().insert(name.to_string(), child);
        let rec = m.host_mut(name)?;
        rec.unshare = Some(unshare);
        rec.init = Some(init);
        m.write()?;
        Ok(init)
    }

    /// Kills a host's process tree and records that in the manifest.
    pub(crate) fn kill_host(&self, name: &str) -> Result<(), LabError> {
        let mut m = self.manifest();
        let child = self.children_lock().remove(name);
        host::kill(m.host(name)?, child)?;
        let rec = m.host_mut(name)?;
        rec.unshare = None;
        rec.init = None;
        if m.dir.exists() {
            m.write()?;
        }
        Ok(())
    }

    pub(crate) fn manifest(&self) -> MutexGuard<'_, Manifest> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn children_lock(&self) -> MutexGuard<'_, HashMap<String, Child>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves the lab running (for `rb lab up`) and returns its directory. The manifest
    /// marks it detached, so [`crate::reap_stale`] leaves it alone.
    pub fn detach(mut self) -> PathBuf {
        self.on_drop = OnDrop::Leave;
        let mut m = self.manifest();
        m.owner = None;
        m.detached = true;
        if let Err(e) = m.write() {
            tracing::warn!(dir = %m.dir.display(), error = %e, "cannot mark lab detached");
        }
        m.dir.clone()
    }

    /// Tears the lab down, reporting every step that failed.
    pub fn down(mut self) -> Result<(), LabError> {
        self.on_drop = OnDrop::Leave;
        self.teardown()
    }

    /// Kills all hosts, deletes netns, veths, bridge and the lab directory (and the
    /// `/etc/netns` files of labs made by earlier versions). Tolerates a partly built lab
    /// and can be repeated.
    fn teardown(&self) -> Result<(), LabError> {
        let mut errors = Vec::new();
        let names: Vec<String> = self
            .manifest()
            .hosts
            .iter()
            .map(|h| h.name.clone())
            .collect();
        for name in &names {
            if let Err(e) = self.kill_host(name) {
                errors.push(format!("kill {name}: {e}"));
            }
        }
        let m = self.manifest().clone();
        for h in &m.hosts {
            if let Err(e) = net::delete_host(h) {
                errors.push(format!("network of {}: {e}", h.name));
            }
        }
        if let Err(e) = net::delete_bridge(&m) {
            errors.push(format!("bridge: {e}"));
        }
        for h in &m.hosts {
            // Only labs of earlier versions have these (see `provision`'s module docs).
            remove_tree(&provision::etc_netns(h), &mut errors);
        }
        if errors.is_empty() {
            remove_lab_dir(&m, &mut errors);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(LabError::Teardown { dir: m.dir, errors })
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.on_drop == OnDrop::TearDown {
            if let Err(e) = self.teardown() {
                eprintln!("rb lab: teardown on drop failed: {e}");
            }
        }
    }
}

/// The manifest of a lab about to be built on subnet `s`.
fn plan(spec: &LabSpec, s: u8, prefix: String, init: PathBuf) -> Manifest {
    let dir = manifest::lab_dir(s);
    let hosts = (0..spec.hosts)
        .map(|i| {
            let n = i + 2;
            HostRecord {
                name: format!("node{n:02}"),
                address: Ipv4Addr::new(10, 77, s, n as u8),
                netns: format!("{prefix}{s}-node{n:02}"),
                veth: format!("rb{s}n{n:02}"),
                unshare: None,
                init: None,
                partitioned: false,
            }
        })
        .collect();
    Manifest {
        version: 1,
        user: provision::choose_user(&dir),
        dir,
        subnet: s,
        prefix,
        owner: ProcRef::current(),
        detached: false,
        made_by: Some(Creator::current()),
        rsh: spec.rsh,
        init,
        bridge: format!("rbbr{s}"),
        hosts,
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

fn remove_tree(path: &Path, errors: &mut Vec<String>) {
    if path.exists() {
        if let Err(e) = std::fs::remove_dir_all(path) {
            errors.push(format!("remove {}: {e}", path.display()));
        }
    }
}

/// Removes the lab directory, the manifest last, after checking that the path really is a
/// lab directory (`/var/tmp/rb-lab-S`).
fn remove_lab_dir(m: &Manifest, errors: &mut Vec<String>) {
    if m.dir != manifest::lab_dir(m.subnet) {
        errors.push(format!(
            "refusing to remove {}: not a lab directory",
            m.dir.display()
        ));
        return;
    }
    let Ok(entries) = std::fs::read_dir(&m.dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name() == MANIFEST {
            continue;
        }
        let p = e.path();
        let r = if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        if let Err(e) = r {
            errors.push(format!("remove {}: {e}", p.display()));
        }
    }
    if errors.is_empty() {
        if let Err(e) = std::fs::remove_file(m.dir.join(MANIFEST)).and(std::fs::remove_dir(&m.dir))
        {
            errors.push(format!("remove {}: {e}", m.dir.display()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_names_from_the_subnet() {
        let spec = LabSpec {
            hosts: 3,
            ..LabSpec::default()
        };
        let m = plan(&spec, 17, "t".into(), "/x".into());
        assert_eq!(m.dir, PathBuf::from("/var/tmp/rb-lab-17"));
        assert_eq!(m.bridge, "rbbr17");
        let names: Vec<_> = m.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["node02", "node03", "node04"]);
        assert_eq!(m.hosts[2].address, Ipv4Addr::new(10, 77, 17, 4));
        assert_eq!(m.hosts[0].netns, "t17-node02");
        assert_eq!(m.hosts[0].veth, "rb17n02");
        assert!(m.hosts.iter().all(|h| h.veth.len() <= 15));
    }

    #[test]
    fn validates_specs() {
        assert!(validate(&LabSpec::default()).is_ok());
        let bad = |hosts, prefix: &str| LabSpec {
            hosts,
            rsh: false,
            prefix: Some(prefix.into()),
        };
        assert!(validate(&bad(0, "rb")).is_err());
        assert!(validate(&bad(201, "rb")).is_err());
        assert!(validate(&bad(2, "Rb")).is_err());
        assert!(validate(&bad(2, "r1")).is_err());
        assert!(validate(&bad(2, "abcdefghi")).is_err());
    }
}
