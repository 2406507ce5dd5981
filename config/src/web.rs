//! `[web]`: the broker's HTTP listener for Prometheus (`/metrics`) and its JSON view
//! (`/api/status`, `/api/jobs`). Absent = no listener.
//!
//! ```toml
//! [web]
//! listen = "127.0.0.1:9770"   # IP:PORT
//! jobs = "token"              # who may read job details (argv, cwd, user, notes)
//! ```
//!
//! Host states and counters are public on the listener. Job details need the same right as
//! `rb jobs`: with `jobs = "token"` (the default) a bearer token the broker writes to
//! `STATE_DIR/web-token`, readable by the broker's owner only; `jobs = "public"` serves them
//! to anyone who reaches the port, and is refused unless `listen` is a loopback address.

use std::net::SocketAddr;

use toml::Spanned;

use crate::{error::ConfigError, raw::RawWeb};

/// Who may read job details on the web listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAccess {
    /// A bearer token from `STATE_DIR/web-token` (mode 0600, the broker owner's).
    Token,
    /// Anyone who reaches the port (loopback listeners only).
    Public,
}

impl JobAccess {
    pub const NAMES: &'static [&'static str] = &["token", "public"];
}

/// Validated `[web]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSettings {
    pub listen: SocketAddr,
    pub jobs: JobAccess,
}

/// Name of the token file in the state directory.
pub const WEB_TOKEN_FILE: &str = "web-token";

pub(crate) fn validate(
    text: &str,
    path: Option<&std::path::Path>,
    raw: &RawWeb,
) -> Result<WebSettings, ConfigError> {
    let err = |at: usize, key: &str, msg: String, help: &str| {
        ConfigError::at(text, path, Some(at), key).msg(msg, help.to_string())
    };
    let listen: SocketAddr = raw.listen.get_ref().parse().map_err(|_| {
        err(
            raw.listen.span().start,
            "web.listen",
            format!("`{}` is not an IP:port address", raw.listen.get_ref()),
            "write e.g. \"127.0.0.1:9770\" (port 0 picks a free port)",
        )
    })?;
    let jobs = match raw.jobs.as_ref().map(Spanned::get_ref).map(String::as_str) {
        None | Some("token") => JobAccess::Token,
        Some("public") => JobAccess::Public,
        Some(other) => {
            let at = raw.jobs.as_ref().map_or(0, |j| j.span().start);
            return Err(err(
                at,
                "web.jobs",
                format!("unknown job access `{other}`"),
                &format!("use one of: {}", JobAccess::NAMES.join(", ")),
            ));
        }
    };
    if jobs == JobAccess::Public && !listen.ip().is_loopback() {
        let at = raw.jobs.as_ref().map_or(0, |j| j.span().start);
        return Err(err(
            at,
            "web.jobs",
            format!(
                "jobs = \"public\" on {listen}, which is not a loopback address, would show \
                 every job's command line, directory, user and notes to anyone on the network"
            ),
            "remove `jobs` (the default \"token\" asks for the bearer token in \
             STATE_DIR/web-token), or listen on 127.0.0.1",
        ));
    }
    Ok(WebSettings { listen, jobs })
}

#[cfg(test)]
mod tests {
    use crate::{JobAccess, LabConfig};

    const BASE: &str =
        "[broker]\nlisten = \"127.0.0.1:7700\"\ntransport = \"local\"\nstate_dir = \"/tmp/x\"\n";

    fn parse(web: &str) -> Result<LabConfig, crate::ConfigError> {
        LabConfig::parse(
            &format!("{BASE}{web}"),
            Some(std::path::Path::new("lab.toml")),
        )
    }

    #[test]
    fn absent_web_table_means_no_listener() {
        assert!(parse("").expect("valid").web.is_none());
    }

    #[test]
    fn listen_defaults_to_token_access() {
        let lab = parse("[web]\nlisten = \"0.0.0.0:9770\"\n").expect("valid");
        let web = lab.web.expect("web");
        assert_eq!(web.listen.port(), 9770);
        assert_eq!(web.jobs, JobAccess::Token);
    }

    #[test]
    fn public_jobs_need_a_loopback_listener() {
        let ok = parse("[web]\nlisten = \"127.0.0.1:9770\"\njobs = \"public\"\n").expect("valid");
        assert_eq!(ok.web.expect("web").jobs, JobAccess::Public);
        let err = parse("[web]\nlisten = \"10.0.0.1:9770\"\njobs = \"public\"\n")
            .expect_err("public on the network");
        let shown = err.to_string();
        assert!(shown.contains("lab.toml:7"), "{shown}");
        assert!(shown.contains("web.jobs"), "{shown}");
        assert!(shown.contains("not a loopback address"), "{shown}");
    }

    #[test]
    fn bad_values_and_unknown_keys_are_pointed_at() {
        let err = parse("[web]\nlisten = \"nowhere\"\n").expect_err("bad listen");
        assert!(err.to_string().contains("lab.toml:6"), "{err}");
        assert!(err.to_string().contains("web.listen"), "{err}");
        let err = parse("[web]\nlisten = \"127.0.0.1:1\"\njobs = \"all\"\n").expect_err("bad");
        assert!(err.to_string().contains("unknown job access"), "{err}");
        let err = parse("[web]\nlisten = \"127.0.0.1:1\"\nport = 3\n").expect_err("unknown");
        assert!(err.to_string().contains("web.port"), "{err}");
        assert!(err.to_string().contains("unknown field `port`"), "{err}");
    }
}
