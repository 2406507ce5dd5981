//! A real logind inside a lab host, for the tests and benchmarks of the owner's return on
//! today's desktops: Debian's elogind and a dbus-daemon of the host's own, on the host's
//! private /run (LAB-NOTES "Sensors inside a host"). elogind is unpacked by `test.sh` into
//! `target/lab-elogind`, not installed: Debian's elogind conflicts with the machine's
//! `systemd` package (installing it would remove systemd), and the hosts only need its
//! files. A PAM login in the host (`su -l`, whose session stack has `pam_systemd`, which
//! speaks logind's bus API to elogind as well) registers a session; with
//! `XDG_SESSION_TYPE=wayland` it is a graphical one whose owner sets its idle and lock hints
//! with logind's own calls.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::wait_until;

/// The unpacked elogind: `$RB_LAB_ELOGIND`, else `target/lab-elogind` (what `test.sh`
/// unpacks).
pub fn elogind_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RB_LAB_ELOGIND") {
        return PathBuf::from(dir);
    }
    crate::bin_dir()
        .parent()
        .unwrap_or(Path::new("."))
        .join("lab-elogind")
}

/// The system bus of a lab host: the usual socket, logind's policy, run as root (the
/// host's passwd need not have `messagebus`).
fn bus_config(elogind: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=/run/dbus/system_bus_socket</listen>
  <pidfile>/run/dbus/pid</pidfile>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Peer"/>
  </policy>
  <includedir>{}/usr/share/dbus-1/system.d</includedir>
</busconfig>
"#,
        elogind.display()
    )
}

/// Starts a system bus and elogind inside `host` (both die with the host); returns when
/// logind answers there.
pub fn start(lab: &lab::Lab, host: &str) -> Result<(), String> {
    let elogind = elogind_dir();
    let daemon = elogind.join("lib/elogind/elogind");
    if !daemon.exists() {
        return Err(format!(
            "{} is missing\nhelp: run ./test.sh (it unpacks Debian's elogind there), or \
             `apt-get download elogind && dpkg -x elogind_*.deb {}`",
            daemon.display(),
            elogind.display()
        ));
    }
    let conf = lab.dir().join(format!("{host}-system-bus.conf"));
    std::fs::write(&conf, bus_config(&elogind)).map_err(|e| format!("{}: {e}", conf.display()))?;
    let script = format!(
        "set -e; mkdir -p /run/dbus /run/systemd; \
         dbus-daemon --config-file='{conf}' --fork; \
         LD_LIBRARY_PATH='{lib}' '{daemon}' --daemon",
        conf = conf.display(),
        lib = elogind.join("lib/elogind").display(),
        daemon = daemon.display(),
    );
    let out = lab
        .exec(host, &["sh", "-c", &script])
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "starting dbus-daemon and elogind in {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let answers = wait_until(Duration::from_secs(20), || {
        let out = lab.exec(host, &list_sessions()).ok()?;
        out.status.success().then_some(())
    });
    answers.ok_or_else(|| format!("logind in {host} never answered on the system bus"))
}

fn list_sessions() -> Vec<&'static str> {
    vec![
        "dbus-send",
        "--system",
        "--print-reply",
        "--dest=org.freedesktop.login1",
        "/org/freedesktop/login1",
        "org.freedesktop.login1.Manager.ListSessions",
    ]
}

/// Makes `host`'s sshd open a PAM session for every login (`UsePAM yes`, as Debian ships
/// it), so that each ssh login — the broker's transport, a job's remote commands, a person's
/// shell — registers with logind there, and reboots the host for it. Call it before
/// [`start`] (a boot gives the host a fresh /run).
pub fn use_pam_sshd(lab: &lab::Lab, host: &str) -> Result<(), String> {
    let conf = lab
        .host_dir(host)
        .map_err(|e| e.to_string())?
        .join("sshd_config");
    let text = std::fs::read_to_string(&conf).map_err(|e| format!("{}: {e}", conf.display()))?;
    if !text.contains("UsePAM no\n") {
        return Err(format!(
            "{}: no `UsePAM no` line to turn on",
            conf.display()
        ));
    }
    std::fs::write(&conf, text.replace("UsePAM no\n", "UsePAM yes\n"))
        .map_err(|e| format!("{}: {e}", conf.display()))?;
    lab.crash(host).map_err(|e| e.to_string())?;
    lab.boot(host).map_err(|e| e.to_string())
}

/// Adds a local account `name` (uid = gid = `uid`, home in the host's /tmp) to `host`'s own
/// passwd, group and shadow (the host's overlaid /etc; the machine's stay as they are).
pub fn add_user(lab: &lab::Lab, host: &str, name: &str, uid: u32) -> Result<(), String> {
    let script = format!(
        "set -e; echo '{name}:x:{uid}:{uid}:{name}:/tmp/{name}:/bin/sh' >> /etc/passwd; \
         echo '{name}:x:{uid}:' >> /etc/group; echo '{name}:*:19000:0:99999:7:::' >> /etc/shadow; \
         mkdir -p /tmp/{name}; chown {uid}:{uid} /tmp/{name}"
    );
    let out = lab
        .exec(host, &["sh", "-c", &script])
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "adding {name} in {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Someone who logs in inside a lab host: a name and uid known there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub name: String,
    pub uid: u32,
}

impl Person {
    /// root.
    pub fn root() -> Person {
        Person {
            name: "root".into(),
            uid: 0,
        }
    }

