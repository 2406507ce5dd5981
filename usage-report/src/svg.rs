//! The utilization chart as SVG text: a title, stacked areas of the hosts in each state
//! over time (average hosts per bucket) with a time axis and a host axis, a legend with
//! each state's share, then one row per host coloured by its main state in each bucket.
//!
//! Everything drawn is also written as data, so a program (or a test) can check it against
//! `rb policy replay`'s host-seconds without reading pixels:
//! - `<svg data-from-unix-ms data-until-unix-ms data-buckets>`;
//! - `<desc>`: one JSON object, `{"host_s": {"lent": …, …}, "hosts": N, …}`;
//! - each area `<path class="area" data-state="lent" data-host-s="…">`;
//! - each row `<g class="host-row" data-host="NAME" data-lent-s="…" data-free-s="…" …>`.
//!
//! Text from the trace (host names) and the title are escaped.

use std::fmt::Write as _;

use allocation::{
    usage_series::{HostRow, Series},
    ByUse, HostUse,
};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 44.0;
const AREA_H: f64 = 220.0;
const ROW_H: f64 = 14.0;
const LEGEND_H: f64 = 56.0;

/// What to draw and how to label it.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    pub title: &'a str,
    pub series: &'a Series,
    /// Offset of the times printed on the axis from UTC, seconds.
    pub utc_offset_s: i64,
}

/// The colour of each state (the status page uses the same).
fn colour(state: HostUse) -> &'static str {
    match state {
        HostUse::Lent => "#1565c0",
        HostUse::Free => "#2e7d32",
        HostUse::Owner => "#6a1b9a",
        HostUse::Drained => "#616161",
        HostUse::Down => "#c62828",
    }
}

/// What the legend calls each state.
fn label(state: HostUse) -> &'static str {
    match state {
        HostUse::Lent => "lent to jobs",
        HostUse::Free => "free",
        HostUse::Owner => "owner's own use",
        HostUse::Drained => "drained",
        HostUse::Down => "down",
    }
}

/// The whole SVG document.
pub fn render(chart: &Chart) -> String {
    let s = chart.series;
    let rows_h = ROW_H * s.hosts.len() as f64 + if s.hosts_left_out > 0 { ROW_H } else { 0.0 };
    let height = TOP + AREA_H + 30.0 + LEGEND_H + rows_h + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"utilization\" width=\"{WIDTH}\" \
         height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" \
         font-size=\"11\" data-from-unix-ms=\"{:.0}\" data-until-unix-ms=\"{:.0}\" \
         data-buckets=\"{}\">",
        s.from_unix_ms,
        s.until_unix_ms(),
        s.total.len()
    );
    let _ = writeln!(out, "<title>{}</title>", escape(chart.title));
    let _ = writeln!(out, "<desc>{}</desc>", escape_text(&desc(s)));
    let _ = writeln!(
        out,
        "<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"#fff\"/>\n\
         <text x=\"{}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>",
        LEFT,
        escape(chart.title)
    );
    areas(&mut out, s);
    axes(&mut out, s, chart.utc_offset_s);
    legend(&mut out, s, TOP + AREA_H + 30.0);
    rows(&mut out, s, TOP + AREA_H + 30.0 + LEGEND_H);
    out.push_str("</svg>\n");
    out
}

/// A chart-sized SVG saying `text` instead (no trace to draw, say).
pub fn message(text: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"utilization empty\" width=\"{WIDTH}\" \
         height=\"40\" viewBox=\"0 0 {WIDTH} 40\" font-family=\"sans-serif\" font-size=\"12\">\
         <text x=\"{LEFT}\" y=\"24\">{}</text></svg>\n",
        escape(text)
    )
}

/// The totals, as JSON: host-seconds per state, the window and the hosts.
fn desc(s: &Series) -> String {
    let sum = s.sum();
    let host_s: serde_json::Map<String, serde_json::Value> = HostUse::ALL
        .iter()
        .map(|st| (st.name().to_string(), serde_json::json!(sum.get(*st))))
        .collect();
    serde_json::json!({
        "host_s": host_s,
        "from_unix_ms": s.from_unix_ms,
        "until_unix_ms": s.until_unix_ms(),
        "bucket_s": s.bucket_ms / 1000.0,
        "hosts": s.hosts.len() + s.hosts_left_out,
        "host_rows": s.hosts.len(),
    })
    .to_string()
}

fn plot_w() -> f64 {
    WIDTH - LEFT - RIGHT
}

/// The y scale: whole hosts, at least 1.
fn scale_hosts(s: &Series) -> f64 {
    // A hair above a whole number is float rounding, not one more host.
    (s.peak_hosts() - 1e-6).ceil().max(1.0)
}

