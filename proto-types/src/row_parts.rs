//! A [`HostStatus`] row in two parts, so that a broker can keep each host's row encoded
//! and answer `rb status` by joining text instead of building and encoding every row.
//!
//! - [`FixedPart`]: the fields that change only with the host's record (its lab-file entry
//!   and its last report). The broker encodes it when the host changes and keeps the text.
//! - [`LivePart`]: the fields that change with time (up or down, the report's age) and
//!   with the allocator (held, drained, the policy's note). Built at each `rb status`.
//!
//! [`write_row`] joins the two into the JSON object `HostStatus` serializes to (the same
//! members, in another order). Both parts take their fields from a `HostStatus` by
//! destructuring it, so a field added to `HostStatus` does not compile until it is placed
//! in one of them; the tests check that a joined row reads back as the row it came from.

use std::borrow::Cow;

use serde::Serialize;

use crate::report::{HostState, HostStatus, LogindSession, UserSession};

/// The fields of a row that change only with the host's record, serialized as
/// [`HostStatus`] serializes them (same names, same fields left out when empty). The
/// fields a busy host's reports change every time come last (see [`write_steady`]).
#[derive(Debug, Serialize)]
pub struct FixedPart<'a> {
    pub name: &'a str,
    pub address: &'a str,
    pub hostname: Option<&'a str>,
    pub cpus: Option<u32>,
    pub mem_total_kb: Option<u64>,
    pub os: Option<&'a str>,
    pub arch: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logind: Option<&'a [LogindSession]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logind_error: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub warnings: &'a [String],
    pub labels: &'a [String],
    pub owner: Option<&'a str>,
    // What `Fields::MOVING` gives: written by `write_moving`.
    pub load1: Option<f64>,
    pub load5: Option<f64>,
    pub load15: Option<f64>,
    pub cpu_util: Option<f64>,
    pub mem_available_kb: Option<u64>,
    pub users: &'a [UserSession],
    pub users_known: bool,
    pub console_idle_s: Option<u64>,
    pub managed_procs: Option<u32>,
    pub job_load: Option<f64>,
}

/// The fields of a row that change with time and with the allocator, serialized as
/// [`HostStatus`] serializes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LivePart {
    pub state: HostState,
    pub down_reason: Option<String>,
    pub last_report_age_s: Option<f64>,
    pub daemon_starts: u32,
    /// A word the allocator names (no string made per row).
    pub alloc_state: Cow<'static, str>,
    pub held_by: Option<u64>,
    pub drained: bool,
    pub policy_note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_left_s: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_ending: bool,
}

