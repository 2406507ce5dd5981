//! Raw lab file → [`LabConfig`]: defaults, ranges, names, duplicates.

use std::{collections::HashMap, net::SocketAddr, path::Path, time::Duration};

use toml::Spanned;

use crate::{
    error::ConfigError,
    expand_home,
    raw::{RawBroker, RawHost, RawLab},
    BrokerSettings, HostEntry, LabConfig, Transport,
};

/// Context for building errors that point into the file.
struct Ctx<'a> {
    text: &'a str,
    path: Option<&'a Path>,
}

impl Ctx<'_> {
    fn err<T>(
        &self,
        spanned: &Spanned<T>,
        key: &str,
        msg: impl Into<String>,
        help: impl Into<String>,
    ) -> ConfigError {
        ConfigError::at(self.text, self.path, Some(spanned.span().start), key).msg(msg, help)
    }
}

pub(crate) fn validate(
    raw: RawLab,
    text: &str,
    path: Option<&Path>,
) -> Result<LabConfig, ConfigError> {
    let ctx = Ctx { text, path };
    let broker = broker(&ctx, raw.broker)?;
    check_labels(&ctx, &raw.host)?;
    let hosts = hosts(&ctx, raw.host)?;
    Ok(LabConfig {
        source: path.map(Path::to_path_buf),
        broker,
        hosts,
    })
}

fn broker(ctx: &Ctx, raw: RawBroker) -> Result<BrokerSettings, ConfigError> {
    let listen: SocketAddr = raw.listen.get_ref().parse().map_err(|_| {
        ctx.err(
            &raw.listen,
            "broker.listen",
            format!("`{}` is not an IP:port address", raw.listen.get_ref()),
            "write e.g. \"10.77.0.1:7700\" (an address of this machine; port 0 picks a free port)",
        )
    })?;
    let transport = match &raw.transport {
        None => Transport::Ssh,
        Some(t) => Transport::parse(t.get_ref()).ok_or_else(|| {
            ctx.err(
                t,
                "broker.transport",
                format!("unknown transport `{}`", t.get_ref()),
                format!("use one of: {}", Transport::NAMES.join(", ")),
            )
        })?,
    };
    if raw.state_dir.get_ref().trim().is_empty() {
        return Err(ctx.err(
            &raw.state_dir,
            "broker.state_dir",
            "must not be empty",
            "e.g. \"/var/tmp/rb-$USER\"",
        ));
    }
    let report_interval = seconds(
        ctx,
        &raw.report_interval_s,
        "broker.report_interval_s",
        2.0,
        0.05,
        3600.0,
    )?;
    let default_down = (report_interval.as_secs_f64() * 3.0).max(1.0);
    let down_after = seconds(
        ctx,
        &raw.down_after_s,
        "broker.down_after_s",
        default_down,
        0.1,
        86400.0,
    )?;
    if down_after <= report_interval {
        let span = raw.down_after_s.as_ref().map(|s| s.span().start);
        return Err(
            ConfigError::at(ctx.text, ctx.path, span, "broker.down_after_s").msg(
                "must be longer than report_interval_s",
                "a host is declared down after this much silence; use at least 3 report intervals",
            ),
        );
    }
    let restart_backoff_max = seconds(
        ctx,
        &raw.restart_backoff_max_s,
        "broker.restart_backoff_max_s",
        4.0,
        0.1,
        3600.0,
    )?;
    let reclaim_grace = seconds(
        ctx,
        &raw.reclaim_grace_s,
        "broker.reclaim_grace_s",
        5.0,
        0.0,
        3600.0,
    )?;
    Ok(BrokerSettings {
        reclaim_grace,
        listen,
        transport,
        state_dir: expand_home(raw.state_dir.get_ref()),
        secret_file: raw
            .secret_file
            .as_deref()
            .map_or_else(crate::default_secret_path, expand_home),
        report_interval,
        down_after,
        restart_backoff_max,
        hostd_path: raw.hostd_path.as_deref().map(expand_home),
        ssh_command: command(ctx, raw.ssh_command, "broker.ssh_command", &["ssh"])?,
        rsh_command: command(ctx, raw.rsh_command, "broker.rsh_command", &["rsh"])?,
        job_shell: match raw.job_shell {
            None => None,
            some => Some(command(ctx, some, "broker.job_shell", &[])?),
        },
    })
}

