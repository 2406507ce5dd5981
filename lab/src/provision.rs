//! The files of a lab: ssh keys, the lab user's home, the per-host `/etc` layer, the
//! per-host sshd and inetd configs, and the ssh client config for the root namespace.
//! Nothing outside the lab directory is touched: not `/etc`, not `/root/.ssh`, not any
//! real home.
//!
//! # A host's /etc
//! Each host sees the machine's `/etc` with its own files on top: `hosts`, `hostname`,
//! `resolv.conf`, `nsswitch.conf`, and `passwd`/`group`/`shadow` (the machine's as they
//! were at `rb lab up`, plus the lab user). `rb-lab-init` mounts an overlay on the host's
//! `/etc` (`lowerdir=/etc`, `upperdir=hosts/<name>/etc`, `workdir=hosts/<name>/etc-work`),
//! so what a host writes to its /etc stays on that host. Where the lab directory cannot be
//! an upper layer (it is itself on an overlayfs, as in many containers) the host's /etc is
//! read-only instead, with `hosts/<name>/etc` as the top lower layer.
//!
//! Not bind mounts of single files (`/etc/netns/<netns>/*`, which `ip netns exec` mounts over
//! `/etc/*`, as earlier versions did): a bind mount sits on the machine's file itself, and
//! when something on the machine replaces that file by rename — `useradd`, `passwd`,
//! `vipw`, any editor — the kernel detaches every mount on the old file in every namespace,
//! so the hosts silently fell back to the machine's passwd without the lab user
//! (`setpriv: uid 4242 not found`, refused ssh logins). The overlay is mounted on the `/etc`
//! directory, which nobody replaces, and our files are in its own layer; changes to the
//! machine's `/etc` show through for the files a host does not have. (Re-mounting on use
//! was the other choice, but sshd inside a host reads passwd at every login, with nothing
//! of ours in between.)
//!
//! Lab directory layout (`/var/tmp/rb-lab-S/`):
//! ```text
//! manifest.json            what exists, for teardown and `attach`
//! ssh_config               client config for the root namespace (`ssh -F … node02`)
//! keys/                    ssh_host_ed25519_key (all hosts), root_ed25519 (root's client key)
//! authorized_keys/<user>   AuthorizedKeysFile of every host's sshd
//! home/<user>/             the lab user's home, shared by all hosts like an NFS home
//! hosts/<name>/            sshd_config, inetd.conf, console.log, sshd.log and the host's
//!                          private tmp/ (its /tmp), run/ (its /run) and log/ (its /var/log)
//! hosts/<name>/etc/        the host's own /etc files (upper layer of its /etc overlay)
//! hosts/<name>/etc-work/   the overlay's work directory
//! ```

use std::fmt::Write as _;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd;
use crate::manifest::{HostRecord, Manifest, UserRecord};
use crate::LabError;

/// Name of the lab user unless the machine already has one of that name.
pub const USER_NAME: &str = "rblab";
/// Preferred uid and gid of the lab user.
pub const USER_ID: u32 = 4242;

/// sshd path; the same binary on every host.
pub(crate) const SSHD: &str = "/usr/sbin/sshd";
/// openbsd-inetd's binary (Debian package openbsd-inetd).
pub(crate) const INETD: &str = "/usr/sbin/inetd";
/// netkit rshd (Debian package rsh-server).
pub(crate) const RSHD: &str = "/usr/sbin/in.rshd";

const HELP_WRITE: &str = "is /var/tmp writable and not full?";

/// Writes `text` to `path` with `mode`.
pub(crate) fn write(path: &Path, text: &str, mode: u32) -> Result<(), LabError> {
    std::fs::write(path, text).map_err(LabError::io("write", path, HELP_WRITE))?;
    set_mode(path, mode)
}

/// Sets the permission bits of `path`.
pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<(), LabError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(LabError::io("chmod", path, HELP_WRITE))
}

/// Creates `path` and its parents, then sets its mode.
pub(crate) fn mkdir(path: &Path, mode: u32) -> Result<(), LabError> {
    std::fs::create_dir_all(path).map_err(LabError::io("create directory", path, HELP_WRITE))?;
    set_mode(path, mode)
}