impl HostStatus {
    /// The row's [`FixedPart`], borrowed.
    pub fn fixed_part(&self) -> FixedPart<'_> {
        let HostStatus {
            name,
            address,
            state: _,
            down_reason: _,
            hostname,
            cpus,
            load1,
            load5,
            load15,
            cpu_util,
            mem_total_kb,
            mem_available_kb,
            os,
            arch,
            users,
            users_known,
            console_idle_s,
            logind,
            logind_error,
            warnings,
            managed_procs,
            job_load,
            labels,
            owner,
            last_report_age_s: _,
            daemon_starts: _,
            alloc_state: _,
            held_by: _,
            drained: _,
            policy_note: _,
            slurm_job: _,
            lease_left_s: _,
            lease_ending: _,
        } = self;
        FixedPart {
            name,
            address,
            hostname: hostname.as_deref(),
            cpus: *cpus,
            load1: *load1,
            load5: *load5,
            load15: *load15,
            cpu_util: *cpu_util,
            mem_total_kb: *mem_total_kb,
            mem_available_kb: *mem_available_kb,
            os: os.as_deref(),
            arch: arch.as_deref(),
            users,
            users_known: *users_known,
            console_idle_s: *console_idle_s,
            logind: logind.as_deref(),
            logind_error: logind_error.as_deref(),
            warnings,
            managed_procs: *managed_procs,
            job_load: *job_load,
            labels,
            owner: owner.as_deref(),
        }
    }

    /// The row's [`LivePart`], copied.
    pub fn live_part(&self) -> LivePart {
        LivePart {
            state: self.state,
            down_reason: self.down_reason.clone(),
            last_report_age_s: self.last_report_age_s,
            daemon_starts: self.daemon_starts,
            alloc_state: Cow::Owned(self.alloc_state.clone()),
            held_by: self.held_by,
            drained: self.drained,
            policy_note: self.policy_note.clone(),
            slurm_job: self.slurm_job.clone(),
            lease_left_s: self.lease_left_s,
            lease_ending: self.lease_ending,
        }
    }

    /// The row the two parts make (what [`write_row`] writes them as, as a value).
    pub fn from_parts(fixed: &FixedPart<'_>, live: LivePart) -> HostStatus {
        let FixedPart {
            name,
            address,
            hostname,
            cpus,
            load1,
            load5,
            load15,
            cpu_util,
            mem_total_kb,
            mem_available_kb,
            os,
            arch,
            users,
            users_known,
            console_idle_s,
            logind,
            logind_error,
            warnings,
            managed_procs,
            job_load,
            labels,
            owner,
        } = *fixed;
        let mut row = HostStatus {
            name: name.into(),
            address: address.into(),
            hostname: hostname.map(Into::into),
            cpus,
            load1,
            load5,
            load15,
            cpu_util,
            mem_total_kb,
            mem_available_kb,
            os: os.map(Into::into),
            arch: arch.map(Into::into),
            users: users.to_vec(),
            users_known,
            console_idle_s,
            logind: logind.map(<[_]>::to_vec),
            logind_error: logind_error.map(Into::into),
            warnings: warnings.to_vec(),
            managed_procs,
            job_load,
            labels: labels.to_vec(),
            owner: owner.map(Into::into),
            ..HostStatus::default()
        };
        row.set_live(live);
        row
    }

    /// Puts `live` into the row.
    pub fn set_live(&mut self, live: LivePart) {
        let LivePart {
            state,
            down_reason,
            last_report_age_s,
            daemon_starts,
            alloc_state,
            held_by,
            drained,
            policy_note,
            slurm_job,
            lease_left_s,
            lease_ending,
        } = live;
        self.state = state;
        self.down_reason = down_reason;
        self.last_report_age_s = last_report_age_s;
        self.daemon_starts = daemon_starts;
        self.alloc_state = alloc_state.into_owned();
        self.held_by = held_by;
        self.drained = drained;
        self.policy_note = policy_note;
        self.slurm_job = slurm_job;
        self.lease_left_s = lease_left_s;
        self.lease_ending = lease_ending;
    }
}

/// Appends one row's JSON object to `out`: the members of `fixed_json` (a [`FixedPart`]'s
/// JSON object as `serde_json` writes it: UTF-8 text, taken as its bytes) and those of
/// `live`.
pub fn write_row(out: &mut Vec<u8>, fixed_json: &[u8], live: &LivePart) -> serde_json::Result<()> {
    let Some(members) = fixed_json.strip_suffix(b"}") else {
        return Err(serde::ser::Error::custom("a fixed part is a JSON object"));
    };
    out.extend_from_slice(members);
    write_live_members(out, live)?;
    out.push(b'}');
    Ok(())
}

/// Appends `live`'s members, each after a comma, as `serde_json` writes the [`LivePart`]
/// (same order, same members left out), but with its keys as written-out constants:
/// serde escapes every key, ten a row, and at 10k hosts that was the largest part of
/// encoding `rb status`'s rows. The values are serde's. Destructured, so that a field added
/// to `LivePart` does not compile until it is written here.
fn write_live_members(out: &mut Vec<u8>, live: &LivePart) -> serde_json::Result<()> {
    let LivePart {
        state,
        down_reason,
        last_report_age_s,
        daemon_starts,
        alloc_state,
        held_by,
        drained,
        policy_note,
        slurm_job,
        lease_left_s,
        lease_ending,
    } = live;
    member(out, "state", state)?;
    member(out, "down_reason", down_reason)?;
    member(out, "last_report_age_s", last_report_age_s)?;
    member(out, "daemon_starts", daemon_starts)?;
    member(out, "alloc_state", alloc_state)?;
    member(out, "held_by", held_by)?;
    member(out, "drained", drained)?;
    member(out, "policy_note", policy_note)?;
    if slurm_job.is_some() {
        member(out, "slurm_job", slurm_job)?;
    }
    if lease_left_s.is_some() {
        member(out, "lease_left_s", lease_left_s)?;
    }
    if *lease_ending {
        member(out, "lease_ending", lease_ending)?;
    }
    Ok(())
}

