//! The one string the real remote shell hands to the remote login shell when a command runs
//! under a subagent: `exec 'SUBAGENT' 'ARG'… -c 'COMMAND'`.
//!
//! Every word is single-quoted (a `'` inside becomes `'\''`), so the remote `sh` gives the
//! subagent exactly the words the agent sent, and the command arrives as one argument that the
//! subagent runs with `sh -c` — the same re-parse the caller expects from plain rsh.

/// `word` as one single-quoted POSIX shell word.
pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `exec` + the quoted subagent words + ` -c ` + the quoted command.
pub fn remote_command(subagent: &[String], command: &str) -> String {
    let mut out = String::from("exec");
    for word in subagent {
        out.push(' ');
        out.push_str(&shell_quote(word));
    }
    out.push_str(" -c ");
    out.push_str(&shell_quote(command));
    out
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn example_from_the_design() {
        let sub = words(&[
            "/opt/rb-subagent",
            "--agent",
            "10.77.0.2:4000",
            "--alloc",
            "7",
        ]);
        assert_eq!(
            remote_command(&sub, "pvmd -s -d0x0"),
            "exec '/opt/rb-subagent' '--agent' '10.77.0.2:4000' '--alloc' '7' -c 'pvmd -s -d0x0'"
        );
    }

    #[test]
    fn single_quotes_are_escaped() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    /// A stub subagent's command words: `sh` printing each further argument followed by a
    /// NUL byte, its `$0` a word that needs quoting. Not a script file: a file written and
    /// then run while another test thread forks fails now and then with "Text file busy"
    /// (the forked child holds the writer's descriptor until its own exec).
    fn stub() -> Vec<String> {
        words(&["/bin/sh", "-c", "printf '%s\\0' \"$@\"", "stub subagent's"])
    }

    fn run_sh(script: &str) -> Vec<String> {
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf8");
        let mut args: Vec<String> = text.split('\0').map(str::to_string).collect();
        assert_eq!(args.pop().as_deref(), Some(""), "output ends with NUL");
        args
    }

    #[test]
    fn round_trip_through_sh() {
        let nasty = "echo \"a b\" 'c'\\'' $HOME ${X:-y} `id` $(id); rm -rf /nope;\nline2 \\ \t* ? [x] ! # ~ & | < > \"";
        let mut sub = stub();
        sub.extend(words(&["--alloc", "7", "it's $x"]));
        let got = run_sh(&remote_command(&sub, nasty));
        assert_eq!(got, words(&["--alloc", "7", "it's $x", "-c", nasty]));
    }

    #[test]
    fn round_trip_of_caller_commands() {
        let sub = stub();
        for cmd in [
            "hboot -t -c lam-conf.lamd -d -s -I \"-H 10.77.0.1 -P 50367 -n 1 -o 0\"",
            "echo $SHELL",
            "\"/opt/mpich/bin/hydra_pmi_proxy\" --control-port node01:40123 --proxy-id 1",
            "",
        ] {
            assert_eq!(run_sh(&remote_command(&sub, cmd)), words(&["-c", cmd]));
        }
    }
}
