//! The tag that marks every process of a remote command: `RB_SUBAGENT_TAG=ALLOC.PID.MARK`
//! in its environment — the allocation it runs under, the subagent front's pid, and the
//! lab's mark ([`crate::auth::Secret::lab_mark`]; absent when the subagent could not read
//! the secret) — set by `rb-subagent` and inherited by every descendant whatever it does to
//! its session or group. The subagent's guardian ends the processes carrying its own tag;
//! the host daemon ends those of its own lab (same mark) whose allocation the broker no
//! longer has ([`crate::msg::FromBroker::LiveAllocs`]). Allocation ids are a broker's own:
//! the mark keeps a lab's daemon off the processes of another broker of the same user (an
//! embedded one started by a job on this machine, another lab with another secret).

/// The environment variable of the tag.
pub const SUBAGENT_TAG_VAR: &str = "RB_SUBAGENT_TAG";

/// A parsed tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentTag {
    pub alloc: u64,
    pub front_pid: u32,
    /// The lab's mark, when the subagent knew it.
    pub lab: Option<String>,
}

/// The tag of the command a subagent (front pid `front_pid`) runs for allocation `alloc`
/// of the lab whose mark is `lab`.
pub fn subagent_tag(alloc: u64, front_pid: u32, lab: Option<&str>) -> String {
    match lab {
        Some(mark) => format!("{alloc}.{front_pid}.{mark}"),
        None => format!("{alloc}.{front_pid}"),
    }
}

/// Whether `m` has the form of a lab mark: hex digits, not empty.
pub fn is_mark(m: &str) -> bool {
    !m.is_empty() && m.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parses `ALLOC.PID` or `ALLOC.PID.MARK` (decimal, decimal, hex digits).
pub fn parse(tag: &str) -> Option<SubagentTag> {
    let mut parts = tag.split('.');
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (alloc, pid) = (parts.next()?, parts.next()?);
    if !decimal(alloc) || !decimal(pid) {
        return None;
    }
    let lab = match parts.next() {
        None => None,
        Some(m) if is_mark(m) => Some(m.into()),
        Some(_) => return None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(SubagentTag {
        alloc: alloc.parse().ok()?,
        front_pid: pid.parse().ok()?,
        lab,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_allocation_and_lab() {
        let tag = parse(&subagent_tag(17, 4242, Some("00ff9a"))).expect("parses");
        assert_eq!(
            tag,
            SubagentTag {
                alloc: 17,
                front_pid: 4242,
                lab: Some("00ff9a".into())
            }
        );
        assert_eq!(
            parse(&subagent_tag(17, 4242, None)).expect("parses").lab,
            None
        );
        for bad in [
            "",
            "17",
            "17.",
            ".4242",
            "x.1",
            "1.x",
            "1.2.",
            "1.2.xyz",
            "1.2.ab.cd",
            "-1.2",
            "+1.2",
            " 1.2",
            "99999999999999999999.1",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