/// One stacked area per state: average hosts in that state in each bucket, as steps.
fn areas(out: &mut String, s: &Series) {
    let n = s.total.len();
    if n == 0 {
        return;
    }
    let secs = s.bucket_ms / 1000.0;
    let (bw, max) = (plot_w() / n as f64, scale_hosts(s));
    let y = |hosts: f64| TOP + AREA_H - hosts / max * AREA_H;
    let mut below = vec![0.0; n];
    let sum = s.sum();
    for state in HostUse::ALL {
        let above: Vec<f64> = (0..n)
            .map(|b| below[b] + s.total[b].get(state) / secs)
            .collect();
        let mut d = String::new();
        for (b, top) in above.iter().enumerate() {
            let x = LEFT + b as f64 * bw;
            let _ = write!(
                d,
                "{}{x:.2},{:.2}H{:.2}",
                if b == 0 { "M" } else { "L" },
                y(*top),
                x + bw
            );
        }
        for b in (0..n).rev() {
            let x = LEFT + b as f64 * bw;
            let _ = write!(d, "L{:.2},{:.2}H{x:.2}", x + bw, y(below[b]));
        }
        let _ = writeln!(
            out,
            "<path class=\"area\" data-state=\"{}\" data-host-s=\"{}\" fill=\"{}\" d=\"{d}Z\"/>",
            state.name(),
            sum.get(state),
            colour(state)
        );
        below = above;
    }
}

/// The host axis (left), the time axis (bottom) and their ticks.
fn axes(out: &mut String, s: &Series, utc_offset_s: i64) {
    let (bottom, max) = (TOP + AREA_H, scale_hosts(s));
    let _ = writeln!(
        out,
        "<g class=\"axes\" stroke=\"#333\"><line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{bottom}\"/>\
         <line x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\"/></g>",
        WIDTH - RIGHT
    );
    let step = nice_step(max / 5.0).max(1.0);
    let mut v = 0.0;
    while v <= max + 1e-9 {
        let yv = bottom - v / max * AREA_H;
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{yv:.2}\" x2=\"{LEFT}\" y2=\"{yv:.2}\" stroke=\"#333\"/>\
             <text x=\"{}\" y=\"{:.2}\" text-anchor=\"end\">{v}</text>",
            LEFT - 4.0,
            LEFT - 6.0,
            yv + 4.0
        );
        v += step;
    }
    let _ = writeln!(
        out,
        "<text x=\"{x:.0}\" y=\"{y:.0}\" transform=\"rotate(-90 {x:.0} {y:.0})\" text-anchor=\"middle\">hosts</text>",
        x = LEFT - 34.0,
        y = TOP + AREA_H / 2.0,
    );
    time_ticks(out, s, utc_offset_s);
}

/// Ticks on the time axis at round times, labelled in local time.
fn time_ticks(out: &mut String, s: &Series, utc_offset_s: i64) {
    let (from, until) = (s.from_unix_ms, s.until_unix_ms());
    let span_s = (until - from) / 1000.0;
    let step_s = TIME_STEPS_S
        .iter()
        .copied()
        .find(|st| span_s / *st <= 8.0)
        .unwrap_or(86_400.0 * 7.0);
    let offset = utc_offset_s as f64;
    let mut t = ((from / 1000.0 + offset) / step_s).ceil() * step_s - offset;
    let bottom = TOP + AREA_H;
    while t * 1000.0 <= until && span_s > 0.0 {
        let x = LEFT + (t * 1000.0 - from) / (until - from) * plot_w();
        let _ = writeln!(
            out,
            "<line x1=\"{x:.2}\" y1=\"{bottom}\" x2=\"{x:.2}\" y2=\"{}\" stroke=\"#333\"/>\
             <text x=\"{x:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            bottom + 4.0,
            bottom + 16.0,
            clock(t as i64 + utc_offset_s, step_s, span_s)
        );
        t += step_s;
    }
    let zone = match utc_offset_s {
        0 => "UTC".to_string(),
        o => format!(
            "UTC{}{:02}:{:02}",
            if o < 0 { '-' } else { '+' },
            o.abs() / 3600,
            o.abs() % 3600 / 60
        ),
    };
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">time ({zone})</text>",
        WIDTH - RIGHT,
        bottom + 28.0
    );
}

const TIME_STEPS_S: [f64; 16] = [
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 10_800.0,
    21_600.0, 86_400.0,
];

