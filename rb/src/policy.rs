//! `rb policy show|reload|explain`: asking the broker about its allocation policy, and
//! rendering the answers for people (`--json` prints them as the broker sent them).
//! `rb policy check FILE` needs no broker and lives in `main.rs`.

use std::process::ExitCode;

use proto::msg::{PolicyInfo, Request, Response};
use serde_json::Value;

use crate::{client, table};

/// `rb policy show [--json]`.
pub async fn show(
    target: &client::Target,
    json: bool,
    utc_offset_s: i64,
) -> anyhow::Result<ExitCode> {
    let info = policy_answer(client::request(target, Request::PolicyShow).await?)?;
    if json {
        startup::outln!("{}", serde_json::to_string_pretty(&info)?)?;
    } else {
        startup::out!("{}", render_info(&info, utc_offset_s))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `rb policy reload`: the new policy's path and sha256; a refused file is an error (exit
/// 1) with the file's own `FILE:LINE:COL` message, and the old policy stays.
pub async fn reload(target: &client::Target) -> anyhow::Result<ExitCode> {
    let info = policy_answer(client::request(target, Request::PolicyReload).await?)?;
    startup::outln!("policy reloaded: {} sha256 {}", info.path, info.sha256)?;
    Ok(ExitCode::SUCCESS)
}

/// `rb policy explain HOST [--job ID] [--json]`.
pub async fn explain(
    target: &client::Target,
    host: String,
    job: Option<u64>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let req = Request::PolicyExplain { host, job };
    let explain = match client::request(target, req).await? {
        Response::Explain { explain } => explain,
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    };
    if json {
        startup::outln!("{}", serde_json::to_string_pretty(&explain)?)?;
    } else {
        startup::out!("{}", render_explain(&explain))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn policy_answer(resp: Response) -> anyhow::Result<PolicyInfo> {
    match resp {
        Response::Policy { policy } => Ok(policy),
        other => anyhow::bail!("unexpected answer from broker: {other:?}"),
    }
}

/// `rb policy show` for people.
pub fn render_info(info: &PolicyInfo, utc_offset_s: i64) -> String {
    let rows = vec![
        vec!["path".to_string(), info.path.clone()],
        vec!["sha256".to_string(), info.sha256.clone()],
        vec![
            "loaded".to_string(),
            table::clock(info.loaded_at_unix, utc_offset_s),
        ],
        vec!["summary".to_string(), info.summary.clone()],
        vec![
            "last reload error".to_string(),
            info.last_reload_error
                .as_deref()
                .map_or("none".to_string(), |e| e.replace('\n', "\n    ")),
        ],
    ];
    let mut out = String::new();
    for r in rows {
        out.push_str(&format!("{:<18} {}\n", r[0], r[1]));
    }
    out
}

/// `rb policy explain` for people: one block per hook, its inputs underneath.
pub fn render_explain(e: &Value) -> String {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let job = e["job"]
        .as_u64()
        .map_or("a new non-adaptive job (no --job)".into(), |j| {
            format!("job {j}")
        });
    let mut out = format!(
        "host {} for {}; policy {} (sha256 {})\n",
        s(&e["host"]),
        job,
        s(&e["policy_path"]),
        s(&e["policy_sha256"]).chars().take(12).collect::<String>()
    );
    let facts = &e["host_facts"];
    if facts.is_object() {
        out.push_str(&format!(
            "host: held_by = {}, held_for_s = {}, load1 = {}, job_load = {}, other_load = {}\n",
            s(&facts["held_by"]),
            s(&facts["held_for_s"]),
            s(&facts["load1"]),
            s(&facts["job_load"]),
            s(&facts["other_load"])
        ));
    }
    for h in e["hooks"].as_array().into_iter().flatten() {
        let origin = if h["set"].as_bool() == Some(true) {
            "file"
        } else {
            "default"
        };
        out.push_str(&format!(
            "\n{} = {}  ({origin}: {})\n",
            s(&h["key"]),
            s(&h["value"]),
            s(&h["expression"])
        ));
        if !h["error"].is_null() {
            out.push_str(&format!("  error: {}\n", s(&h["error"])));
        }
        for pair in h["inputs"].as_array().into_iter().flatten() {
            out.push_str(&format!("  {} = {}\n", s(&pair[0]), s(&pair[1])));
        }
    }
    out
}
