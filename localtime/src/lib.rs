//! The local time zone's offset from UTC, from the C library's `localtime_r` (which reads
//! `TZ` and the zone files as every other program on the machine does). The one `unsafe`
//! call the broker (the policy's wall clock), `rb` (`rb jobs` times) and the benchmarks
//! (Slurm's local-time log stamps) share; and the civil date of a day number, which `rb`'s
//! tables and the utilization chart's time axis print.

/// The local time zone's offset from UTC at `t` (seconds since the epoch), in seconds;
/// `None` when the C library cannot tell (or `t` does not fit its `time_t`).
// time_t and tm_gmtoff are i64 here, narrower on some 32-bit targets.
#[allow(clippy::useless_conversion)]
pub fn utc_offset_s(t: i64) -> Option<i64> {
    let t: libc::time_t = t.try_into().ok()?;
    // SAFETY: an all-zero `tm` is a valid value of this plain C struct.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals for the call, which keeps neither;
    // localtime_r is the thread-safe variant (no shared static buffer).
    let done = unsafe { libc::localtime_r(&t, &mut tm) };
    (!done.is_null()).then_some(i64::from(tm.tm_gmtoff))
}

/// Seconds since the epoch now (0 before it).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The local time zone's offset from UTC now, in seconds (0 when it cannot be read).
pub fn utc_offset_now_s() -> i64 {
    utc_offset_s(unix_now()).unwrap_or(0)
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offset is within a day, and whole minutes in every zone in use.
    #[test]
    fn the_offset_is_a_whole_number_of_minutes_within_a_day() {
        let offset = utc_offset_s(unix_now()).expect("an offset");
        assert!(offset.abs() < 86_400, "{offset}");
        assert_eq!(offset % 60, 0, "{offset}");
    }
}