/// `HH:MM` (`HH:MM:SS` for steps under a minute; `MM-DD` first for spans over a day).
fn clock(local_s: i64, step_s: f64, span_s: f64) -> String {
    let (days, secs) = (local_s.div_euclid(86_400), local_s.rem_euclid(86_400));
    let hm = format!("{:02}:{:02}", secs / 3600, secs % 3600 / 60);
    if step_s < 60.0 {
        format!("{hm}:{:02}", secs % 60)
    } else if span_s > 86_400.0 {
        let (_, month, day) = localtime::civil_from_days(days);
        format!("{month:02}-{day:02} {hm}")
    } else {
        hm
    }
}

/// 1, 2 or 5 times a power of ten, at least `x`.
fn nice_step(x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * p)
}

/// A swatch and each state's share of the host-seconds, then the totals.
fn legend(out: &mut String, s: &Series, y: f64) {
    let sum = s.sum();
    let all = sum.total();
    let _ = writeln!(out, "<g class=\"legend\">");
    let mut x = LEFT;
    for state in HostUse::ALL {
        let pct = if all > 0.0 {
            100.0 * sum.get(state) / all
        } else {
            0.0
        };
        let text = format!("{} {pct:.1} %", label(state));
        let _ = writeln!(
            out,
            "<rect x=\"{x:.0}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.0}\" y=\"{}\" data-state=\"{}\">{}</text>",
            y + 10.0,
            colour(state),
            x + 16.0,
            y + 20.0,
            state.name(),
            escape(&text)
        );
        x += 16.0 + 6.5 * text.chars().count() as f64 + 18.0;
    }
    let secs = (s.until_unix_ms() - s.from_unix_ms) / 1000.0;
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{}\">{} over {}</text></g>",
        y + 42.0,
        amount(all, "host-"),
        amount(secs, "")
    );
}

/// `3.2 hours`, `12.5 minutes`, `0.8 seconds` (with `host-` before the unit when asked).
fn amount(secs: f64, prefix: &str) -> String {
    let (value, unit) = if secs >= 3600.0 {
        (secs / 3600.0, "hours")
    } else if secs >= 60.0 {
        (secs / 60.0, "minutes")
    } else {
        (secs, "seconds")
    };
    format!("{value:.1} {prefix}{unit}")
}

/// One row per host: its main state in each bucket, runs of one state as one rectangle.
fn rows(out: &mut String, s: &Series, y0: f64) {
    let n = s.total.len();
    let bw = if n > 0 { plot_w() / n as f64 } else { 0.0 };
    for (i, row) in s.hosts.iter().enumerate() {
        let y = y0 + i as f64 * ROW_H;
        let sum = row.sum();
        let _ = write!(
            out,
            "<g class=\"host-row\" data-host=\"{}\"",
            escape(&row.name)
        );
        for state in HostUse::ALL {
            let _ = write!(out, " data-{}-s=\"{}\"", state.name(), sum.get(state));
        }
        let _ = writeln!(
            out,
            "><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            y + ROW_H - 3.0,
            escape(&row.name)
        );
        for (from, to, state) in runs(row) {
            let _ = writeln!(
                out,
                "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{}\" fill=\"{}\" data-state=\"{}\"/>",
                LEFT + from as f64 * bw,
                (to - from) as f64 * bw,
                ROW_H - 2.0,
                colour(state),
                state.name()
            );
        }
        out.push_str("</g>\n");
    }
    if s.hosts_left_out > 0 {
        let _ = writeln!(
            out,
            "<text x=\"{LEFT}\" y=\"{:.1}\">… and {} more host(s), counted in the areas above</text>",
            y0 + s.hosts.len() as f64 * ROW_H + ROW_H - 3.0,
            s.hosts_left_out
        );
    }
}

/// Runs of buckets (`from..to`) with the same main state; buckets with no time are skipped.
fn runs(row: &HostRow) -> Vec<(usize, usize, HostUse)> {
    let mut out: Vec<(usize, usize, HostUse)> = Vec::new();
    for (b, bucket) in row.buckets.iter().enumerate() {
        let Some(state) = main_state(bucket) else {
            continue;
        };
        match out.last_mut() {
            Some((_, to, st)) if *to == b && *st == state => *to = b + 1,
            _ => out.push((b, b + 1, state)),
        }
    }
    out
}

/// The state a bucket spent most time in (`None` for an empty bucket).
fn main_state(b: &ByUse) -> Option<HostUse> {
    HostUse::ALL
        .iter()
        .copied()
        .filter(|s| b.get(*s) > 0.0)
        .max_by(|x, y| b.get(*x).total_cmp(&b.get(*y)))
}

/// XML text escaping (element content: quotes stay readable).
fn escape_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// XML text and attribute escaping.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Not allowed in XML 1.0 at all: shown as the replacement character.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[path = "svg_tests.rs"]
mod tests;