fn own(path: &Path, u: &UserRecord) -> Result<(), LabError> {
    chown(path, Some(u.uid), Some(u.gid)).map_err(LabError::io("chown", path, HELP_WRITE))
}

/// Path of the shared host key.
pub(crate) fn host_key(m: &Manifest) -> PathBuf {
    m.dir.join("keys/ssh_host_ed25519_key")
}

/// Path of root's client key.
pub(crate) fn root_key(m: &Manifest) -> PathBuf {
    m.dir.join("keys/root_ed25519")
}

/// Path of the lab user's client key (in the lab home).
pub(crate) fn user_key(m: &Manifest) -> PathBuf {
    m.user.home.join(".ssh/id_ed25519")
}

/// Picks the lab user's name and uid/gid: [`USER_NAME`] and [`USER_ID`] unless the machine
/// already uses them, then the next free id.
pub(crate) fn choose_user(dir: &Path) -> UserRecord {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let ids = |text: &str| -> Vec<u32> {
        text.lines()
            .filter_map(|l| l.split(':').nth(2)?.parse().ok())
            .collect()
    };
    let (uids, gids) = (ids(&passwd), ids(&group));
    let id = (USER_ID..u32::MAX)
        .find(|id| !uids.contains(id) && !gids.contains(id))
        .unwrap_or(USER_ID);
    let taken = |text: &str| text.lines().any(|l| l.split(':').next() == Some(USER_NAME));
    let name = if taken(&passwd) || taken(&group) {
        format!("{USER_NAME}{id}")
    } else {
        USER_NAME.to_string()
    };
    UserRecord {
        home: dir.join("home").join(&name),
        name,
        uid: id,
        gid: id,
    }
}

/// Generates the host key, root's key and the user's key (three `ssh-keygen` in parallel).
pub(crate) fn generate_keys(m: &Manifest) -> Result<(), LabError> {
    mkdir(&m.dir.join("keys"), 0o755)?;
    mkdir(&m.user.home.join(".ssh"), 0o700)?;
    let jobs = [
        (host_key(m), "rb-lab host key"),
        (root_key(m), "rb-lab root"),
        (user_key(m), "rb-lab user"),
    ];
    let help = "install openssh-client (ssh-keygen)";
    let mut running = Vec::new();
    for (path, comment) in &jobs {
        let mut c = Command::new("ssh-keygen");
        c.args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(path);
        let child = c.spawn().map_err(|source| LabError::Spawn {
            command: cmd::describe(&c),
            source,
            help: help.into(),
        })?;
        running.push((c, child));
    }
    for (c, child) in running {
        let out = child.wait_with_output().map_err(|source| LabError::Spawn {
            command: cmd::describe(&c),
            source,
            help: help.into(),
        })?;
        if !out.status.success() {
            return Err(cmd::failed(&c, &out, help));
        }
    }
    Ok(())
}

/// Public half of a key pair, as one line.
fn public_key(private: &Path) -> Result<String, LabError> {
    let path = private.with_extension("pub");
    let path = if path.exists() {
        path
    } else {
        PathBuf::from(format!("{}.pub", private.display()))
    };
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(LabError::io(
            "read",
            path,
            "ssh-keygen should have written it",
        ))
}

/// Writes `authorized_keys/<user>` (read by sshd as that user) and the lab user's home:
/// empty `.bashrc`, `.rhosts` listing every host, `.ssh/{authorized_keys,config}`.
pub(crate) fn write_user_files(m: &Manifest) -> Result<(), LabError> {
    let u = &m.user;
    let auth = m.dir.join("authorized_keys");
    mkdir(&auth, 0o755)?;
    let user_pub = public_key(&user_key(m))?;
    write(
        &auth.join("root"),
        &(public_key(&root_key(m))? + "\n"),
        0o644,
    )?;
    write(&auth.join(&u.name), &format!("{user_pub}\n"), 0o644)?;

    let ssh = u.home.join(".ssh");
    write(
        &ssh.join("authorized_keys"),
        &format!("{user_pub}\n"),
        0o600,
    )?;
    let mut config = String::from(
        "# Written by the rb lab harness: no host key prompts inside the lab.\nHost *\n",
    );
    config += &client_options("    ");
    write(&ssh.join("config"), &config, 0o600)?;
    write(&u.home.join(".bashrc"), "", 0o644)?;
    let rhosts: String = m
        .hosts
        .iter()
        .map(|h| format!("{} {}\n", h.name, u.name))
        .collect();
    write(&u.home.join(".rhosts"), &rhosts, 0o600)?;
    for path in [
        u.home.clone(),
        ssh.clone(),
        ssh.join("authorized_keys"),
        ssh.join("config"),
        ssh.join("id_ed25519"),
        ssh.join("id_ed25519.pub"),
        u.home.join(".bashrc"),
        u.home.join(".rhosts"),
    ] {
        own(&path, u)?;
    }
    set_mode(&u.home, 0o755)
}

