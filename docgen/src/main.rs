//! `rb-docgen`: writes the man pages and shell completions (`--out DIR`), or the book's
//! command reference (`--markdown FILE`; `--check` only compares). See [`docgen`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Render ResourceBroker's man pages, completions and command reference from its programs'
/// clap definitions.
#[derive(Debug, Parser)]
#[command(name = "rb-docgen", version)]
struct Args {
    /// Write DIR/man/*.1 and DIR/completions/{bash,zsh,fish}/*.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Write the book's command reference to FILE.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// With --markdown: compare instead of writing; exit 1 when FILE is out of date.
    #[arg(long, requires = "markdown")]
    check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rb-docgen: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &args.out {
        let pages = docgen::man_pages(&dir.join("man"))?;
        let scripts = docgen::completions(&dir.join("completions"))?;
        println!(
            "{} man pages, {} completion scripts in {}",
            pages.len(),
            scripts.len(),
            dir.display()
        );
    }
    if let Some(file) = &args.markdown {
        let text = docgen::markdown();
        if args.check {
            let old = std::fs::read_to_string(file).unwrap_or_default();
            if old != text {
                eprintln!(
                    "rb-docgen: {} is out of date\nhelp: cargo run -p docgen -- --markdown {}",
                    file.display(),
                    file.display()
                );
                return Ok(ExitCode::from(1));
            }
        } else {
            std::fs::write(file, text)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
