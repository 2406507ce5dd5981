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
        std::fs::write(lab, example_lab(secret))
            .with_context(|| format!("cannot write {}", lab.display()))?;
    }
    Ok(InitOutcome {
        secret: secret.to_path_buf(),
        secret_created,
        lab: lab.to_path_buf(),
        lab_created,
    })
}

/// An example lab file: four virtual hosts on this machine, with the real-network shape
/// commented beside it.
pub fn example_lab(secret: &Path) -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "me".into());
    format!(
        r#"# ResourceBroker lab file. Check it with `rb check`, run it with `rb-broker --lab FILE`.
[broker]
listen = "127.0.0.1:7700"          # where host daemons, agents and rb connect
transport = "local"                # ssh | rsh | local (virtual hosts on this machine) | manual
state_dir = "/var/tmp/rb-{user}"   # database, sockets, logs
secret_file = "{secret}"
# report_interval_s = 2
# down_after_s = 6                 # silence after which a host is down and its daemon restarted
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
owner = "{user}"                    # a private machine: its owner comes first

# A real lab uses transport = "ssh" and one entry per machine:
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
}
