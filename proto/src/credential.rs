//! Per-user credentials: what a user who does not hold the lab secret proves on TCP.
//!
//! `rb user add NAME` (the broker's owner) makes one: a user name and a random 32-byte HMAC
//! key, in a small text file the user keeps as `~/.config/rb/credential` (mode 0600; a file
//! others can read is refused, as the lab secret is):
//!
//! ```text
//! # ResourceBroker credential: keep it as ~/.config/rb/credential, mode 0600
//! user = bob
//! key = 5f3c…(64 hex digits)
//! ```
//!
//! The broker keeps the same key under the user's name; the handshake (see
//! [`crate::handshake`]) names the user in its hello and both sides prove the key with the
//! same HMAC challenge–response as the lab secret, the user name bound into every MAC.

use std::{
    io::Write,
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::auth::{random_nonce, Secret};

/// The longest user name accepted.
pub const MAX_USER_LEN: usize = 32;

/// A user's credential, loaded and checked.
#[derive(Clone)]
pub struct Credential {
    user: String,
    key: Secret,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({}, ..)", self.user)
    }
}

/// Problems with a credential file.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read credential file {path}: {source}\nhelp: ask the broker's owner for one (`rb user add YOUR_NAME`) and keep it as ~/.config/rb/credential")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "credential file {path} is readable by others (mode {mode:o})\nhelp: chmod 600 {path}"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("credential file {path} is owned by uid {owner}, not by you (uid {me})\nhelp: keep your own copy (`cp` it, then chmod 600)")]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("credential file {path}: {why}\nhelp: the file is `user = NAME` and `key = 64 hex digits`, as `rb user add` wrote it")]
    Malformed { path: PathBuf, why: String },
}

/// Whether `name` may name a user: 1–32 of `A-Z a-z 0-9 . _ -`, not starting with `-` or `.`.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_USER_LEN
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

impl Credential {
    /// The user it names.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The HMAC key.
    pub fn key(&self) -> &Secret {
        &self.key
    }

    /// A new credential for `user` with a random key; `None` when the name is not valid.
    pub fn generate(user: &str) -> std::io::Result<Option<Self>> {
        if !valid_user_name(user) {
            return Ok(None);
        }
        let hex_key = random_nonce()?;
        Ok(Self::from_parts(user, &hex_key))
    }

    /// A credential from a user name and a hex key (as the broker stores them).
    pub fn from_parts(user: &str, hex_key: &str) -> Option<Self> {
        // The key is the hex text itself (normalised to lower case), as for the lab secret.
        hex::decode(hex_key).ok().filter(|k| k.len() >= 16)?;
        let key = Secret::from_file_bytes(hex_key.to_ascii_lowercase().as_bytes())?;
        valid_user_name(user).then(|| Self {
            user: user.to_string(),
            key,
        })
    }

    /// The key as hex (what the broker stores and the file holds).
    pub fn key_hex(&self) -> String {
        String::from_utf8_lossy(self.key.bytes()).into_owned()
    }

    /// The file's contents.
    pub fn file_contents(&self) -> String {
        format!(
            "# ResourceBroker credential: keep it as ~/.config/rb/credential, mode 0600\nuser = {}\nkey = {}\n",
            self.user,
            self.key_hex()
        )
    }

    /// Parses a credential file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (mut user, mut key) = (None, None);
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(format!("line {}: expected `KEY = VALUE`", n + 1));
            };
            match k.trim() {
                "user" => user = Some(v.trim().to_string()),
                "key" => key = Some(v.trim().to_string()),
                other => return Err(format!("line {}: unknown key `{other}`", n + 1)),
            }
        }
        let user = user.ok_or("no `user = NAME` line")?;
        let key = key.ok_or("no `key = HEX` line")?;
        if !valid_user_name(&user) {
            return Err(format!("`{user}` is not a valid user name"));
        }
        Self::from_parts(&user, &key).ok_or_else(|| "the key is not 32+ hex digits".to_string())
    }

    /// Loads a credential file, refusing one others can read or that is not ours.
    pub fn load(path: &Path) -> Result<Self, CredentialError> {
        let bytes = read_private(path)?;
        let text = String::from_utf8_lossy(&bytes);
        Self::parse(&text).map_err(|why| CredentialError::Malformed {
            path: path.to_path_buf(),
            why,
        })
    }
}

/// The key a TCP client proves: the lab secret or the user's credential.
#[derive(Debug, Clone)]
pub enum TcpKey {
    Secret(Secret),
    Credential(Credential),
}

impl TcpKey {
    /// As the handshake takes it.
    pub fn client_auth(&self) -> crate::handshake::ClientAuth<'_> {
        match self {
            TcpKey::Secret(s) => crate::handshake::ClientAuth::Secret(s),
            TcpKey::Credential(c) => crate::handshake::ClientAuth::Credential(c),
        }
    }
}

