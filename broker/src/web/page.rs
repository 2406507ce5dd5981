//! The status page at `/`: server-rendered HTML (the lab as a grid of hosts coloured by
//! state, the waiting requests with their reasons, the utilization chart of the last hours
//! inline), and a small script that refreshes it from `/api/status` and `/api/usage.svg`
//! every few seconds. Public: it shows only what `/api/status` does (host states, holding
//! job ids, wait reasons; no users, command lines or directories) and the chart (host
//! states over time).

use serde_json::Value;

/// How often the page refreshes, milliseconds.
const REFRESH_MS: u32 = 3000;

/// The page, rendered from the `/api/status` document and the chart (our own SVG text).
pub fn render(status: &Value, chart: &str) -> String {
    let mut grid = String::new();
    for h in status["hosts"].as_array().into_iter().flatten() {
        grid.push_str(&cell(h));
    }
    let mut waiting = String::new();
    for w in status["waiting"].as_array().into_iter().flatten() {
        waiting.push_str(&waiting_row(w));
    }
    PAGE.replace("@SUMMARY@", &escape(&summary(status)))
        .replace("@GRID@", &grid)
        .replace("@WAITING@", &waiting)
        .replace("@USAGE@", chart)
        .replace("@REFRESH_MS@", &REFRESH_MS.to_string())
}

/// What a host cell shows: its class (colour) and the line under its name.
fn class_and_label(h: &Value) -> (String, String) {
    let alloc = h["alloc_state"].as_str().unwrap_or("");
    let holder = h["held_by"].as_u64();
    if h["state"] == "down" {
        return ("down".into(), "down".into());
    }
    match (alloc, holder) {
        ("releasing" | "reserved", Some(j)) => {
            ("releasing".into(), format!("taken back from job {j}"))
        }
        ("draining", Some(j)) => ("drained".into(), format!("draining, job {j}")),
        (_, Some(j)) => ("held".into(), format!("job {j}")),
        ("drained", None) => ("drained".into(), "drained".into()),
        _ if h["owner_active"] == true => ("owner".into(), "owner active".into()),
        _ => ("free".into(), "free".into()),
    }
}

fn cell(h: &Value) -> String {
    let (class, label) = class_and_label(h);
    let name = h["name"].as_str().unwrap_or("?");
    format!(
        "<div class=\"host {class}\" data-host=\"{n}\"><b>{n}</b><span>{l}</span></div>",
        n = escape(name),
        l = escape(&label)
    )
}

fn waiting_row(w: &Value) -> String {
    format!(
        "<tr data-job=\"{}\"><td>{}</td><td>{}</td><td class=\"code\">{}</td><td>{}</td></tr>",
        w["job"],
        w["job"],
        escape(w["symbolic"].as_str().unwrap_or("")),
        escape(w["reason_code"].as_str().unwrap_or("")),
        escape(w["reason"].as_str().unwrap_or(""))
    )
}

fn summary(status: &Value) -> String {
    let hosts = status["hosts"].as_array().map_or(0, Vec::len);
    let held = status["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| !h["held_by"].is_null())
        .count();
    let waiting = status["waiting"].as_array().map_or(0, Vec::len);
    format!("{hosts} hosts, {held} lent to jobs, {waiting} requests waiting")
}

/// HTML text and attribute escaping.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ResourceBroker: the lab</title>
<style>
body{font-family:sans-serif;margin:1.5em;color:#222}
#grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(9em,1fr));gap:.4em}
.host{border-radius:.3em;padding:.4em;color:#fff}.host b,.host span{display:block}
.free{background:#2e7d32}.held{background:#1565c0}.releasing{background:#ef6c00}
.owner{background:#6a1b9a}.drained{background:#616161}.down{background:#c62828}
table{border-collapse:collapse}td,th{border-bottom:1px solid #ccc;padding:.2em .6em;text-align:left}
</style></head>
<body>
<h1>The lab</h1>
<p id="summary">@SUMMARY@</p>
<div id="grid">@GRID@</div>
<h2>Waiting requests</h2>
<table><thead><tr><th>job</th><th>asks for</th><th>code</th><th>why it waits</th></tr></thead>
<tbody id="waiting">@WAITING@</tbody></table>
<h2>Utilization</h2>
<div id="usage">@USAGE@</div>
<script>
"use strict";
function label(h){
  if(h.state==="down")return["down","down"];
  const j=h.held_by;
  if(j!==null&&(h.alloc_state==="releasing"||h.alloc_state==="reserved"))return["releasing","taken back from job "+j];
  if(j!==null&&h.alloc_state==="draining")return["drained","draining, job "+j];
  if(j!==null)return["held","job "+j];
  if(h.alloc_state==="drained")return["drained","drained"];
  if(h.owner_active)return["owner","owner active"];
  return["free","free"];
}
function el(tag,cls,text){const e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;return e;}
function render(s){
  const grid=document.getElementById("grid");grid.replaceChildren();
  let held=0;
  for(const h of s.hosts){
    const [cls,text]=label(h);if(h.held_by!==null)held++;
    const d=el("div","host "+cls);d.dataset.host=h.name;d.append(el("b","",h.name),el("span","",text));grid.append(d);
  }
  const tb=document.getElementById("waiting");tb.replaceChildren();
  for(const w of s.waiting){
    const tr=el("tr");tr.dataset.job=String(w.job);
    tr.append(el("td","",String(w.job)),el("td","",w.symbolic),el("td","code",w.reason_code),el("td","",w.reason));tb.append(tr);
  }
  document.getElementById("summary").textContent=s.hosts.length+" hosts, "+held+" lent to jobs, "+s.waiting.length+" requests waiting";
  document.body.dataset.refreshed=String(Number(document.body.dataset.refreshed||0)+1);
}
let lastChart=null;
async function chart(){try{const r=await fetch("/api/usage.svg",{cache:"no-store"});if(!r.ok)return;const t=await r.text();const u=document.getElementById("usage");if(t!==lastChart){u.innerHTML=t;lastChart=t;}u.dataset.refreshed=String(Number(u.dataset.refreshed||0)+1);}catch(e){}}
async function refresh(){try{const r=await fetch("/api/status",{cache:"no-store"});if(r.ok)render(await r.json());}catch(e){}chart();}
refresh();setInterval(refresh,@REFRESH_MS@);
</script>
</body></html>
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_show_state_and_holder_and_names_are_escaped() {
        let status = serde_json::json!({
            "hosts": [
                {"name": "n1", "state": "up", "alloc_state": "held", "held_by": 7, "owner_active": false},
                {"name": "<n2>", "state": "down", "alloc_state": "free", "held_by": null, "owner_active": false},
            ],
            "waiting": [{"job": 8, "symbolic": "anyLinux", "reason_code": "all_held", "reason": "1 matching host(s): 1 held by jobs"}],
        });
        let page = render(&status, "<svg class=\"utilization\"></svg>");
        assert!(
            page.contains(
                r#"<div class="host held" data-host="n1"><b>n1</b><span>job 7</span></div>"#
            ),
            "{page}"
        );
        assert!(
            page.contains("&lt;n2&gt;") && !page.contains("<n2>"),
            "{page}"
        );
        assert!(page.contains(r#"<td class="code">all_held</td>"#), "{page}");
        assert!(
            page.contains(r#"<div id="usage"><svg class="utilization"></svg></div>"#),
            "{page}"
        );
        assert!(
            page.contains("2 hosts, 1 lent to jobs, 1 requests waiting"),
            "{page}"
        );
    }
}
