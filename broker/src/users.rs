//! The users with a credential (`rb user add|list|revoke`): a pure [`UserBook`] (name → key,
//! created, last seen) and [`Users`], its shared, file-backed shell that the listeners ask
//! for keys and that drops a revoked user's connections ([`Revocation`]).
//!
//! The book lives in `STATE_DIR/users.json` (mode 0600, replaced atomically), separate from
//! `broker.db` so that it survives a reset of the job state. It holds each user's HMAC key
//! (the handshake needs the key itself, not a hash of it); the state dir is the owner's
//! alone ([`privdir::check_configured`]). A new credential file goes to
//! `STATE_DIR/credentials/NAME` (a private directory) or where `--out` says, created with
//! `O_EXCL|O_NOFOLLOW`, mode 0600.

use std::{
    collections::BTreeMap,
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use proto::{
    auth::Secret,
    credential::{valid_user_name, write_new_private, Credential},
    handshake::UserKeys,
    msg::UserInfo,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::authz::Actor;

/// How stale a persisted "last seen" may get before an authentication rewrites the file.
const LAST_SEEN_SLACK_S: i64 = 60;

/// One user's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserRecord {
    pub key: String,
    pub created_unix: i64,
    pub last_seen_unix: Option<i64>,
}

/// Why a user request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    #[error("`{0}` is not a valid user name\nhelp: 1–32 of A-Z a-z 0-9 . _ - (not starting with - or .)")]
    BadName(String),
    #[error(
        "user `{0}` already has a credential\nhelp: `rb user revoke {0}` first to issue a new one"
    )]
    Exists(String),
    #[error("`{0}` is the broker's owner, who uses the lab secret\nhelp: pick another name for the credential")]
    Owner(String),
    #[error("no user `{0}`\nhelp: `rb user list` shows the users")]
    Unknown(String),
    #[error("{0}")]
    Io(String),
}

/// The book: pure, every time passed in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserBook {
    users: BTreeMap<String, UserRecord>,
}

impl UserBook {
    /// Adds `name` with `key` (hex); `owner` (the broker's owner's login) is refused.
    pub fn add(&mut self, name: &str, key: &str, owner: &str, now: i64) -> Result<(), UserError> {
        if !valid_user_name(name) {
            return Err(UserError::BadName(name.into()));
        }
        if name == owner {
            return Err(UserError::Owner(name.into()));
        }
        if self.users.contains_key(name) {
            return Err(UserError::Exists(name.into()));
        }
        let record = UserRecord {
            key: key.into(),
            created_unix: now,
            last_seen_unix: None,
        };
        self.users.insert(name.into(), record);
        Ok(())
    }

    /// Removes `name`.
    pub fn revoke(&mut self, name: &str) -> Result<(), UserError> {
        self.users
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| UserError::Unknown(name.into()))
    }

    /// The key of `name`, if they have a credential.
    pub fn key(&self, name: &str) -> Option<Secret> {
        let record = self.users.get(name)?;
        Credential::from_parts(name, &record.key).map(|c| c.key().clone())
    }

    /// Records that `name` authenticated at `now`; true when the stored time is more than
    /// `LAST_SEEN_SLACK_S` old (worth saving).
    pub fn seen(&mut self, name: &str, now: i64) -> bool {
        let Some(record) = self.users.get_mut(name) else {
            return false;
        };
        let stale = !matches!(record.last_seen_unix, Some(t) if now - t <= LAST_SEEN_SLACK_S);
        record.last_seen_unix = Some(now);
        stale
    }

    /// Every user, by name.
    pub fn list(&self) -> Vec<UserInfo> {
        self.users
            .iter()
            .map(|(name, r)| UserInfo {
                name: name.clone(),
                created_unix: r.created_unix,
                last_seen_unix: r.last_seen_unix,
            })
            .collect()
    }
}

