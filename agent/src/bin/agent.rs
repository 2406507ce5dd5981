//! `agent [--rsl SPEC] [--] app args…`: flags → [`agent::cli::AgentConfig`] →
//! [`agent::run::run`]; exits with the app's status (128+signal when it was killed).
//!
//! Its own exit codes: 64 bad flags, job spec or lab file; 77 permission denied (e.g. on
//! the broker's socket); 127 the app was not found, 126 it is not executable (as shells);
//! 1 any other failure of the agent.

const EXIT_USAGE: i32 = startup::EXIT_USAGE as i32;
const EXIT_PERMISSION: i32 = 77;

fn main() {
    let args: agent::cli::Args = startup::start("warn");
    if let Some(flag) = args
        .app
        .first()
        .filter(|a| a.starts_with('-') && a.len() > 1)
    {
        eprintln!(
            "agent: error: unknown flag `{}`\nhelp: `agent --help` lists the flags; the app \
             comes after them (agent [FLAGS] APP ARGS…)",
            flag.chars()
                .take(40)
                .flat_map(char::escape_debug)
                .collect::<String>()
        );
        std::process::exit(EXIT_USAGE);
    }
    let cfg = match agent::cli::AgentConfig::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent: error: {e:#}");
            std::process::exit(EXIT_USAGE);
        }
    };
    if let Err(e) = agent::program::check(&cfg.app[0], std::env::var_os("PATH").as_deref()) {
        eprintln!("agent: {e}");
        std::process::exit(e.exit_code());
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agent: error: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(agent::run::run(cfg)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("agent: error: {e:#}");
            std::process::exit(exit_code(&e));
        }
    }
}

/// The exit code of an agent failure: 64 for a bad lab file; 77 for permission denied,
/// and when a directory or socket is not this user's alone; else 1.
fn exit_code(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<config::ConfigError>().is_some() {
        return EXIT_USAGE;
    }
    if let Some(code) = e.chain().find_map(proto::credential::key_file_exit_code) {
        return i32::from(code);
    }
    let denied = e.chain().any(|cause| {
        cause
            .downcast_ref::<proto::handshake::HandshakeError>()
            .is_some_and(proto::credential::is_auth_refusal)
            || cause.is::<privdir::Error>()
            || cause.is::<proto::peercred::PeerError>()
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    });
    if denied {
        EXIT_PERMISSION
    } else {
        1
    }
}
