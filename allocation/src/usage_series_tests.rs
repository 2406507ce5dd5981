//! Tests of the usage time series: buckets summing to the spans they cut, the window's crop
//! and a live lab drawn up to now, an empty timeline.

use super::*;

fn span(host: usize, state: HostUse, from_unix_ms: f64, seconds: f64) -> Span {
    Span {
        host,
        state,
        from_unix_ms,
        seconds,
    }
}

fn timeline() -> Timeline {
    Timeline {
        hosts: vec!["b".into(), "a".into()],
        spans: vec![
            span(0, HostUse::Free, 0.0, 4.0),
            span(0, HostUse::Lent, 4_000.0, 6.0),
            span(1, HostUse::Down, 0.0, 10.0),
        ],
        last: vec![Some(HostUse::Lent), Some(HostUse::Down)],
        first_unix_ms: Some(0.0),
        last_unix_ms: Some(10_000.0),
    }
}

#[test]
fn buckets_sum_to_the_spans_and_split_where_a_span_crosses() {
    let opts = SeriesOptions {
        buckets: 4,
        ..SeriesOptions::default()
    };
    let s = series(&timeline(), &opts);
    assert_eq!((s.from_unix_ms, s.bucket_ms), (0.0, 2_500.0));
    assert_eq!(s.sum().get(HostUse::Lent), 6.0);
    assert_eq!(s.sum().get(HostUse::Free), 4.0);
    assert_eq!(s.sum().get(HostUse::Down), 10.0);
    // Bucket 1 (2.5–5 s): b free 1.5 s then lent 1 s.
    assert_eq!(s.total[1].get(HostUse::Free), 1.5);
    assert_eq!(s.total[1].get(HostUse::Lent), 1.0);
    assert_eq!(s.peak_hosts(), 2.0);
    let names: Vec<&str> = s.hosts.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "b"], "rows by name");
    assert_eq!(s.hosts[1].sum().get(HostUse::Lent), 6.0);
}

#[test]
fn a_window_crops_and_a_live_lab_is_drawn_up_to_now() {
    let opts = SeriesOptions {
        buckets: 2,
        from_unix_ms: Some(5_000),
        until_unix_ms: Some(20_000),
        max_host_rows: 1,
    };
    let s = series(&timeline(), &opts);
    // 5–10 s recorded, 10–20 s each host in its last state.
    assert_eq!(s.sum().get(HostUse::Lent), 15.0);
    assert_eq!(s.sum().get(HostUse::Down), 15.0);
    assert_eq!(s.sum().get(HostUse::Free), 0.0);
    assert_eq!((s.hosts.len(), s.hosts_left_out), (1, 1));
    assert_eq!(s.until_unix_ms(), 20_000.0);
}

#[test]
fn an_empty_timeline_gives_empty_buckets() {
    let s = series(&Timeline::default(), &SeriesOptions::default());
    assert_eq!(s.sum().total(), 0.0);
    assert_eq!(s.peak_hosts(), 0.0);
}