/// Appends `part` as the JSON object `serde_json` writes for it, byte for byte (same members
/// in the same order, the same ones left out when empty), with its keys as written-out
/// constants, as `write_live_members` does: at 10k hosts whose every report changes, the
/// broker encodes a fixed part per report, and serde escaping its 22 keys each time was
/// most of that. The values are serde's. [`write_steady`] then [`write_moving`].
pub fn write_fixed(out: &mut Vec<u8>, part: &FixedPart<'_>) -> serde_json::Result<()> {
    write_steady(out, part)?;
    write_moving(out, part)
}

/// The start of [`write_fixed`]'s object: the opening brace and the members that change
/// only when the host's record does (its entry, its labels, the report's fields outside
/// [`crate::report_changes::Fields::MOVING`]). A broker keeps this text while the report
/// changes only in moving fields, and writes only [`write_moving`] after it. Destructured,
/// so that a field added to [`FixedPart`] does not compile until it is written here or
/// there.
pub fn write_steady(out: &mut Vec<u8>, part: &FixedPart<'_>) -> serde_json::Result<()> {
    let FixedPart {
        name,
        address,
        hostname,
        cpus,
        mem_total_kb,
        os,
        arch,
        logind,
        logind_error,
        warnings,
        labels,
        owner,
        load1: _,
        load5: _,
        load15: _,
        cpu_util: _,
        mem_available_kb: _,
        users: _,
        users_known: _,
        console_idle_s: _,
        managed_procs: _,
        job_load: _,
    } = part;
    out.extend_from_slice(b"{\"name\":");
    serde_json::to_writer(&mut *out, name)?;
    member(out, "address", address)?;
    member(out, "hostname", hostname)?;
    member(out, "cpus", cpus)?;
    member(out, "mem_total_kb", mem_total_kb)?;
    member(out, "os", os)?;
    member(out, "arch", arch)?;
    if logind.is_some() {
        member(out, "logind", logind)?;
    }
    if logind_error.is_some() {
        member(out, "logind_error", logind_error)?;
    }
    if !warnings.is_empty() {
        member(out, "warnings", warnings)?;
    }
    member(out, "labels", labels)?;
    member(out, "owner", owner)
}

/// The rest of [`write_fixed`]'s object after [`write_steady`]: the members that
/// [`crate::report_changes::Fields::MOVING`] give, and the closing brace.
pub fn write_moving(out: &mut Vec<u8>, part: &FixedPart<'_>) -> serde_json::Result<()> {
    let FixedPart {
        load1,
        load5,
        load15,
        cpu_util,
        mem_available_kb,
        users,
        users_known,
        console_idle_s,
        managed_procs,
        job_load,
        ..
    } = part;
    member(out, "load1", load1)?;
    member(out, "load5", load5)?;
    member(out, "load15", load15)?;
    member(out, "cpu_util", cpu_util)?;
    member(out, "mem_available_kb", mem_available_kb)?;
    member(out, "users", users)?;
    member(out, "users_known", users_known)?;
    member(out, "console_idle_s", console_idle_s)?;
    member(out, "managed_procs", managed_procs)?;
    member(out, "job_load", job_load)?;
    out.push(b'}');
    Ok(())
}

