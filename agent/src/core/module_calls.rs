//! What the agent core knows of modules (`modules/CONTRACT.md`): the programs a job's
//! module has, the calls it asks the shell to run, and their outcomes. Pure types: running
//! the programs (processes, time limits, output) is the shell's (`crate::module`), which
//! depends on these, never the other way round.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tracing::{info, warn};

/// What a module program is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Grow,
    Shrink,
    Halt,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Grow => "grow",
            Action::Shrink => "shrink",
            Action::Halt => "halt",
        }
    }
}

/// A module's programs as found on the search path (`None`: not found).
#[derive(Debug, Clone)]
pub struct Programs {
    pub name: String,
    pub grow: Option<PathBuf>,
    pub shrink: Option<PathBuf>,
    pub halt: Option<PathBuf>,
    /// Where they were looked for, for error messages.
    pub searched: Vec<PathBuf>,
}

impl Programs {
    pub fn program(&self, action: Action) -> Option<&Path> {
        match action {
            Action::Grow => self.grow.as_deref(),
            Action::Shrink => self.shrink.as_deref(),
            Action::Halt => self.halt.as_deref(),
        }
    }

    /// "module pvm: pvm-grow not found in A, B (help: …)".
    pub fn missing(&self, action: Action) -> String {
        let dirs: Vec<String> = self
            .searched
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        format!(
            "module {name}: {name}-{action} not found in {dirs}\nhelp: install it there, or \
             add its directory to RB_MODULE_PATH (see modules/CONTRACT.md)",
            name = self.name,
            action = action.name(),
            dirs = if dirs.is_empty() {
                "(no directory)".into()
            } else {
                dirs.join(", ")
            }
        )
    }
}

/// One module program run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub action: Action,
    /// Host name and address (grow, shrink).
    pub host: Option<(String, String)>,
    /// The allocation it is about (grow, shrink).
    pub alloc: Option<u64>,
    pub timeout: Duration,
}

impl Call {
    /// "pvm-grow node03".
    pub fn describe(&self, module: &str) -> String {
        match &self.host {
            Some((h, _)) => format!("{module}-{} {h}", self.action.name()),
            None => format!("{module}-{}", self.action.name()),
        }
    }
}

/// The exit status of a `NAME-grow HOST` that found HOST in the job's virtual machine
/// already (PVM's "Duplicate host", LAM's "already a part of the existing LAM universe"):
/// the job cannot use the grant (modules/CONTRACT.md).
pub const EXIT_ALREADY_THERE: i32 = 6;

/// A finished call: `Err` carries what went wrong, for people.
#[derive(Debug)]
pub struct Outcome {
    pub call: Call,
    pub result: Result<(), String>,
    pub elapsed: Duration,
    /// The program's exit status, when it exited (not killed, timed out or not run).
    pub code: Option<i32>,
    /// What a call that succeeded said on stderr (at most [`MAX_SAID`] lines): a module is
    /// quiet on success unless the user must know something, e.g. that a shrink ended the
    /// job's processes on the host and so failed the runs that used them. The agent shows
    /// each line to the user and in `rb jobs` notes. (A failure's last stderr line is in
    /// its `result` instead.)
    pub said: Vec<String>,
}

/// The most stderr lines of a successful call passed on to the user.
pub const MAX_SAID: usize = 5;

impl Outcome {
    /// A grow that found its host in the job's virtual machine already.
    pub fn already_there(&self) -> bool {
        self.call.action == Action::Grow && self.code == Some(EXIT_ALREADY_THERE)
    }
}

/// Logs the outcome of a call the way the agent reports it.
pub fn log_outcome(outcome: &Outcome, module: &str) {
    let what = outcome.call.describe(module);
    match &outcome.result {
        Ok(()) => info!(
            module = %what,
            ms = outcome.elapsed.as_millis() as u64,
            "module done"
        ),
        Err(e) => warn!(module = %what, "module failed: {e}"),
    }
}

/// Whether `ancestor` is in `lineage` (from `crate::ancestry::lineage`): the process is `ancestor` or one
/// of its descendants. Init (1) and the kernel (0) are nobody's ancestor here.
pub fn in_lineage(lineage: &[u32], ancestor: u32) -> bool {
    ancestor > 1 && lineage.contains(&ancestor)
}
