//! Log timestamps as Unix time: `YYYY-MM-DDTHH:MM:SS[.fraction]` (tracing's UTC stamps,
//! Slurm's local ones) read as a civil date and time, for benchmarks that time events
//! from several programs' logs.

/// `YYYY-MM-DDTHH:MM:SS[.fraction]` read as UTC, in nanoseconds since the epoch; `None`
/// when it is not that shape.
pub fn civil_ns(stamp: &str) -> Option<i128> {
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|s| s.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|s| s.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    let digits = frac.len().min(9);
    let frac_ns: i128 = frac.get(..digits)?.parse::<i128>().ok()? * 10i128.pow(9 - digits as u32);
    let secs = days_from_civil(y, m, day) * 86_400 + h * 3600 + min * 60 + s;
    Some(i128::from(secs) * 1_000_000_000 + frac_ns)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_read_as_unix_nanoseconds() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(
            civil_ns("2026-11-27T13:19:35.123456"),
            Some(1_795_785_575_123_456_000)
        );
        assert_eq!(
            civil_ns("2026-11-27T13:19:35"),
            Some(1_795_785_575_000_000_000)
        );
        for bad in ["", "2026-11-27", "2026-11-27T13:19", "x-1-1T0:0:0"] {
            assert_eq!(civil_ns(bad), None, "{bad}");
        }
    }
}