/// Why no key could be loaded for a TCP connection.
#[derive(Debug, thiserror::Error)]
pub enum TcpKeyError {
    #[error(transparent)]
    Secret(#[from] crate::auth::SecretError),
    #[error(transparent)]
    Credential(#[from] CredentialError),
}

/// Chooses the key for a TCP connection: the credential named by a flag or `RB_CREDENTIAL`
/// (`chosen`), else the lab secret at `secret_file` when it can be loaded, else the
/// credential at `default_credential` (`~/.config/rb/credential`) when that file exists;
/// else the lab secret's error.
pub fn load_tcp_key(
    chosen: Option<&Path>,
    secret_file: &Path,
    default_credential: &Path,
) -> Result<TcpKey, TcpKeyError> {
    if let Some(path) = chosen {
        return Ok(TcpKey::Credential(Credential::load(path)?));
    }
    match Secret::load(secret_file) {
        Ok(secret) => Ok(TcpKey::Secret(secret)),
        Err(_) if default_credential.symlink_metadata().is_ok() => {
            Ok(TcpKey::Credential(Credential::load(default_credential)?))
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads a file only its owner (us) can read.
fn read_private(path: &Path) -> Result<Vec<u8>, CredentialError> {
    let read_err = |source| CredentialError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(CredentialError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(CredentialError::Owner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    std::fs::read(path).map_err(read_err)
}

/// Writes `contents` to a new file at `path`: mode 0600, never over an existing file and
/// never through a symlink (`O_EXCL|O_NOFOLLOW`).
pub fn write_new_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// The exit code for a lab secret or credential file that cannot be used, if `cause` (one
/// error of a chain) is about one: 77 when reading it is not permitted, else 64 (mode,
/// owner, length, contents: the configuration is wrong). `rb` and `agent` both exit so
/// (docs/src/reference/exit-codes.md).
pub fn key_file_exit_code(cause: &(dyn std::error::Error + 'static)) -> Option<u8> {
    use crate::auth::SecretError;
    const EXIT_USAGE: u8 = 64;
    const EXIT_PERMISSION: u8 = 77;
    // `TcpKeyError` is transparent: the chain skips the error it wraps.
    let (secret, credential) = match cause.downcast_ref::<TcpKeyError>() {
        Some(TcpKeyError::Secret(e)) => (Some(e), None),
        Some(TcpKeyError::Credential(e)) => (None, Some(e)),
        None => (
            cause.downcast_ref::<SecretError>(),
            cause.downcast_ref::<CredentialError>(),
        ),
    };
    let unreadable =
        |source: &std::io::Error| source.kind() == std::io::ErrorKind::PermissionDenied;
    match (secret, credential) {
        (Some(SecretError::Read { source, .. }), _)
        | (_, Some(CredentialError::Read { source, .. }))
            if unreadable(source) =>
        {
            Some(EXIT_PERMISSION)
        }
        (Some(_), _) | (_, Some(_)) => Some(EXIT_USAGE),
        _ => None,
    }
}

/// Whether the broker refused our identity (a wrong or revoked credential, another uid).
pub fn is_auth_refusal(e: &crate::handshake::HandshakeError) -> bool {
    use crate::{handshake::HandshakeError, msg::ErrorCode};
    matches!(
        e,
        HandshakeError::Refused {
            code: ErrorCode::Auth | ErrorCode::Denied,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_are_plain_words() {
        for ok in ["bob", "alice.smith", "u_1", "B-2"] {
            assert!(valid_user_name(ok), "{ok}");
        }
        let long = "x".repeat(MAX_USER_LEN + 1);
        for bad in [
            "",
            "-bob",
            ".bob",
            "bo b",
            "bo/b",
            "bob:1",
            "ö",
            long.as_str(),
        ] {
            assert!(!valid_user_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_generated_credential_round_trips_through_its_file() {
        let cred = Credential::generate("bob").expect("random").expect("valid");
        let back = Credential::parse(&cred.file_contents()).expect("parses");
        assert_eq!(back.user(), "bob");
        assert_eq!(back.key_hex(), cred.key_hex());
        assert_eq!(cred.key_hex().len(), 64);
        assert!(Credential::generate("no/slash").expect("random").is_none());
    }

    #[test]
    fn malformed_files_say_what_is_wrong() {
        let err = |t: &str| Credential::parse(t).expect_err(t);
        assert!(err("user = bob\n").contains("key"));
        assert!(err("key = 00\n").contains("user"));
        assert!(err("user = bob\nkey = zz\n").contains("hex"));
        assert!(err("user = bob\nkey = 0011\n").contains("hex"), "too short");
        assert!(err("user = b b\nkey = 00\n").contains("valid user"));
        assert!(err("colour = red\n").contains("unknown key"));
        assert!(err("just words\n").contains("KEY = VALUE"));
    }

    #[test]
    fn a_readable_credential_is_refused_and_a_private_one_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("credential");
        let cred = Credential::generate("bob").expect("random").expect("valid");
        write_new_private(&path, &cred.file_contents()).expect("write");
        assert_eq!(Credential::load(&path).expect("loads").user(), "bob");
        assert!(
            write_new_private(&path, "x").is_err(),
            "never over an existing file"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = Credential::load(&path).expect_err("must refuse");
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn the_lab_secret_wins_unless_a_credential_is_chosen_or_the_secret_unreadable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        let cred = dir.path().join("credential");
        let bob = Credential::generate("bob").expect("random").expect("valid");
        write_new_private(&cred, &bob.file_contents()).expect("write");
        let got = load_tcp_key(None, &secret, &cred).expect("no secret: the credential");
        assert!(matches!(got, TcpKey::Credential(c) if c.user() == "bob"));
        crate::auth::write_new_secret(&secret, false).expect("secret");
        let got = load_tcp_key(None, &secret, &cred).expect("the secret");
        assert!(matches!(got, TcpKey::Secret(_)));
        let got = load_tcp_key(Some(&cred), &secret, &cred).expect("chosen");
        assert!(matches!(got, TcpKey::Credential(_)));
        let none = dir.path().join("none");
        let err = load_tcp_key(None, &none, &none).expect_err("nothing");
        assert!(
            err.to_string().contains("rb init"),
            "the secret's error: {err}"
        );
    }

    #[test]
    fn a_new_credential_is_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(write_new_private(&link, "x").is_err());
        assert!(!target.exists());
    }
}