    /// The lab user.
    pub fn lab_user(lab: &lab::Lab) -> Person {
        Person {
            name: lab.user().name.clone(),
            uid: lab.user().uid,
        }
    }
}

/// A local session registered with logind through PAM (`su -l`): a desktop (`wayland`,
/// class `user`) by default, or a greeter (class `greeter`).
pub struct DesktopSession {
    child: Child,
    /// logind's session id.
    pub id: String,
    user: Person,
}

impl DesktopSession {
    /// `su -l LABUSER` as root inside `host`, with `XDG_SESSION_TYPE=wayland` for PAM.
    pub fn open(lab: &lab::Lab, host: &str) -> Result<DesktopSession, String> {
        DesktopSession::open_as(lab, host, &Person::lab_user(lab), "user")
    }

    /// `su -l USER` as root inside `host`, with `XDG_SESSION_TYPE=wayland` and
    /// `XDG_SESSION_CLASS=class` for PAM.
    pub fn open_as(
        lab: &lab::Lab,
        host: &str,
        user: &Person,
        class: &str,
    ) -> Result<DesktopSession, String> {
        let name = &user.name;
        let mark = format!(
            "/tmp/rb-desktop-session-{}-{name}-{class}",
            std::process::id()
        );
        let body =
            format!("echo $XDG_SESSION_ID > {mark}.new && mv {mark}.new {mark}; exec sleep 100000");
        let class_var = format!("XDG_SESSION_CLASS={class}");
        let argv = [
            "env",
            "XDG_SESSION_TYPE=wayland",
            &class_var,
            "su",
            "-l",
            name,
            "-s",
            "/bin/sh",
            "-c",
            &body,
        ];
        let _ = lab.exec(host, &["rm", "-f", &mark]);
        let child = lab.spawn(host, &argv, false).map_err(|e| e.to_string())?;
        let id = wait_until(Duration::from_secs(20), || {
            let out = lab.exec(host, &["cat", &mark]).ok()?;
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!id.is_empty()).then_some(id)
        });
        let id = id.ok_or_else(|| format!("no logind session for {name} in {host}"))?;
        Ok(DesktopSession {
            child,
            id,
            user: user.clone(),
        })
    }

    /// The session's idle hint, set by its owner with logind's own call.
    pub fn set_idle(&self, lab: &lab::Lab, host: &str, idle: bool) -> Result<(), String> {
        self.call(lab, host, "SetIdleHint", idle)
    }

    /// The session's lock hint, set by its owner.
    pub fn set_locked(&self, lab: &lab::Lab, host: &str, locked: bool) -> Result<(), String> {
        self.call(lab, host, "SetLockedHint", locked)
    }

    fn call(&self, lab: &lab::Lab, host: &str, method: &str, on: bool) -> Result<(), String> {
        let path = format!("/org/freedesktop/login1/session/{}", self.id);
        let method = format!("org.freedesktop.login1.Session.{method}");
        let arg = format!("boolean:{on}");
        let argv = [
            "dbus-send",
            "--system",
            "--print-reply",
            "--dest=org.freedesktop.login1",
            &path,
            &method,
            &arg,
        ];
        let uid = self.user.uid.to_string();
        let as_user = [
            &[
                "setpriv",
                "--reuid",
                &uid,
                "--regid",
                &uid,
                "--clear-groups",
                "--",
            ][..],
            &argv[..],
        ]
        .concat();
        let out = lab.exec(host, &as_user).map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{method} {on} on session {}: {}",
                self.id,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Ends the session (its `su` and shell).
    pub fn close(mut self, lab: &lab::Lab) {
        let _ = lab.kill_spawned(&mut self.child);
    }
}

/// An interactive ssh login (with a pty, so a session with a terminal) from the root
/// namespace into a host, whose person keeps typing: a line every half second, which the
/// remote `cat` reads from the pty (the kernel then updates the pty's access time, in steps
/// of 8 s).
pub struct RemoteLogin {
    child: Child,
    typing: Arc<AtomicBool>,
    typist: Option<std::thread::JoinHandle<()>>,
}

impl RemoteLogin {
    /// `ssh -tt HOST 'cat > /dev/null'` as root (`as_user` false) or as the lab user.
    pub fn open(lab: &lab::Lab, host: &str, as_user: bool) -> Result<RemoteLogin, String> {
        let mut c = lab.ssh(host, as_user).map_err(|e| e.to_string())?;
        c.args(["-tt", "cat > /dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().map_err(|e| format!("ssh -tt {host}: {e}"))?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| "ssh without stdin".to_string())?;
        let typing = Arc::new(AtomicBool::new(true));
        let on = typing.clone();
        let typist = std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                if stdin.write_all(b"typing\n").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Ok(RemoteLogin {
            child,
            typing,
            typist: Some(typist),
        })
    }

    /// Ends the login (the ssh client, so its session ends too).
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.typing.store(false, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.typist.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RemoteLogin {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The paper policy with away time `away_s` seconds (the shipped one waits 5 minutes), so
/// that an owner's absence and return take seconds in a test or a benchmark: a private
/// host goes to an adaptive job while `host.owner_idle_s` is known and at least the away
/// time, and the job vacates when it drops below.
pub fn away_policy(away_s: u64) -> String {
    format!(
        "start = '!host.private || (job.adaptive && owner_away)'\n\
         vacate = 'host.private && job.adaptive && owner_back'\n\
         [let]\n\
         owner_away = 'host.owner_idle_s != null && host.owner_idle_s >= {away_s}'\n\
         owner_back = 'host.owner_idle_s != null && host.owner_idle_s < {away_s}'\n"
    )
}
