//! Tests of the utilization chart's SVG: areas and rows carrying the host-seconds, names
//! escaped, an empty series still drawn, round axis steps.

use allocation::{
    usage_series::{series, SeriesOptions},
    Span, Timeline,
};

use super::*;

fn timeline() -> Timeline {
    let span = |host, state, from_unix_ms, seconds| Span {
        host,
        state,
        from_unix_ms,
        seconds,
    };
    Timeline {
        hosts: vec!["<n1>".into(), "n2".into()],
        spans: vec![
            span(0, HostUse::Free, 1_000_000.0, 600.0),
            span(0, HostUse::Lent, 1_600_000.0, 3000.0),
            span(1, HostUse::Owner, 1_000_000.0, 1800.0),
            span(1, HostUse::Down, 2_800_000.0, 1800.0),
        ],
        last: vec![None, None],
        first_unix_ms: Some(1_000_000.0),
        last_unix_ms: Some(4_600_000.0),
    }
}

/// The values of `attr="…"` in `doc`, in order.
fn values<'a>(doc: &'a str, attr: &str) -> Vec<&'a str> {
    let key = format!(" {attr}=\"");
    doc.match_indices(&key)
        .map(|(i, _)| {
            let rest = &doc[i + key.len()..];
            &rest[..rest.find('"').expect("closing quote")]
        })
        .collect()
}

#[test]
fn the_areas_and_rows_carry_the_host_seconds_and_names_are_escaped() {
    let s = series(&timeline(), &SeriesOptions::default());
    let doc = render(&Chart {
        title: "lab <a> & b",
        series: &s,
        utc_offset_s: 3600,
    });
    assert!(
        doc.contains("<title>lab &lt;a&gt; &amp; b</title>"),
        "{doc}"
    );
    let states = values(&doc, "data-state");
    let host_s: Vec<f64> = values(&doc, "data-host-s")
        .iter()
        .map(|v| v.parse().expect("a number"))
        .collect();
    assert_eq!(&states[..5], ["lent", "free", "owner", "drained", "down"]);
    assert_eq!(host_s, [3000.0, 600.0, 1800.0, 0.0, 1800.0]);
    assert_eq!(values(&doc, "data-host"), ["&lt;n1&gt;", "n2"]);
    assert_eq!(values(&doc, "data-lent-s"), ["3000", "0"]);
    assert!(doc.contains("\"lent\":3000.0"), "desc: {doc}");
    assert!(doc.contains("time (UTC+01:00)"), "{doc}");
    // An hour from 00:16:40 UTC: ticks every 10 minutes, in local time.
    assert!(doc.contains(">01:20</text>"), "{doc}");
    assert!(!doc.contains("NaN") && !doc.contains("inf"), "{doc}");
}

#[test]
fn an_empty_series_still_draws_axes_and_legend() {
    let s = series(&Timeline::default(), &SeriesOptions::default());
    let doc = render(&Chart {
        title: "empty",
        series: &s,
        utc_offset_s: 0,
    });
    assert!(doc.contains("class=\"legend\""), "{doc}");
    assert!(!doc.contains("NaN") && !doc.contains("inf"), "{doc}");
}

#[test]
fn steps_are_round() {
    assert_eq!(nice_step(0.3), 0.5);
    assert_eq!(nice_step(3.0), 5.0);
    assert_eq!(nice_step(20.0), 20.0);
    assert_eq!(clock(3600 + 61, 60.0, 600.0), "01:01");
    assert_eq!(clock(86_400 * 31 + 60, 3600.0, 200_000.0), "02-01 00:01");
}
