//! Which keys a lab file may have, and every unknown one in a file found in one pass.
//!
//! serde's `deny_unknown_fields` stops at the first unknown key; a user fixing a file wants
//! them all at once. So before the typed parse ([`crate::raw`]) the file is read as bare key
//! trees (names and spans only) and checked against the lists here. The lists must name
//! exactly the fields of [`crate::raw`] (a unit test checks that each one parses).

use std::{collections::BTreeMap, path::Path};

use serde::{de::IgnoredAny, Deserialize};
use toml::Spanned;

use crate::error::ConfigError;

/// Top-level keys.
pub const TOP_KEYS: &[&str] = &["broker", "host", "overflow", "web"];
/// Keys of `[web]`.
pub const WEB_KEYS: &[&str] = &["listen", "jobs"];
/// Keys of `[overflow]`: the systems the lab can overflow onto.
pub const OVERFLOW_KEYS: &[&str] = &["slurm"];
/// Keys of `[overflow.slurm]`.
pub const SLURM_KEYS: &[&str] = &[
    "partition",
    "max_nodes",
    "lease_s",
    "idle_exit_s",
    "sbatch",
    "squeue",
    "scancel",
    "scontrol",
    "sbatch_args",
];
/// Keys of `[broker]`.
pub const BROKER_KEYS: &[&str] = &[
    "listen",
    "transport",
    "state_dir",
    "secret_file",
    "report_interval_s",
    "down_after_s",
    "restart_backoff_max_s",
    "hostd_path",
    "ssh_command",
    "rsh_command",
    "job_shell",
    "reclaim_grace_s",
    "policy",
    "trace_file_max_kib",
    "trace_files_kept",
];
/// Keys of each `[[host]]`.
pub const HOST_KEYS: &[&str] = &["name", "address", "labels", "owner"];

type Keys = BTreeMap<Spanned<String>, IgnoredAny>;

/// The key names of the tables that have fixed keys; values are skipped.
#[derive(Deserialize)]
struct KeyTree {
    #[serde(default)]
    broker: Option<Keys>,
    #[serde(default)]
    host: Vec<Keys>,
    #[serde(default)]
    overflow: Option<Keys>,
    #[serde(default)]
    web: Option<Keys>,
}

/// The key names of `[overflow.slurm]` (a second pass: `Spanned` keys do not survive
/// serde's `flatten`).
#[derive(Deserialize)]
struct SlurmTree {
    #[serde(default)]
    overflow: Option<OverflowTree>,
}

#[derive(Deserialize)]
struct OverflowTree {
    #[serde(default)]
    slurm: Option<Keys>,
}

/// Every unknown key of the file, in file order: `None` when there is none or when the file
/// does not have the expected shape (the typed parse then reports what is wrong).
pub(crate) fn unknown_keys(text: &str, path: Option<&Path>) -> Option<ConfigError> {
    let top: Keys = toml::from_str(text).ok()?;
    let tree: KeyTree = toml::from_str(text).ok()?;
    let mut found = Vec::new();
    found.extend(unknown_in(
        &top,
        TOP_KEYS,
        "",
        "a lab file has only [broker], [[host]], [overflow.slurm] and [web]",
    ));
    if let Some(overflow) = &tree.overflow {
        found.extend(unknown_in(
            overflow,
            OVERFLOW_KEYS,
            "overflow.",
            "the lab can overflow onto: [overflow.slurm]",
        ));
        let slurm = toml::from_str::<SlurmTree>(text).ok();
        if let Some(slurm) = slurm.and_then(|t| t.overflow).and_then(|o| o.slurm) {
            found.extend(unknown_in(
                &slurm,
                SLURM_KEYS,
                "overflow.slurm.",
                &expected(SLURM_KEYS),
            ));
        }
    }
    if let Some(web) = &tree.web {
        found.extend(unknown_in(web, WEB_KEYS, "web.", &expected(WEB_KEYS)));
    }
    if let Some(broker) = &tree.broker {
        found.extend(unknown_in(
            broker,
            BROKER_KEYS,
            "broker.",
            &expected(BROKER_KEYS),
        ));
    }
    for (i, host) in tree.host.iter().enumerate() {
        found.extend(unknown_in(
            host,
            HOST_KEYS,
            &format!("host[{i}]."),
            &expected(HOST_KEYS),
        ));
    }
    found.sort_by_key(|(offset, _, _)| *offset);
    let mut errors = found.into_iter().map(|(offset, key, help)| {
        let name = key.rsplit('.').next().unwrap_or(&key).to_string();
        ConfigError::at(text, path, Some(offset), &key).msg(format!("unknown field `{name}`"), help)
    });
    let first = errors.next()?;
    Some(first.with_more(errors.collect()))
}

/// (offset, dotted key, help) of each key of `table` not in `known`.
fn unknown_in(
    table: &Keys,
    known: &[&str],
    prefix: &str,
    help: &str,
) -> Vec<(usize, String, String)> {
    table
        .keys()
        .filter(|k| !known.contains(&k.get_ref().as_str()))
        .map(|k| {
            let help = match suggestion(k.get_ref(), known) {
                Some(s) => format!("did you mean `{s}`? ({help})"),
                None => format!("remove the key or fix its spelling ({help})"),
            };
            (k.span().start, format!("{prefix}{}", k.get_ref()), help)
        })
        .collect()
}

fn expected(keys: &[&str]) -> String {
    format!("the keys here are: {}", keys.join(", "))
}

/// A known key one or two edits away (a typo), if there is one.
fn suggestion<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(cur)
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_key_is_a_field_of_the_raw_file() {
        let mut text = String::from("[broker]\n");
        for key in BROKER_KEYS {
            let value = match *key {
                k if k.ends_with("_s") => "1.0",
                k if k.starts_with("trace_") => "1",
                k if k.ends_with("_command") || k == "job_shell" => "[\"x\"]",
                _ => "\"x\"",
            };
            text.push_str(&format!("{key} = {value}\n"));
        }
        text.push_str("[[host]]\nname = \"n\"\naddress = \"a\"\nlabels = [\"l\"]\nowner = \"o\"\n");
        assert_eq!(HOST_KEYS, ["name", "address", "labels", "owner"]);
        text.push_str("[overflow.slurm]\n");
        for key in SLURM_KEYS {
            let value = match *key {
                k if k.ends_with("_s") => "1.0",
                "max_nodes" => "1",
                "partition" => "\"x\"",
                _ => "[\"x\"]",
            };
            text.push_str(&format!("{key} = {value}\n"));
        }
        let raw: Result<crate::raw::RawLab, _> = toml::from_str(&text);
        assert!(raw.is_ok(), "{raw:?}");
        assert!(unknown_keys(&text, None).is_none());
    }

    #[test]
    fn suggestions_are_close_spellings_only() {
        assert_eq!(suggestion("adress", HOST_KEYS), Some("address"));
        assert_eq!(suggestion("colour", HOST_KEYS), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