/// The book shared by the listeners, saved in the state dir.
pub struct Users {
    book: Mutex<UserBook>,
    state_dir: PathBuf,
    owner: String,
    revoked: broadcast::Sender<String>,
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Users {
    /// Loads `STATE_DIR/users.json` (none: no users); `owner` is the broker owner's login.
    pub fn load(state_dir: &Path, owner: &str) -> anyhow::Result<Self> {
        let path = book_path(state_dir);
        let book = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e}\nhelp: fix or remove the file (its users lose their credentials)",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => UserBook::default(),
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        Ok(Self {
            book: Mutex::new(book),
            state_dir: state_dir.to_path_buf(),
            owner: owner.to_string(),
            revoked: broadcast::channel(16).0,
        })
    }

    /// The names of users revoked from now on, for connections to watch.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.revoked.subscribe()
    }

    fn with_book<T>(&self, f: impl FnOnce(&mut UserBook) -> T) -> T {
        let mut guard = self.book.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// `rb user add NAME [--out FILE]`: records the user, writes the credential file and
    /// returns its path. Nothing is kept when the file cannot be written. The book stays
    /// locked throughout (no await here), so two adds of one name cannot both succeed.
    pub fn add(&self, name: &str, out: Option<&str>) -> Result<PathBuf, UserError> {
        let io = |e: std::io::Error| UserError::Io(e.to_string());
        let cred = Credential::generate(name)
            .map_err(io)?
            .ok_or_else(|| UserError::BadName(name.into()))?;
        self.with_book(|live| {
            let mut book = live.clone();
            book.add(name, &cred.key_hex(), &self.owner, now_unix())?;
            let path = self.credential_path(name, out)?;
            write_new_private(&path, &cred.file_contents()).map_err(|e| {
                UserError::Io(format!(
                    "cannot create {}: {e}\nhelp: the file must not exist yet; choose another --out",
                    path.display()
                ))
            })?;
            if let Err(e) = save(&self.state_dir, &book) {
                let _ = std::fs::remove_file(&path);
                return Err(UserError::Io(e.to_string()));
            }
            *live = book;
            Ok(path)
        })
    }

    fn credential_path(&self, name: &str, out: Option<&str>) -> Result<PathBuf, UserError> {
        match out {
            Some(out) if Path::new(out).is_absolute() => Ok(PathBuf::from(out)),
            Some(out) => Err(UserError::Io(format!(
                "--out {out} is not an absolute path on the broker's machine"
            ))),
            None => {
                let dir = self.state_dir.join("credentials");
                privdir::ensure_dir(&dir).map_err(|e| UserError::Io(e.to_string()))?;
                Ok(dir.join(name))
            }
        }
    }

    /// `rb user revoke NAME`: forgets the user and drops their connections.
    pub fn revoke(&self, name: &str) -> Result<(), UserError> {
        self.with_book(|live| {
            let mut book = live.clone();
            book.revoke(name)?;
            save(&self.state_dir, &book).map_err(|e| UserError::Io(e.to_string()))?;
            *live = book;
            Ok::<(), UserError>(())
        })?;
        let _ = self.revoked.send(name.to_string());
        // The default credential file goes too: it opens nothing any more.
        let _ = std::fs::remove_file(self.state_dir.join("credentials").join(name));
        Ok(())
    }

    pub fn list(&self) -> Vec<UserInfo> {
        self.with_book(|b| b.list())
    }

    /// Whether `name` still has a credential (a connection re-checks after subscribing).
    pub fn exists(&self, name: &str) -> bool {
        self.with_book(|b| b.key(name).is_some())
    }

    /// Records a successful authentication of `name`.
    pub fn seen(&self, name: &str) {
        let snapshot = self.with_book(|b| b.seen(name, now_unix()).then(|| b.clone()));
        if let Some(book) = snapshot {
            if let Err(e) = save(&self.state_dir, &book) {
                tracing::warn!(error = %e, "cannot save the user book");
            }
        }
    }
}

impl UserKeys for Users {
    fn key_of(&self, user: &str) -> Option<Secret> {
        self.with_book(|b| b.key(user))
    }
}

fn book_path(state_dir: &Path) -> PathBuf {
    state_dir.join("users.json")
}

