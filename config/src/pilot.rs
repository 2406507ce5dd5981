//! A Slurm pilot job's batch script: `rb-hostd` on the node for the job's lease, reporting
//! to the broker as host `slurm-<node>`.
//!
//! The script is plain POSIX sh, so any node runs it. It runs `rb-hostd` with the lab
//! secret (a file the compute node reads from a shared file system, as the lab's hosts do)
//! as the job's one step (`exec srun`): Slurm signals a job's steps, not its batch shell,
//! when it takes the node back. The daemon names its Slurm job (`--slurm-job
//! $SLURM_JOB_ID`), so the broker knows which pilot the node is and reads the lease's end
//! from Slurm. Slurm's notices reach the daemon directly: the lease warning
//! (`--signal=USR1@…`, before the time limit) as SIGUSR1, and preemption (at once, with the
//! job's end moved to now + the partition's `GraceTime`) and `scancel` as SIGTERM. Either
//! way the daemon tells the broker, which asks Slurm for the job's end and vacates the
//! node's job by that deadline; the host takes no new grant, and Slurm's SIGKILL (`KillWait`
//! after its last SIGTERM) ends the daemon, so the host leaves. The node's name comes from
//! `SLURMD_NODENAME`, which Slurm sets in every batch job.

use std::{net::SocketAddr, path::Path};

/// Host names of pilots start with this: `slurm-<node>`.
pub const PILOT_HOST_PREFIX: &str = "slurm-";

/// Whether `name` is a pilot's host name: `slurm-` and a node name (letters, digits, `-`,
/// `_`, `.`; at most 64 characters in all).
pub fn is_pilot_host(name: &str) -> bool {
    name.strip_prefix(PILOT_HOST_PREFIX).is_some_and(|node| {
        !node.is_empty()
            && name.len() <= 64
            && !node.starts_with('-')
            && node
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    })
}

/// Whether `id` is a Slurm job id as `sbatch --parsable` prints it and `$SLURM_JOB_ID`
/// holds it: digits only (at most 20). Every place that takes one from outside (the
/// daemon's `--slurm-job`, a daemon's word over the network, `sbatch`'s answer) checks it
/// with this before passing it on to a Slurm command.
pub fn is_slurm_job_id(id: &str) -> bool {
    (1..=20).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit())
}

/// The labels of a pilot's host besides what its daemon reports.
pub const PILOT_LABELS: &[&str] = &["public", "slurm"];

/// What a pilot's script needs to know.
#[derive(Debug, Clone)]
pub struct PilotScript<'a> {
    /// `rb-hostd` on the compute nodes.
    pub hostd: &'a Path,
    /// The broker's address as the compute nodes reach it.
    pub broker: SocketAddr,
    /// The lab secret file, as the compute nodes see it.
    pub secret_file: &'a Path,
}

impl PilotScript<'_> {
    /// The batch script's text.
    pub fn text(&self) -> String {
        format!(
            "#!/bin/sh\n\
             # ResourceBroker pilot (issue 19): rb-hostd on this node for the job's lease.\n\
             node=\"${{SLURMD_NODENAME:-$(hostname -s)}}\"\n\
             # The daemon is the job's step: Slurm's lease warning (USR1) and its notice of\n\
             # preemption or scancel (TERM) reach it, not this shell. It tells the broker, which\n\
             # vacates the node's job by Slurm's deadline; Slurm's SIGKILL then ends it.\n\
             exec srun --quiet --nodes=1 --ntasks=1 \\\n\
             \x20   {hostd} --broker {broker} --host \"{PILOT_HOST_PREFIX}$node\" --secret-file {secret} \\\n\
             \x20   --slurm-job \"$SLURM_JOB_ID\"\n",
            hostd = quote(&self.hostd.display().to_string()),
            broker = quote(&self.broker.to_string()),
            secret = quote(&self.secret_file.display().to_string()),
        )
    }
}

/// `s` as one sh word in single quotes.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_runs_hostd_as_slurm_node_with_quoted_paths() {
        let text = PilotScript {
            hostd: Path::new("/opt/rb it's/rb-hostd"),
            broker: "10.1.0.5:7700".parse().expect("addr"),
            secret_file: Path::new("/home/alice/.config/rb/secret"),
        }
        .text();
        assert!(text.starts_with("#!/bin/sh\n"));
        assert!(
            text.contains(
                "exec srun --quiet --nodes=1 --ntasks=1 \\\n    \
                 '/opt/rb it'\\''s/rb-hostd' --broker '10.1.0.5:7700' --host \"slurm-$node\" \
                 --secret-file '/home/alice/.config/rb/secret' \\\n    --slurm-job \"$SLURM_JOB_ID\"\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn slurm_job_ids_are_digits() {
        assert!(is_slurm_job_id("4242") && is_slurm_job_id(&"9".repeat(20)));
        for bad in ["", "42a", "-1", "4 2", "--help", &"9".repeat(21)] {
            assert!(!is_slurm_job_id(bad), "{bad}");
        }
    }

    #[test]
    fn pilot_host_names_are_slurm_and_a_node_name() {
        assert!(is_pilot_host("slurm-node02"));
        assert!(is_pilot_host("slurm-cn-17.cluster"));
        for bad in [
            "slurm-",
            "node02",
            "slurm--x",
            "slurm-a b",
            "Slurm-x",
            "slurm-a;b",
        ] {
            assert!(!is_pilot_host(bad), "{bad}");
        }
        assert!(!is_pilot_host(&format!("slurm-{}", "n".repeat(60))));
    }

    #[test]
    fn sh_accepts_the_script() {
        let text = PilotScript {
            hostd: Path::new("/x/rb-hostd"),
            broker: "10.1.0.5:7700".parse().expect("addr"),
            secret_file: Path::new("/s"),
        }
        .text();
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", &text])
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
