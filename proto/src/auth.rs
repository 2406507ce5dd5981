//! The per-lab secret and the HMAC-SHA256 challenge–response built on it.
//!
//! The secret lives in a file only its owner can read (mode 0600 or stricter); it is never
//! passed on a command line or over the wire. Both sides prove knowledge of it:
//! the server sends `proof = HMAC(secret, "rb-server" | role | name | client_nonce | server_nonce)`
//! and the client answers `mac = HMAC(secret, "rb-client" | role | name | server_nonce | client_nonce)`.
//! Fields are separated by a zero byte; nonces are 32 random bytes, hex-encoded.
//! A user credential ([`crate::credential`]) uses the same exchange with the user's key, the
//! user's name appended as a last field (`… | server_nonce | user`), so a MAC made for one
//! user never passes for another or for the lab secret.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::msg::Role;

type HmacSha256 = Hmac<Sha256>;

/// Smallest accepted secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// Problems with the secret file.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secret file {path}: {source}\nhelp: create one with `rb init`")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("secret file {path} is readable by others (mode {mode:o})\nhelp: chmod 600 {path}")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("secret file {path} is owned by uid {owner}, not by you (uid {me})")]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("secret file {path} holds {len} bytes; at least {MIN_SECRET_BYTES} are needed\nhelp: recreate it with `rb init --force`")]
    TooShort { path: PathBuf, len: usize },
}

/// What a MAC is bound to besides the nonces: the hello's role and name, and the user a
/// credential names (`None` for the lab secret).
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    pub role: Role,
    pub name: &'a str,
    pub user: Option<&'a str>,
}

impl<'a> Binding<'a> {
    /// Role and name only: the lab secret.
    pub fn lab(role: Role, name: &'a str) -> Self {
        Self {
            role,
            name,
            user: None,
        }
    }
}

/// The lab secret, loaded and checked.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Loads the secret from `path`, refusing files others can read or that we do not own.
    pub fn load(path: &Path) -> Result<Self, SecretError> {
        let read_err = |source| SecretError::Read {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            return Err(SecretError::Owner {
                path: path.to_path_buf(),
                owner: meta.uid(),
                me,
            });
        }
        let bytes = std::fs::read(path).map_err(read_err)?;
        Self::from_file_bytes(&bytes).ok_or(SecretError::TooShort {
            path: path.to_path_buf(),
            len: bytes.trim_ascii().len(),
        })
    }

    /// Builds a secret from file contents (surrounding whitespace ignored).
    pub fn from_file_bytes(bytes: &[u8]) -> Option<Self> {
        let trimmed = bytes.trim_ascii();
        (trimmed.len() >= MIN_SECRET_BYTES).then(|| Self(trimmed.to_vec()))
    }

    /// Contents for a new secret file: 32 random bytes, hex, newline-terminated.
    pub fn generate_file_contents() -> std::io::Result<String> {
        Ok(format!("{}\n", random_nonce()?))
    }

    /// Whether `other` is the same key (compared without early exit).
    pub fn same_key(&self, other: &Secret) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// The key's bytes (for a credential: its hex text).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, label: &str, b: &Binding<'_>, first: &str, second: &str) -> HmacSha256 {
        // HMAC accepts keys of any length; new_from_slice cannot fail for HMAC.
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        let role = b.role.to_string();
        let user = b.user.into_iter();
        for part in [label, &role, b.name, first, second]
            .into_iter()
            .chain(user)
        {
            mac.update(part.as_bytes());
            mac.update(&[0]);
        }
        mac
    }

    /// A short public mark of the secret (16 hex digits of an HMAC under it): tells apart
    /// what belongs to this lab from what belongs to another broker (an embedded one, say)
    /// of the same user on the same machine, without revealing the secret. See
    /// [`crate::tag`].
    pub fn lab_mark(&self) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(b"rb-lab-mark\0");
        hex::encode(&mac.finalize().into_bytes()[..8])
    }

    /// The server's proof for a client hello.
    pub fn server_proof(&self, b: &Binding<'_>, client_nonce: &str, server_nonce: &str) -> String {
        let mac = self.mac("rb-server", b, client_nonce, server_nonce);
        hex::encode(mac.finalize().into_bytes())
    }

    /// The client's answer to the server's challenge.
    pub fn client_mac(&self, b: &Binding<'_>, client_nonce: &str, server_nonce: &str) -> String {
        let mac = self.mac("rb-client", b, server_nonce, client_nonce);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Constant-time check of a server proof.
    pub fn verify_server_proof(&self, b: &Binding<'_>, cn: &str, sn: &str, proof: &str) -> bool {
        let Ok(bytes) = hex::decode(proof) else {
            return false;
        };
        self.mac("rb-server", b, cn, sn)
            .verify_slice(&bytes)
            .is_ok()
    }

    /// Constant-time check of a client answer.
    pub fn verify_client_mac(&self, b: &Binding<'_>, cn: &str, sn: &str, mac: &str) -> bool {
        let Ok(bytes) = hex::decode(mac) else {
            return false;
        };
        self.mac("rb-client", b, sn, cn)
            .verify_slice(&bytes)
            .is_ok()
    }
}

