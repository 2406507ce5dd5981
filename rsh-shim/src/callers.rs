//! What particular rsh callers read from a refused call, beyond our stderr line and exit 1.
//!
//! PVM 3.4's hoster (the master pvmd's `pvmd'`, `pl_startup` in hoster.c) starts a slave
//! with `rsh HOST 'PVM_DPATH -s -d0xMASK -nNAME MASTER ADDR MTU HOSTNUM ADDR'` and reads
//! its stdout for a line that begins with `ddpro`. When stdout ends without one, it starts
//! the whole attempt again with the Windows command (`%PVM_ROOT%\lib\WIN32\pvmd3.exe …`),
//! unless the host has `dx=` in a host file: a second fork of the hoster (which closes
//! every descriptor up to the limit first), a second shim, a second refusal. A `ddpro` line
//! ends the attempt at once: the master's `startack()` finds no version in it, logs
//! `startack() host NAME expected version, got "…"` and reports `PvmCantStart`, exactly
//! what the console and `pvm_addhosts` report without the line. A refused phase-1 start
//! (DESIGN.md flow 6) is then one shim call instead of two, and PVM's add lock
//! ("Already in progress") is free for the module's phase-2 add that much sooner.

/// How a refusal's stdout line for PVM begins.
pub const PVM_REFUSAL: &str = "ddpro<refused-by-the-rsh-shim>";

/// The stdout line for a refused `command`, when its caller reads the refusal there.
pub fn refusal_stdout(command: &[String], host: &str, message: &str) -> Option<String> {
    is_pvm_slave_start(command).then(|| {
        // Never exactly five words: five would be parsed as a (mismatched) version. PVM's
        // log keeps the first word: `expected version, got "ddpro<refused-by-the-rsh-shim"`.
        let line = format!("{PVM_REFUSAL} no pvmd was started on {host}: {message}");
        line.replace(['\n', '\r'], " ")
    })
}

/// `PATH -s|-S -dMASK -nNAME …`: the command PVM's master builds for a slave pvmd
/// (`addhosts()` in ddpro.c), whatever PVM_DPATH says. PVM passes it as one word.
fn is_pvm_slave_start(command: &[String]) -> bool {
    let words: Vec<&str> = command.iter().flat_map(|w| w.split_whitespace()).collect();
    matches!(
        words.as_slice(),
        [_, "-s" | "-S", mask, name, ..] if mask.starts_with("-d") && name.starts_with("-n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    const PVM_START: &str =
        "/usr/lib/pvm3/lib/pvmd -s -d0x0 -nanyLinux 1 0a4d4602:8a2f 4080 2 7f4d0102:0000";

    #[test]
    fn a_pvm_slave_start_gets_a_ddpro_line_with_more_than_five_words() {
        let line = refusal_stdout(&words(&[PVM_START]), "anyLinux", "request recorded")
            .expect("a PVM start");
        assert!(line.starts_with("ddpro<refused-by-the-rsh-shim> "));
        assert!(line.split_whitespace().count() > 5);
        assert!(line.contains("anyLinux: request recorded"));
        for message in ["x", ""] {
            let line = refusal_stdout(&words(&[PVM_START]), "anyLinux", message).expect("short");
            assert!(line.split_whitespace().count() > 5, "{line}");
        }
    }

    #[test]
    fn the_command_may_come_split_and_with_any_pvmd_path_or_the_windows_one() {
        let split: Vec<String> = PVM_START.split(' ').map(String::from).collect();
        assert!(refusal_stdout(&split, "anyLinux", "m").is_some());
        let windows = words(&[r"%PVM_ROOT%\lib\WIN32\pvmd3.exe -S -d0x4 -nx 1 a 4080 2 b"]);
        assert!(refusal_stdout(&windows, "x", "m").is_some());
    }

    #[test]
    fn the_message_stays_on_one_line() {
        let line = refusal_stdout(&words(&[PVM_START]), "h", "two\nlines").expect("pvm");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn other_commands_get_nothing_on_stdout() {
        for command in [
            vec!["echo YES"],
            vec!["hboot", "-t", "-c", "lam-conf.lamd", "-I", "-H 10.0.0.1"],
            vec!["pvmd", "-s"],
            vec!["/usr/lib/pvm3/lib/pvmd -s -x -nfoo"],
            vec![],
        ] {
            let got = refusal_stdout(&words(&command), "anyLinux", "m");
            assert_eq!(got, None, "{command:?}");
        }
    }
}
