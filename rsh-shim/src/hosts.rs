//! Which kind of host a call names: symbolic (`anyLinux`), one already allocated to the job
//! (listed in `RB_HOSTS_FILE`), or any other host (pass-through).

use std::io;
use std::path::Path;

pub use proto::symbolic::is_symbolic;

/// Whether `content` (lines `NAME ADDRESS ALLOC`) lists `host` as a NAME (any case) or an
/// ADDRESS. Blank lines and `#` comments are skipped.
pub fn hosts_list_contains(content: &str, host: &str) -> bool {
    content
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .any(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next().unwrap_or_default();
            let address = fields.next().unwrap_or_default();
            name.eq_ignore_ascii_case(host) || address == host
        })
}

/// Whether the hosts file at `path` lists `host`. A missing file lists nothing (the agent
/// writes it at the first grant); any other read error is reported.
pub fn hosts_file_lists(path: &Path, host: &str) -> io::Result<bool> {
    match std::fs::read_to_string(path) {
        Ok(content) => Ok(hosts_list_contains(&content, host)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "# name address alloc\nnode03 10.77.0.3 7\n\n  node04\t10.77.0.4  8\n";

    #[test]
    fn hosts_list_matches_name_or_address() {
        assert!(hosts_list_contains(LIST, "node03"));
        assert!(hosts_list_contains(LIST, "NODE03"));
        assert!(hosts_list_contains(LIST, "10.77.0.4"));
        assert!(hosts_list_contains(LIST, "node04"));
        assert!(!hosts_list_contains(LIST, "node05"));
        assert!(!hosts_list_contains(LIST, "7"));
        assert!(!hosts_list_contains(LIST, "#"));
        assert!(!hosts_list_contains("", "node03"));
    }

    #[test]
    fn hosts_file_missing_is_empty_and_present_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        assert!(!hosts_file_lists(&path, "node03").expect("missing is fine"));
        std::fs::write(&path, LIST).expect("write");
        assert!(hosts_file_lists(&path, "node03").expect("read"));
        assert!(
            hosts_file_lists(dir.path(), "node03").is_err(),
            "a directory is an error"
        );
    }
}
