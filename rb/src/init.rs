//! `rb init`: the lab secret and an example lab file, without overwriting either unless
//! asked to.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// What `rb init` did.
#[derive(Debug)]
pub struct InitOutcome {
    pub secret: PathBuf,
    pub secret_created: bool,
    pub lab: PathBuf,
    pub lab_created: bool,
}

/// Creates the secret and the lab file if they are missing (or `force`).
pub fn init(secret: &Path, lab: &Path, force: bool) -> anyhow::Result<InitOutcome> {
    let secret_created = force || !secret.exists();
    if secret_created {
        proto::auth::write_new_secret(secret, force)
            .with_context(|| format!("cannot write {}", secret.display()))?;
    }
    let lab_created = force || !lab.exists();
    if lab_created {
        if let Some(dir) = lab.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            // ~/.config/rb also holds the secret: new directories are this user's only.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        std::fs::write(lab, example_lab(secret, current_user().as_deref()))
            .with_context(|| format!("cannot write {}", lab.display()))?;
    }
    Ok(InitOutcome {
        secret: secret.to_path_buf(),
        secret_created,
        lab: lab.to_path_buf(),
        lab_created,
    })
}

/// This user's name: `$USER`, else the password database's, else none.
fn current_user() -> Option<String> {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
}

/// An example lab file: four virtual hosts on this machine, with the real-network shape
/// commented beside it. The broker listens on port 0 (any free port: two users of one
/// machine never collide); the private host is `user`'s, and without a user name there is
/// no private host (the `owner` line stays a comment).
pub fn example_lab(secret: &Path, user: Option<&str>) -> String {
    let uid = nix::unistd::getuid();
    let state_dir = match user {
        Some(u) => format!("/var/tmp/rb-{u}"),
        None => format!("/var/tmp/rb-{uid}"),
    };
    let owner = match user {
        Some(u) => {
            format!("owner = \"{u}\"                    # a private machine: its owner comes first")
        }
        None => {
            "# owner = \"alice\"                # a private machine: its owner comes first".into()
        }
    };
    format!(
        r#"# ResourceBroker lab file. Check it with `rb check`, run it with `rb-broker --lab FILE`.
[broker]
listen = "127.0.0.1:0"             # where host daemons, agents and rb connect (port 0: any free port)
transport = "local"                # ssh | rsh | local (virtual hosts on this machine) | manual
state_dir = "{state_dir}"   # database, sockets, logs
secret_file = "{secret}"
# report_interval_s = 2
# down_after_s = 6                 # silence after which a host is down and its daemon restarted
# hostd_path: default the rb-hostd next to rb-broker (/usr/bin with the Debian package): the
#   programs must be installed at the same paths on every host, and on the users' PATH there
# ssh_command = ["ssh", "-F", "/path/to/ssh_config"]

[[host]]
name = "vhost01"
labels = ["public"]

[[host]]
name = "vhost02"
labels = ["public"]

[[host]]
name = "vhost03"
labels = ["public"]

[[host]]
name = "vhost04"
{owner}

# A real lab uses transport = "ssh", listen = "<an address the hosts reach>:7700" and one
# entry per machine:
# [[host]]
# name = "node02"
# address = "10.77.0.2"            # optional, defaults to the name
# labels = ["public"]
"#,
        secret = secret.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_lab_is_valid_and_init_does_not_clobber() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("rb/secret");
        let lab = dir.path().join("rb/lab.toml");
        let first = init(&secret, &lab, false).expect("init");
        assert!(first.secret_created && first.lab_created);
        let cfg = config::LabConfig::load(&lab).expect("example lab must validate");
        assert_eq!(cfg.hosts.len(), 4);
        proto::auth::Secret::load(&secret).expect("secret must load");
        let before = std::fs::read(&secret).expect("read");
        let second = init(&secret, &lab, false).expect("init again");
        assert!(!second.secret_created && !second.lab_created);
        assert_eq!(std::fs::read(&secret).expect("read"), before);
    }

    #[test]
    fn example_lab_listens_on_any_free_port_and_has_no_made_up_owner() {
        let secret = Path::new("/home/alice/.config/rb/secret");
        let parse = |text: String| config::LabConfig::parse(&text, None).expect("valid");
        let lab = parse(example_lab(secret, None));
        assert_eq!(lab.broker.listen, "127.0.0.1:0".parse().expect("addr"));
        assert!(lab.hosts.iter().all(|h| h.owner.is_none()), "{lab:?}");
        assert!(!example_lab(secret, None).contains("\"me\""));
        let lab = parse(example_lab(secret, Some("alice")));
        assert_eq!(lab.hosts[3].owner.as_deref(), Some("alice"));
        assert_eq!(lab.broker.state_dir, Path::new("/var/tmp/rb-alice"));
    }
}