/// `,"KEY":VALUE`; `key` needs no escaping (a field name).
fn member(out: &mut Vec<u8>, key: &str, value: &impl Serialize) -> serde_json::Result<()> {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    serde_json::to_writer(&mut *out, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::IdleSource;

    fn row() -> HostStatus {
        HostStatus {
            name: "node03".into(),
            address: "10.0.0.3".into(),
            state: HostState::Up,
            down_reason: None,
            hostname: Some("node03.lab".into()),
            cpus: Some(8),
            load1: Some(0.25),
            load5: Some(1.0),
            load15: None,
            cpu_util: Some(0.125),
            mem_total_kb: Some(16_000_000),
            mem_available_kb: Some(9_000_000),
            os: Some("Linux".into()),
            arch: Some("x86_64".into()),
            users: vec![UserSession {
                user: "ann".into(),
                tty: "pts/0".into(),
                idle_s: Some(12),
                from: Some("10.0.0.9".into()),
            }],
            users_known: true,
            console_idle_s: Some(300),
            logind: Some(vec![LogindSession {
                user: "ann".into(),
                class: "user".into(),
                kind: "wayland".into(),
                active: true,
                idle_source: IdleSource::LogindUnlock,
                ..LogindSession::default()
            }]),
            logind_error: Some("partial".into()),
            warnings: vec!["utmp unreadable".into()],
            managed_procs: Some(3),
            job_load: Some(0.5),
            labels: vec!["gpu".into(), "linux".into()],
            owner: Some("ann".into()),
            last_report_age_s: Some(0.4),
            daemon_starts: 2,
            alloc_state: "held".into(),
            held_by: Some(7),
            drained: true,
            policy_note: Some("owner active 12 s ago".into()),
            slurm_job: Some("4711".into()),
            lease_left_s: Some(60.0),
            lease_ending: true,
        }
    }

    fn sparse() -> HostStatus {
        HostStatus {
            name: "node04".into(),
            address: "10.0.0.4".into(),
            down_reason: Some("no daemon has reported yet".into()),
            alloc_state: "free".into(),
            ..HostStatus::default()
        }
    }

    /// A row joined from its parts has the members `HostStatus` serializes to, no more and
    /// no fewer (fields left out when empty included), and reads back as the row.
    #[test]
    fn a_joined_row_is_the_row_as_serde_writes_it() {
        for row in [row(), sparse()] {
            let fixed = serde_json::to_string(&row.fixed_part()).expect("fixed");
            let mut joined = Vec::new();
            write_row(&mut joined, fixed.as_bytes(), &row.live_part()).expect("join");
            let as_value: serde_json::Value = serde_json::from_slice(&joined).expect("json");
            assert_eq!(as_value, serde_json::to_value(&row).expect("value"));
            let back: HostStatus = serde_json::from_slice(&joined).expect("a row");
            assert_eq!(back, row);
        }
    }

    /// The live members as written out are byte for byte what serde writes for the
    /// `LivePart` (its braces aside): every field set, none set, and strings that need
    /// escaping.
    #[test]
    fn the_live_members_are_what_serde_writes() {
        let mut escaped = row().live_part();
        escaped.policy_note = Some("quote \" back\\slash\nnew line \u{1} é".into());
        escaped.down_reason = Some("tab\t".into());
        for live in [
            row().live_part(),
            sparse().live_part(),
            escaped,
            LivePart::default(),
        ] {
            let mut ours = Vec::new();
            write_live_members(&mut ours, &live).expect("members");
            let serde = serde_json::to_vec(&live).expect("serde");
            assert_eq!(ours[0], b',');
            assert_eq!(
                String::from_utf8_lossy(&ours[1..]),
                String::from_utf8_lossy(&serde[1..serde.len() - 1]),
                "{live:?}"
            );
        }
    }

    /// A fixed part as written out is byte for byte what serde writes for it: every field
    /// set, none set, and strings that need escaping.
    #[test]
    fn the_fixed_part_is_what_serde_writes() {
        let mut escaped = row();
        escaped.name = "quote \" back\\slash".into();
        escaped.os = Some("new line\n \u{1} é".into());
        escaped.users[0].tty = "tab\t".into();
        escaped.load15 = Some(f64::NAN);
        let mut no_warnings = row();
        no_warnings.warnings.clear();
        no_warnings.logind = None;
        for row in [row(), sparse(), escaped, no_warnings, HostStatus::default()] {
            let mut ours = Vec::new();
            write_fixed(&mut ours, &row.fixed_part()).expect("written");
            let serde = serde_json::to_vec(&row.fixed_part()).expect("serde");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&serde),
                "{row:?}"
            );
        }
    }

    /// `set_live` then `live_part` gives back every live field, and leaves the fixed ones.
    #[test]
    fn set_live_takes_every_live_field() {
        let mut target = sparse();
        target.set_live(row().live_part());
        assert_eq!(target.live_part(), row().live_part());
        assert_eq!(target.name, "node04");
    }

    #[test]
    fn a_fixed_part_that_is_no_object_is_refused() {
        let mut out = Vec::new();
        assert!(write_row(&mut out, b"[1]", &row().live_part()).is_err());
    }
}