/// The ssh client options every lab client uses, one per line, each line indented.
fn client_options(indent: &str) -> String {
    [
        "StrictHostKeyChecking no",
        "UserKnownHostsFile /dev/null",
        "LogLevel ERROR",
        "BatchMode yes",
        "KexAlgorithms curve25519-sha256",
        "ConnectTimeout 3",
    ]
    .iter()
    .map(|o| format!("{indent}{o}\n"))
    .collect()
}

/// Writes `ssh_config` for the root namespace: one `Host` per lab host with its address,
/// so lab names are never resolved outside the lab.
pub(crate) fn write_ssh_config(m: &Manifest) -> Result<PathBuf, LabError> {
    let mut text = format!(
        "# rb lab {}: use as `ssh -F {} node02`\n",
        m.dir.display(),
        m.dir.join("ssh_config").display()
    );
    for h in &m.hosts {
        let _ = writeln!(text, "Host {}\n    HostName {}", h.name, h.address);
    }
    let _ = writeln!(
        text,
        "Host *\n    IdentityFile {}\n    IdentitiesOnly yes",
        root_key(m).display()
    );
    text += &client_options("    ");
    let path = m.dir.join("ssh_config");
    write(&path, &text, 0o644)?;
    Ok(path)
}

/// Writes every host's /etc layer (`hosts/<name>/etc/`, see the module docs): hosts,
/// hostname, resolv.conf, nsswitch.conf, and passwd/group/shadow (the machine's plus the
/// lab user), and creates the overlay's empty work directory next to it.
pub(crate) fn write_overlays(m: &Manifest) -> Result<(), LabError> {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_err(LabError::io(
            "read",
            p,
            "the lab copies it into each host",
        ))
    };
    let u = &m.user;
    let passwd = format!(
        "{}{}:x:{}:{}:rb lab user:{}:/bin/bash\n",
        read("/etc/passwd")?,
        u.name,
        u.uid,
        u.gid,
        u.home.display()
    );
    let group = format!("{}{}:x:{}:\n", read("/etc/group")?, u.name, u.gid);
    let shadow = format!(
        "{}{}:*:19000:0:99999:7:::\n",
        unlock_shadow(&read("/etc/shadow")?),
        u.name
    );
    let mut hosts =
        String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    let _ = writeln!(hosts, "{}\tnode01 gateway", m.gateway());
    for h in &m.hosts {
        let _ = writeln!(hosts, "{}\t{}", h.address, h.name);
    }
    let nsswitch = "passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files\nnetworks: files\nprotocols: db files\nservices: db files\nethers: db files\nrpc: db files\nnetgroup: files\n";
    for h in &m.hosts {
        let dir = etc_layer(m, &h.name);
        mkdir(&dir, 0o755)?;
        mkdir(&etc_work(m, &h.name), 0o700)?;
        write(&dir.join("hosts"), &hosts, 0o644)?;
        write(&dir.join("hostname"), &format!("{}\n", h.name), 0o644)?;
        write(&dir.join("resolv.conf"), "nameserver 127.0.0.1\n", 0o644)?;
        write(&dir.join("nsswitch.conf"), nsswitch, 0o644)?;
        write(&dir.join("passwd"), &passwd, 0o644)?;
        write(&dir.join("group"), &group, 0o644)?;
        write(&dir.join("shadow"), &shadow, 0o640)?;
    }
    Ok(())
}