fn seconds(
    ctx: &Ctx,
    value: &Option<Spanned<f64>>,
    key: &str,
    default: f64,
    min: f64,
    max: f64,
) -> Result<Duration, ConfigError> {
    let Some(v) = value else {
        return Ok(Duration::from_secs_f64(default));
    };
    let secs = *v.get_ref();
    if !(min..=max).contains(&secs) {
        return Err(ctx.err(
            v,
            key,
            format!("{secs} is out of range"),
            format!("use a number of seconds between {min} and {max}"),
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn command(
    ctx: &Ctx,
    value: Option<Spanned<Vec<String>>>,
    key: &str,
    default: &[&str],
) -> Result<Vec<String>, ConfigError> {
    match value {
        None => Ok(default.iter().map(|s| s.to_string()).collect()),
        Some(v) if v.get_ref().is_empty() || v.get_ref()[0].trim().is_empty() => Err(ctx.err(
            &v,
            key,
            "must name a program",
            "e.g. [\"ssh\", \"-F\", \"/path/ssh_config\"]",
        )),
        Some(v) => Ok(v.into_inner()),
    }
}

fn hosts(ctx: &Ctx, raw: Vec<RawHost>) -> Result<Vec<HostEntry>, ConfigError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, host) in raw.into_iter().enumerate() {
        let name = host.name.get_ref().clone();
        check_name(ctx, &host.name, &format!("host[{i}].name"))?;
        if let Some(first) = seen.insert(name.to_ascii_lowercase(), i) {
            let first_line = out.get(first).map(|_: &HostEntry| first).unwrap_or(first);
            return Err(ctx.err(
                &host.name,
                &format!("host[{i}].name"),
                format!("duplicate host name `{name}` (also host[{first_line}])"),
                "every [[host]] needs its own name (names compare case-insensitively)",
            ));
        }
        out.push(host_entry(ctx, host, i)?);
    }
    Ok(out)
}

fn host_entry(ctx: &Ctx, host: RawHost, i: usize) -> Result<HostEntry, ConfigError> {
    let name = host.name.get_ref().clone();
    let address = match &host.address {
        Some(a) if a.get_ref().trim().is_empty() || a.get_ref().contains(char::is_whitespace) => {
            return Err(ctx.err(
                a,
                &format!("host[{i}].address"),
                "must be a host name or IP address without blanks",
                "remove the key to use the host name",
            ));
        }
        Some(a) => a.get_ref().clone(),
        None => name.clone(),
    };
    let mut labels = Vec::new();
    for label in &host.labels {
        check_name(ctx, label, &format!("host[{i}].labels"))?;
        labels.push(label.get_ref().to_ascii_lowercase());
    }
    labels.sort();
    labels.dedup();
    let owner = match &host.owner {
        Some(o) if o.get_ref().trim().is_empty() => {
            return Err(ctx.err(
                o,
                &format!("host[{i}].owner"),
                "must be a user name",
                "remove the key for a public machine",
            ));
        }
        Some(o) => Some(o.get_ref().clone()),
        None => None,
    };
    Ok(HostEntry {
        name,
        address,
        labels,
        owner,
    })
}

/// Labels must make valid, unambiguous symbolic names ([`crate::labels`]).
fn check_labels(ctx: &Ctx, raw: &[RawHost]) -> Result<(), ConfigError> {
    let lists: Vec<Vec<&str>> = raw
        .iter()
        .map(|h| h.labels.iter().map(|l| l.get_ref().as_str()).collect())
        .collect();
    match crate::labels::check(&lists) {
        None => Ok(()),
        Some(p) => Err(ctx.err(
            &raw[p.host].labels[p.label],
            &format!("host[{}].labels", p.host),
            p.message,
            p.help,
        )),
    }
}

/// Host names and labels: letters, digits, `.`, `-`, `_`; not starting with `-`.
fn check_name(ctx: &Ctx, value: &Spanned<String>, key: &str) -> Result<(), ConfigError> {
    let s = value.get_ref();
    let ok = !s.is_empty()
        && !s.starts_with('-')
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(ctx.err(
            value,
            key,
            format!("`{s}` is not a valid name"),
            "use letters, digits, '.', '-' and '_' only, not starting with '-'",
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::{LabConfig, Transport};

    const GOOD: &str = r#"
[broker]
listen = "10.77.0.1:7700"
transport = "ssh"
state_dir = "/var/tmp/rb-alice"
secret_file = "/home/alice/.config/rb/secret"

[[host]]
name = "node02"
address = "10.77.0.2"
labels = ["Public", "public", "fast"]

[[host]]
name = "node03"
owner = "alice"
"#;

    fn parse(text: &str) -> Result<LabConfig, crate::ConfigError> {
        LabConfig::parse(text, Some(std::path::Path::new("lab.toml")))
    }

    #[test]
    fn good_file_parses_with_defaults() {
        let lab = parse(GOOD).expect("valid");
        assert_eq!(lab.broker.transport, Transport::Ssh);
        assert_eq!(lab.broker.report_interval.as_secs(), 2);
        assert_eq!(lab.broker.down_after.as_secs(), 6);
        assert_eq!(lab.hosts.len(), 2);
        assert_eq!(lab.hosts[0].labels, vec!["fast", "public"]);
        assert_eq!(lab.hosts[1].address, "node03");
        assert_eq!(lab.hosts[1].owner.as_deref(), Some("alice"));
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = GOOD.replace("owner = \"alice\"", "owner = \"alice\"\ncolour = \"red\"");
        let err = parse(&text).expect_err("unknown key");
        let shown = err.to_string();
        assert!(shown.starts_with("lab.toml:16:"), "{shown}");
        assert!(shown.contains("colour"), "{shown}");
        assert!(shown.contains("help:"), "{shown}");
    }

    #[test]
    fn duplicate_host_points_at_second_definition() {
        let text = GOOD.replace("name = \"node03\"", "name = \"NODE02\"");
        let err = parse(&text).expect_err("duplicate");
        assert_eq!(err.line, Some(14));
        assert_eq!(err.key.as_deref(), Some("host[1].name"));
        assert!(err.message.contains("duplicate"), "{err}");
    }

    #[test]
    fn job_shell_is_optional_and_must_name_a_program() {
        assert_eq!(parse(GOOD).expect("valid").broker.job_shell, None);
        let text = GOOD.replace("[broker]\n", "[broker]\njob_shell = [\"rsh\"]\n");
        let lab = parse(&text).expect("valid");
        assert_eq!(lab.broker.job_shell, Some(vec!["rsh".to_string()]));
        let text = GOOD.replace("[broker]\n", "[broker]\njob_shell = []\n");
        let err = parse(&text).expect_err("empty");
        assert_eq!(err.key.as_deref(), Some("broker.job_shell"));
    }

    #[test]
    fn bad_transport_lists_choices() {
        let err = parse(&GOOD.replace("\"ssh\"", "\"telnet\"")).expect_err("bad transport");
        assert_eq!(err.key.as_deref(), Some("broker.transport"));
        assert!(err.to_string().contains("ssh, rsh, local, manual"));
    }

    #[test]
    fn bad_listen_and_names_are_reported() {
        let err = parse(&GOOD.replace("10.77.0.1:7700", "nowhere")).expect_err("listen");
        assert_eq!(err.key.as_deref(), Some("broker.listen"));
        assert_eq!(err.line, Some(3));
        let err = parse(&GOOD.replace("\"node02\"", "\"no de\"")).expect_err("name");
        assert_eq!(err.key.as_deref(), Some("host[0].name"));
    }

    #[test]
    fn down_after_must_exceed_interval() {
        let text = GOOD.replace(
            "transport = \"ssh\"",
            "transport = \"ssh\"\nreport_interval_s = 2\ndown_after_s = 1",
        );
        let err = parse(&text).expect_err("range");
        assert_eq!(err.key.as_deref(), Some("broker.down_after_s"));
    }

    #[test]
    fn wrong_type_is_a_clear_error() {
        let err = parse(&GOOD.replace(
            "labels = [\"Public\", \"public\", \"fast\"]",
            "labels = \"public\"",
        ))
        .expect_err("type");
        assert_eq!(err.line, Some(11));
    }
}
