//! Harness of the `config` fuzz target: arbitrary bytes as a lab file, through what
//! `rb check`, `rb` and `rb-broker` do with one: [`LabConfig::parse`] (as `load` does once
//! the file is read as UTF-8), the error message with its file, line, key and `help:`, and
//! the warnings.
//!
//! Shared by the cargo-fuzz target (`fuzz_targets/`) and by `tests/tests/fuzz_smoke.rs`
//! (which includes this file). A panic anywhere is the bug; so is an error with an empty
//! message.

use std::path::Path;

use config::LabConfig;

/// One lab file.
pub fn lab_file(data: &[u8]) {
    // `LabConfig::load` reads with `read_to_string`: other bytes are an I/O error there.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match LabConfig::parse(text, Some(Path::new("lab.toml"))) {
        Ok(lab) => {
            for warning in lab.warnings() {
                assert!(!warning.to_string().is_empty(), "an empty warning");
            }
            for host in &lab.hosts {
                assert!(
                    lab.host(&host.name).is_some(),
                    "host {} not found by name",
                    host.name
                );
            }
            let _ = lab.source_name();
        }
        Err(e) => {
            assert!(e.count() > 0, "an error without errors");
            assert!(!e.to_string().is_empty(), "an error with an empty message");
            if let Some(line) = e.line {
                let lines = text.split('\n').count();
                assert!(
                    (1..=lines).contains(&line),
                    "line {line} of a {lines}-line file"
                );
            }
        }
    }
}
