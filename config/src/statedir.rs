//! The checks of `broker.state_dir` that need the file system (the rest of the lab file is
//! validated without I/O in `validate`): the directory holds the broker's control socket,
//! database and logs, so another user must neither own it nor be able to write it. Run by
//! `rb-broker` at start and by `rb check` (exit 64 for both).

use crate::{error::ConfigError, LabConfig};

impl LabConfig {
    /// [`LabConfig::load`], then [`LabConfig::check_state_dir`]: what `rb-broker` needs
    /// before it starts, and what `rb check` reports.
    pub fn load_checked(path: &std::path::Path) -> Result<Self, ConfigError> {
        let lab = Self::load(path)?;
        lab.check_state_dir()?;
        Ok(lab)
    }

    /// Refuses a `broker.state_dir` that exists and is owned by someone else or writable by
    /// group or others ([`privdir::check_configured`]); a missing one is created 0700 later.
    pub fn check_state_dir(&self) -> Result<(), ConfigError> {
        let dir = &self.broker.state_dir;
        privdir::check_configured(dir).map_err(|e| {
            let (message, help) = match e.to_string().split_once("\nhelp: ") {
                Some((m, h)) => (m.to_string(), h.to_string()),
                None => (
                    e.to_string(),
                    "choose a directory of yours, mode 0700".into(),
                ),
            };
            ConfigError {
                file: self
                    .source
                    .as_ref()
                    .map_or_else(|| "<lab>".into(), |p| p.display().to_string()),
                line: None,
                column: None,
                key: Some("broker.state_dir".into()),
                message,
                help: Some(help),
                more: Vec::new(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn lab_with_state_dir(dir: &std::path::Path) -> LabConfig {
        let text = format!(
            "[broker]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\nsecret_file = \"/x/secret\"\n\n[[host]]\nname = \"node01\"\n",
            dir.display()
        );
        LabConfig::parse(&text, None).expect("a valid lab file")
    }

    #[test]
    fn a_state_dir_others_can_write_is_refused_naming_the_key() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = lab_with_state_dir(&dir)
            .check_state_dir()
            .expect_err("0777 refused");
        let text = err.to_string();
        assert!(text.contains("broker.state_dir"), "{text}");
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(text.contains("\nhelp: "), "{text}");
    }

    #[test]
    fn a_private_or_missing_state_dir_passes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        lab_with_state_dir(tmp.path())
            .check_state_dir()
            .expect("a 0700 tempdir of ours");
        lab_with_state_dir(&tmp.path().join("later"))
            .check_state_dir()
            .expect("missing: created at start");
    }
}
