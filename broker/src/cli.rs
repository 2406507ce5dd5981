//! The `rb-broker` command line (its own `main` parses it; `rb-docgen` renders its man page
//! and completions from it).

use std::path::PathBuf;

use clap::Parser;

/// ResourceBroker manager: starts and watches a host daemon on every lab machine.
#[derive(Debug, Parser)]
#[command(name = "rb-broker", version)]
pub struct Args {
    /// The lab file (default: $RB_LAB, else ~/.config/rb/lab.toml, else the embedded lab).
    #[arg(long, env = "RB_LAB")]
    pub lab: Option<PathBuf>,
    /// Run the single-machine embedded lab (virtual hosts on this machine).
    #[arg(long, conflicts_with = "lab")]
    pub embedded: bool,
    /// Number of virtual hosts of the embedded lab.
    #[arg(long, default_value_t = crate::embedded::DEFAULT_HOSTS, requires = "embedded")]
    pub hosts: usize,
    /// State dir of the embedded lab (default $XDG_RUNTIME_DIR/rb/embedded, else
    /// /tmp/rb-<uid>/embedded); created 0700, refused if another user owns it.
    #[allow(rustdoc::invalid_html_tags)] // --help text: `<uid>` is shown as written
    #[arg(long, requires = "embedded")]
    pub state_dir: Option<PathBuf>,
}