/// A host's own /etc files, the upper layer of its /etc overlay.
pub(crate) fn etc_layer(m: &Manifest, host: &str) -> PathBuf {
    m.host_dir(host).join(ETC_LAYER)
}

/// The work directory of a host's /etc overlay.
pub(crate) fn etc_work(m: &Manifest, host: &str) -> PathBuf {
    m.host_dir(host).join(ETC_WORK)
}

/// Names of [`etc_layer`] and [`etc_work`] in the host directory (`rb-lab-init` finds them
/// there through `--state`).
pub(crate) const ETC_LAYER: &str = "etc";
pub(crate) const ETC_WORK: &str = "etc-work";

/// `/etc/netns/<netns>` of a host: where labs of earlier versions kept the host's /etc files
/// (see the module docs). Only teardown still looks there, for labs made by those versions.
pub(crate) fn etc_netns(h: &HostRecord) -> PathBuf {
    Path::new("/etc/netns").join(&h.netns)
}

/// Replaces a locked password (`!…`) by `*`: with `UsePAM no`, sshd refuses key logins to
/// locked accounts, and root must be able to log in with its lab key.
fn unlock_shadow(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut f: Vec<&str> = line.split(':').collect();
            if f.len() > 1 && f[1].starts_with('!') {
                f[1] = "*";
            }
            f.join(":") + "\n"
        })
        .collect()
}

/// Writes `hosts/<name>/` for every host: sshd_config, inetd.conf, and the directories
/// that become the host's /tmp, /run and /var/log.
pub(crate) fn write_host_files(m: &Manifest) -> Result<(), LabError> {
    for h in &m.hosts {
        let dir = m.host_dir(&h.name);
        mkdir(&dir, 0o755)?;
        write(&dir.join("sshd_config"), &sshd_config(m), 0o644)?;
        write(
            &dir.join("inetd.conf"),
            &format!("shell stream tcp nowait.1000 root {RSHD} in.rshd\n"),
            0o644,
        )?;
    }
    Ok(())
}

fn sshd_config(m: &Manifest) -> String {
    format!(
        "# rb lab host sshd\n\
         ListenAddress 0.0.0.0\n\
         HostKey {}\n\
         PidFile none\n\
         PermitRootLogin prohibit-password\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         UsePAM no\n\
         UseDNS no\n\
         PrintMotd no\n\
         PrintLastLog no\n\
         StrictModes no\n\
         AuthorizedKeysFile {}/%u\n\
         AcceptEnv LANG LC_* PVM_* LAM* RB_*\n\
         MaxStartups 200:30:400\n\
         MaxSessions 100\n\
         Subsystem sftp internal-sftp\n",
        host_key(m).display(),
        m.dir.join("authorized_keys").display()
    )
}

/// Empties the host's /tmp, /run and /var/log sources, as a reboot would, and creates
/// the files its daemons expect there (`/run/utmp`, `/var/log/{wtmp,btmp,lastlog}`).
pub(crate) fn reset_host_runtime(m: &Manifest, h: &HostRecord) -> Result<(), LabError> {
    let dir = m.host_dir(&h.name);
    for sub in ["tmp", "run", "log"] {
        let p = dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(LabError::io("remove", &p, HELP_WRITE))?;
        }
    }
    mkdir(&dir.join("tmp"), 0o1777)?;
    mkdir(&dir.join("run"), 0o755)?;
    mkdir(&dir.join("log"), 0o755)?;
    write(&dir.join("run/utmp"), "", 0o664)?;
    for f in ["wtmp", "btmp", "lastlog"] {
        write(&dir.join("log").join(f), "", 0o664)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlocks_only_locked_passwords() {
        let text = "root:!:19000:0:99999:7:::\nbob:$y$hash:19000::::::\nsshd:*:19000::::::\n";
        assert_eq!(
            unlock_shadow(text),
            "root:*:19000:0:99999:7:::\nbob:$y$hash:19000::::::\nsshd:*:19000::::::\n"
        );
    }

    #[test]
    fn client_options_include_batch_mode_and_fast_kex() {
        let o = client_options("  ");
        assert!(o.contains("  BatchMode yes\n"));
        assert!(o.contains("KexAlgorithms curve25519-sha256"));
    }
}
