//! Symbolic host names (`anyHost`, `anyLinux`, `any<Label>`, and their instances
//! `anyLinux-1`): which names are symbolic, how a label is spelled in a name, the instance
//! suffix, which label sets make a name ambiguous, and the placeholder address a symbolic
//! name resolves to inside jobs that need every host name to resolve (PVM and LAM look a
//! name up before they run the remote shell). The shim, the job preload library
//! (`preload/`), the agent, the broker and the lab-file checks all take the rules from here.
//!
//! # Names
//! - A symbolic name is a valid host name (letters, digits and `-`), because launchers parse
//!   it as one (Open MPI's node-name parser refuses `_`). A label's name is the label with
//!   `_` read as `-`: label `x86_64` is asked for as `anyX86-64`.
//! - `<name>-<N>` is an *instance* (`anyLinux-1`): the job binds it to one host at its first
//!   call and keeps that host for it. A name is matched whole against the labels first; only
//!   when no label has that name is a trailing `-N` read as an instance
//!   ([`split_instance`]). Two labels that make a name mean both ([`ambiguous_labels`],
//!   `gpu` and `gpu-1`) are refused in lab files.

use std::net::Ipv4Addr;

/// `any` (any case) followed by at least one more character, and no `.` (so a fully qualified
/// name such as `anything.example.org` stays a real host).
pub fn is_symbolic(host: &str) -> bool {
    host.len() > 3
        && host.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("any"))
        && !host.contains('.')
}

/// Labels every lab has without a lab file naming them: `host` (for `anyHost`) and those
/// the host daemon derives from `uname` (operating system and machine).
pub const IMPLICIT_LABELS: [&str; 10] = [
    "host", "linux", "x86_64", "i686", "aarch64", "armv7l", "ppc64le", "s390x", "riscv64", "mips64",
];

/// The name form of `label`: lower case, `_` read as `-` (`x86_64` → `x86-64`), so that
/// `any<name form>` is a valid host name.
pub fn label_name(label: &str) -> String {
    label
        .chars()
        .map(|c| match c {
            '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Why a symbolic name is not one a launcher accepts as a host name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "`{name}` is not a valid host name (`_`), so launchers such as Open MPI refuse it\n\
         help: a label's `_` reads as `-` in its name: use `{suggestion}`"
    )]
    Underscore { name: String, suggestion: String },
    #[error(
        "`{name}` is not a valid host name\n\
         help: symbolic names are `any` followed by letters, digits and inner `-` \
         (anyLinux, anyX86-64, anyLinux-2)"
    )]
    Invalid { name: String },
}

/// Checks that symbolic `name` is a valid host name (RFC 1123 label: letters, digits and
/// `-`, not first or last, at most 63 characters).
pub fn check_name(name: &str) -> Result<(), NameError> {
    let valid_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    let ok = valid_chars && !name.ends_with('-') && name.len() <= 63 && is_symbolic(name);
    if ok {
        return Ok(());
    }
    let fixed = name.replace('_', "-");
    if name.contains('_') && check_name(&fixed).is_ok() {
        return Err(NameError::Underscore {
            name: name.to_string(),
            suggestion: fixed,
        });
    }
    Err(NameError::Invalid {
        name: name.to_string(),
    })
}

/// `anyLinux-3` → (`anyLinux`, 3): a symbolic name with a trailing `-N` (decimal digits,
/// no sign, fits `u32`). `None` when there is no such suffix or nothing symbolic is left
/// before it. Whether the suffix is an instance depends on the labels (a label may end
/// in `-N`): callers match the whole name against the labels first.
pub fn split_instance(name: &str) -> Option<(&str, u32)> {
    let (base, digits) = name.rsplit_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.parse().ok()?;
    (is_symbolic(base) && !base.ends_with('-')).then_some((base, n))
}

/// Pairs of labels (name forms, `(short, long)`) that make a symbolic name ambiguous:
/// `long` is `short-N`, so `any<long>` could be the label `long` or instance N of `short`
/// (`gpu` and `gpu-1`; `x86` and `x86_64`). [`IMPLICIT_LABELS`] take part.
pub fn ambiguous_labels<'a>(labels: impl IntoIterator<Item = &'a str>) -> Vec<(String, String)> {
    let mut names: Vec<String> = labels.into_iter().map(label_name).collect();
    names.extend(IMPLICIT_LABELS.iter().map(|l| label_name(l)));
    names.sort();
    names.dedup();
    let mut pairs = Vec::new();
    for long in &names {
        let Some((short, _)) = long.rsplit_once('-').filter(|(s, d)| {
            !s.is_empty() && !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
        }) else {
            continue;
        };
        if names.iter().any(|n| n == short) {
            pairs.push((short.to_string(), long.clone()));
        }
    }
    pairs
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

    #[test]
    fn a_label_name_reads_underscore_as_dash() {
        assert_eq!(label_name("x86_64"), "x86-64");
        assert_eq!(label_name("Public"), "public");
        assert_eq!(label_name("gpu-1"), "gpu-1");
    }

    #[test]
    fn names_launchers_refuse_are_refused_with_the_name_to_use() {
        for ok in [
            "anyLinux",
            "anyX86-64",
            "anyLinux-1",
            "anyHost-12",
            "ANYPUBLIC",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        let err = check_name("anyX86_64").expect_err("underscore");
        assert_eq!(
            err,
            NameError::Underscore {
                name: "anyX86_64".into(),
                suggestion: "anyX86-64".into()
            }
        );
        assert!(err.to_string().contains("help: "), "{err}");
        for bad in [
            "anyLinux-",
            "any Linux",
            "anyLinux.x",
            "node03",
            "any",
            "anyé",
        ] {
            assert!(
                matches!(check_name(bad), Err(NameError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_trailing_number_splits_off_as_an_instance() {
        assert_eq!(split_instance("anyLinux-1"), Some(("anyLinux", 1)));
        assert_eq!(split_instance("anyPublic-30"), Some(("anyPublic", 30)));
        assert_eq!(split_instance("anyX86-64"), Some(("anyX86", 64)));
        assert_eq!(split_instance("anyX86-64-2"), Some(("anyX86-64", 2)));
        assert_eq!(split_instance("anyHost-007"), Some(("anyHost", 7)));
        for none in [
            "anyLinux",
            "anyLinux-",
            "anyLinux-x",
            "anyLinux-+1",
            "any-1",
            "anyLinux--1",
            "node03-1",
            "anyLinux-99999999999",
        ] {
            assert_eq!(split_instance(none), None, "{none}");
        }
    }

    #[test]
    fn a_label_and_its_numbered_twin_are_ambiguous() {
        assert_eq!(
            ambiguous_labels(["gpu", "gpu-1", "public"]),
            vec![("gpu".to_string(), "gpu-1".to_string())]
        );
        assert_eq!(
            ambiguous_labels(["x86"]),
            vec![("x86".to_string(), "x86-64".to_string())],
            "x86 beside the sensor label x86_64"
        );
        assert_eq!(
            ambiguous_labels(["linux-2"]),
            vec![("linux".to_string(), "linux-2".to_string())]
        );
        assert_eq!(
            ambiguous_labels(["host-1"]),
            vec![("host".to_string(), "host-1".to_string())]
        );
        assert!(ambiguous_labels(["gpu-1", "public", "x86_64"]).is_empty());
        assert!(ambiguous_labels(["gpu", "gpu-a", "gpux1"]).is_empty());
    }
}