/// 32 random bytes from the OS, hex-encoded.
pub fn random_nonce() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(std::io::Error::other)?;
    Ok(hex::encode(bytes))
}

/// Writes a new secret file with mode 0600, creating parent directories (mode 0700).
pub fn write_new_secret(path: &Path, overwrite: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if overwrite {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut file = opts.open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(Secret::generate_file_contents()?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> Secret {
        Secret::from_file_bytes(text.as_bytes()).expect("long enough")
    }

    #[test]
    fn proofs_verify_only_with_the_same_secret() {
        let a = secret("0123456789abcdef0123");
        let b = secret("0123456789abcdef0124");
        let n2 = Binding::lab(Role::Hostd, "node02");
        let proof = a.server_proof(&n2, "c1", "s1");
        assert!(a.verify_server_proof(&n2, "c1", "s1", &proof));
        assert!(!b.verify_server_proof(&n2, "c1", "s1", &proof));
        assert!(!a.verify_server_proof(&Binding::lab(Role::Hostd, "node03"), "c1", "s1", &proof));
        let mac = a.client_mac(&n2, "c1", "s1");
        assert!(a.verify_client_mac(&n2, "c1", "s1", &mac));
        assert!(!a.verify_client_mac(&Binding::lab(Role::Client, "node02"), "c1", "s1", &mac));
        assert!(!a.verify_client_mac(&n2, "c1", "s1", "zz"));
    }

    #[test]
    fn client_mac_is_not_a_server_proof() {
        let a = secret("0123456789abcdef0123");
        let b = Binding::lab(Role::Hostd, "n");
        let mac = a.client_mac(&b, "c", "s");
        assert!(!a.verify_server_proof(&b, "c", "s", &mac));
    }

    #[test]
    fn a_mac_is_bound_to_the_user_it_names() {
        let key = secret("0123456789abcdef0123");
        let user = |u| Binding {
            role: Role::Client,
            name: "rb",
            user: Some(u),
        };
        let mac = key.client_mac(&user("bob"), "c", "s");
        assert!(key.verify_client_mac(&user("bob"), "c", "s", &mac));
        assert!(!key.verify_client_mac(&user("eve"), "c", "s", &mac));
        assert!(!key.verify_client_mac(&Binding::lab(Role::Client, "rb"), "c", "s", &mac));
    }

    #[test]
    fn short_secret_is_refused() {
        assert!(Secret::from_file_bytes(b"  short \n").is_none());
    }

    #[test]
    fn group_readable_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secret");
        write_new_secret(&path, false).expect("write");
        assert!(Secret::load(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let err = Secret::load(&path).expect_err("must refuse");
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn write_new_secret_creates_missing_directories_private() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config/rb/secret");
        write_new_secret(&path, false).expect("write");
        for d in ["config", "config/rb"] {
            let mode = std::fs::metadata(dir.path().join(d)).expect("stat").mode() & 0o777;
            assert_eq!(mode, 0o700, "{d}");
        }
    }
}
