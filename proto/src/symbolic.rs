//! Symbolic host names (`anyHost`, `anyLinux`, `any<Label>`): which names are symbolic, and
//! the placeholder address a symbolic name resolves to inside jobs that need every host name
//! to resolve (PVM and LAM look a name up before they run the remote shell). The shim, the
//! job preload library (`preload/`) and the agent all take the rule from here.

use std::net::Ipv4Addr;

/// `any` (any case) followed by at least one more character, and no `.` (so a fully qualified
/// name such as `anything.example.org` stays a real host).
pub fn is_symbolic(host: &str) -> bool {
    host.len() > 3
        && host.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("any"))
        && !host.contains('.')
}

/// The loopback network placeholder addresses come from: 127.77.0.0/16. Loopback, so a
/// program that does connect to one never leaves the machine.
pub const PLACEHOLDER_NET: [u8; 2] = [127, 77];

/// The placeholder address of symbolic `name`: 127.77.X.Y with X.Y from a hash of the
/// lower-cased name, so one name always gets one address (`anyLinux` = `ANYLINUX`) and
/// different names almost always different ones (PVM refuses two hosts with one address).
/// Y is never 0 or 255.
pub fn placeholder_address(name: &str) -> Ipv4Addr {
    // FNV-1a, 32 bits.
    let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b.to_ascii_lowercase())).wrapping_mul(0x0100_0193)
    });
    let x = (hash >> 8) as u8;
    let y = 1 + (hash % 254) as u8;
    Ipv4Addr::new(PLACEHOLDER_NET[0], PLACEHOLDER_NET[1], x, y)
}

/// File name of the job preload library (`preload/`), loaded into module jobs.
pub const PRELOAD_FILE: &str = "librb_preload.so";

/// `LD_PRELOAD` (entries separated by spaces or colons, as the dynamic loader reads it) with
/// `lib` in front, once.
pub fn preload_with(existing: Option<&str>, lib: &str) -> String {
    let rest = existing.map(without_preload).unwrap_or_default();
    if rest.is_empty() {
        lib.to_string()
    } else {
        format!("{lib}:{rest}")
    }
}

/// `LD_PRELOAD` without the job preload library: what the shim hands to the real remote
/// shell.
pub fn without_preload(preload: &str) -> String {
    preload
        .split([' ', ':'])
        .filter(|e| !e.is_empty() && !e.ends_with(PRELOAD_FILE))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_names() {
        for host in [
            "anyHost",
            "anyLinux",
            "anylinux",
            "anyPublic",
            "ANYX86_64",
            "AnyA",
        ] {
            assert!(is_symbolic(host), "{host}");
        }
        for host in [
            "any",
            "an",
            "",
            "node03",
            "10.0.0.1",
            "anything.example.org",
            "manyhost",
            "xanyLinux",
        ] {
            assert!(!is_symbolic(host), "{host}");
        }
    }

    #[test]
    fn a_placeholder_is_stable_case_blind_and_loopback() {
        let a = placeholder_address("anyLinux");
        assert_eq!(a, placeholder_address("ANYLINUX"));
        assert!(a.is_loopback());
        assert_eq!(a.octets()[..2], PLACEHOLDER_NET);
        assert_ne!(a, placeholder_address("anyHost"));
        assert_ne!(a, placeholder_address("anyPublic"));
    }

    #[test]
    fn the_preload_goes_first_once_and_comes_off_cleanly() {
        let lib = "/opt/rb/lib/librb_preload.so";
        assert_eq!(preload_with(None, lib), lib);
        assert_eq!(preload_with(Some(""), lib), lib);
        assert_eq!(
            preload_with(Some("/x/a.so /y/b.so"), lib),
            format!("{lib}:/x/a.so:/y/b.so")
        );
        let twice = preload_with(Some(&preload_with(Some("/x/a.so"), lib)), lib);
        assert_eq!(twice, format!("{lib}:/x/a.so"));
        assert_eq!(without_preload(&twice), "/x/a.so");
        assert_eq!(without_preload(lib), "");
    }

    #[test]
    fn a_placeholder_never_ends_in_0_or_255() {
        for i in 0..5000 {
            let last = placeholder_address(&format!("any{i}")).octets()[3];
            assert!((1..=254).contains(&last), "any{i}: {last}");
        }
    }
}