/// Replaces the book file atomically (a 0600 temporary file, then rename).
fn save(state_dir: &Path, book: &UserBook) -> std::io::Result<()> {
    let path = book_path(state_dir);
    let tmp = state_dir.join("users.json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(&serde_json::to_vec_pretty(book).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)
}

/// Ends a user's connection when their credential is revoked (never fires for the owner).
pub struct Revocation {
    user: Option<String>,
    rx: Option<broadcast::Receiver<String>>,
    /// Revoked between the handshake and the subscription.
    already: bool,
}

impl Revocation {
    pub fn watch(users: &Users, actor: &Actor) -> Self {
        let Actor::User(user) = actor else {
            return Self {
                user: None,
                rx: None,
                already: false,
            };
        };
        let rx = users.subscribe();
        Self {
            already: !users.exists(user),
            user: Some(user.clone()),
            rx: Some(rx),
        }
    }

    /// Resolves when this connection's user is revoked.
    pub async fn revoked(&mut self) {
        if self.already {
            return;
        }
        let (Some(user), Some(rx)) = (&self.user, self.rx.as_mut()) else {
            return std::future::pending().await;
        };
        loop {
            match rx.recv().await {
                Ok(name) if name == *user => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
            }
        }
    }
}

/// What a revoked user's connection is told before it is dropped.
pub fn revoked_message(actor: &Actor) -> String {
    format!(
        "the credential of user `{}` was revoked; connection closed",
        actor.name("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn the_book_adds_refuses_duplicates_and_the_owner_and_revokes() {
        let mut book = UserBook::default();
        book.add("bob", KEY, "root", 100).expect("added");
        assert_eq!(
            book.add("bob", KEY, "root", 101),
            Err(UserError::Exists("bob".into()))
        );
        assert_eq!(
            book.add("root", KEY, "root", 1),
            Err(UserError::Owner("root".into()))
        );
        assert_eq!(
            book.add("a b", KEY, "root", 1),
            Err(UserError::BadName("a b".into()))
        );
        assert!(book.key("bob").is_some());
        book.revoke("bob").expect("revoked");
        assert!(book.key("bob").is_none());
        assert_eq!(book.revoke("bob"), Err(UserError::Unknown("bob".into())));
    }

    #[test]
    fn last_seen_is_saved_only_when_stale() {
        let mut book = UserBook::default();
        book.add("bob", KEY, "root", 100).expect("added");
        assert!(book.seen("bob", 200), "never seen: save");
        assert!(!book.seen("bob", 230), "30 s later: not worth a write");
        assert!(book.seen("bob", 300));
        assert!(!book.seen("eve", 300), "unknown user");
        assert_eq!(book.list()[0].last_seen_unix, Some(300));
        assert_eq!(book.list()[0].created_unix, 100);
    }

    #[test]
    fn users_write_private_credentials_and_survive_a_reload() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let users = Users::load(dir.path(), "root").expect("load");
        let path = users.add("bob", None).expect("add");
        assert_eq!(path, dir.path().join("credentials/bob"));
        assert_eq!(
            std::fs::metadata(&path).expect("stat").mode() & 0o777,
            0o600
        );
        let cred = Credential::load(&path).expect("a valid credential");
        assert_eq!(
            users.key_of("bob").map(|k| k.same_key(cred.key())),
            Some(true)
        );
        let out = dir.path().join("bob.cred");
        let err = users
            .add("eve", Some(path.to_str().expect("utf-8")))
            .expect_err("exists");
        assert!(err.to_string().contains("must not exist"), "{err}");
        assert!(
            !users.exists("eve"),
            "nothing kept when the file cannot be written"
        );
        users
            .add("eve", Some(out.to_str().expect("utf-8")))
            .expect("--out");
        let again = Users::load(dir.path(), "root").expect("reload");
        assert_eq!(again.list().len(), 2);
        let mut revoked = again.subscribe();
        again.revoke("bob").expect("revoke");
        assert_eq!(revoked.try_recv().expect("told"), "bob");
        assert!(!path.exists(), "its default credential file is gone");
        assert!(Users::load(dir.path(), "root")
            .expect("reload")
            .key_of("bob")
            .is_none());
    }
}
