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
    check_names(&ctx, &raw.host)?;
    check_labels(&ctx, &raw.host)?;
    let hosts = hosts(&ctx, raw.host)?;
    let overflow = match raw.overflow.as_ref().and_then(|o| o.slurm.as_ref()) {
        None => None,
        Some(slurm) => {
            let octx = crate::overflow::Ctx {
                text,
                path,
                reclaim_grace: broker.reclaim_grace,
            };
            Some(crate::overflow::validate(&octx, slurm)?)
        }
    };
    let web = match &raw.web {
        None => None,
        Some(w) => Some(crate::web::validate(text, path, w)?),
    };
    Ok(LabConfig {
        source: path.map(Path::to_path_buf),
        broker,
        hosts,
        overflow,
        web,
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
    let policy = match &raw.policy {
        Some(p) if p.get_ref().trim().is_empty() => {
            let span = Some(p.span().start);
            return Err(ConfigError::at(ctx.text, ctx.path, span, "broker.policy").msg(
                "is empty",
                "name a shipped policy (paper, desktop, nights-and-weekends, dedicated) or a policy file's path",
            ));
        }
        Some(p) => p.get_ref().clone(),
        None => "paper".to_string(),
    };
    let trace_file_max_kib = count(
        ctx,
        &raw.trace_file_max_kib,
        "broker.trace_file_max_kib",
        crate::DEFAULT_TRACE_FILE_MAX_KIB,
        1,
        1 << 30,
    )?;
    let trace_files_kept = count(
        ctx,
        &raw.trace_files_kept,
        "broker.trace_files_kept",
        crate::DEFAULT_TRACE_FILES_KEPT as u64,
        0,
        100_000,
    )?;
    Ok(BrokerSettings {
        reclaim_grace,
        policy,
        trace_file_max_bytes: trace_file_max_kib * 1024,
        trace_files_kept: trace_files_kept as usize,
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

/// A whole number in `min..=max`, `default` when absent.
fn count(
    ctx: &Ctx,
    value: &Option<Spanned<i64>>,
    key: &str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let Some(v) = value else {
        return Ok(default);
    };
    match u64::try_from(*v.get_ref()) {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ctx.err(
            v,
            key,
            format!("{} is out of range", v.get_ref()),
            format!("use a whole number between {min} and {max}"),
        )),
    }
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

/// Every bad host name of the file, not only the first: one error, the others in `more`.
fn check_names(ctx: &Ctx, raw: &[RawHost]) -> Result<(), ConfigError> {
    let mut bad = raw.iter().enumerate().filter_map(|(i, host)| {
        let key = format!("host[{i}].name");
        check_name(ctx, &host.name, &key)
            .and_then(|()| check_not_symbolic(ctx, &host.name, &key))
            .err()
    });
    let Some(mut first) = bad.next() else {
        return Ok(());
    };
    first.more.extend(bad);
    Err(first)
}

fn hosts(ctx: &Ctx, raw: Vec<RawHost>) -> Result<Vec<HostEntry>, ConfigError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut addresses: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<HostEntry> = Vec::with_capacity(raw.len());
    for (i, host) in raw.into_iter().enumerate() {
        let name = host.name.get_ref().clone();
        check_name(ctx, &host.name, &format!("host[{i}].name"))?;
        check_not_symbolic(ctx, &host.name, &format!("host[{i}].name"))?;
        if let Some(first) = seen.insert(name.to_ascii_lowercase(), i) {
            return Err(ctx.err(
                &host.name,
                &format!("host[{i}].name"),
                format!("duplicate host name `{name}` (also host[{first}])"),
                "every [[host]] needs its own name (names compare case-insensitively)",
            ));
        }
        let entry = host_entry(ctx, &host, i)?;
        if let Some(first) = addresses.insert(address_key(&entry.address), i) {
            let (span, key) = match &host.address {
                Some(a) => (a.span().start, format!("host[{i}].address")),
                None => (host.name.span().start, format!("host[{i}].name")),
            };
            return Err(ConfigError::at(ctx.text, ctx.path, Some(span), &key).msg(
                format!(
                    "host `{name}` has the address `{}` of host[{first}] (`{}`)",
                    entry.address, out[first].name
                ),
                "every [[host]] is a different machine: give each its own address \
                 (a host without `address` is reached by its name)",
            ));
        }
        out.push(entry);
    }
    Ok(out)
}

/// Addresses that reach one machine compare equal: IPs in canonical form, names in lower
/// case without a trailing dot.
fn address_key(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => address.trim_end_matches('.').to_ascii_lowercase(),
    }
}

fn host_entry(ctx: &Ctx, host: &RawHost, i: usize) -> Result<HostEntry, ConfigError> {
    let name = host.name.get_ref().clone();
    let address = match &host.address {
        Some(a) => {
            check_address(ctx, a, &format!("host[{i}].address"))?;
            a.get_ref().clone()
        }
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

/// An address is handed to ssh/rsh as an argument: nothing a remote shell could read as an
/// option (a leading `-`, e.g. `-oProxyCommand=…`), no blanks or control characters.
fn check_address(ctx: &Ctx, value: &Spanned<String>, key: &str) -> Result<(), ConfigError> {
    let a = value.get_ref();
    let problem = if a.trim().is_empty() {
        Some("must not be empty".to_string())
    } else if a.starts_with('-') {
        Some(format!(
            "`{a}` starts with '-': the remote shell would read it as an option"
        ))
    } else if a.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some(format!("`{a}` contains blanks or control characters"))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(ctx.err(
            value,
            key,
            problem,
            "write a host name or IP address (e.g. \"10.77.0.2\"), or remove the key to use the host name",
        )),
    }
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

/// A host named like a symbolic name (`anyLinux`, `anyHost`, `any<Label>`, any case) could
/// never be asked for by name: `rsh anyLinux` means "a host chosen now".
fn check_not_symbolic(ctx: &Ctx, value: &Spanned<String>, key: &str) -> Result<(), ConfigError> {
    let s = value.get_ref();
    if !proto::symbolic::is_symbolic(s) {
        return Ok(());
    }
    Err(ctx.err(
        value,
        key,
        format!("`{s}` is a symbolic name (any<Label>): `rsh {s}` asks for a host chosen now, never this one"),
        "rename the host so that it does not start with \"any\" (names compare case-insensitively)",
    ))
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
        return Ok(());
    }
    let message = if s.len() > 253 {
        format!(
            "`{}` is not a valid name: {} bytes long, longer than 253",
            excerpt(s),
            s.len()
        )
    } else {
        format!("`{}` is not a valid name", excerpt(s))
    };
    Err(ctx.err(
        value,
        key,
        message,
        "use letters, digits, '.', '-' and '_' only, not starting with '-', at most 253",
    ))
}

/// The first 40 characters of `s` (and `…` when there are more), its control characters
/// escaped: an error message never echoes a huge or hostile name whole.
fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(40).flat_map(char::escape_debug).collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    out
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
    fn trace_limits_default_and_are_checked() {
        let lab = parse(GOOD).expect("valid");
        assert_eq!(lab.broker.trace_file_max_bytes, 8 << 20);
        assert_eq!(lab.broker.trace_files_kept, 8);
        let text = GOOD.replace(
            "[broker]\n",
            "[broker]\ntrace_file_max_kib = 16\ntrace_files_kept = 0\n",
        );
        let lab = parse(&text).expect("valid");
        assert_eq!(lab.broker.trace_file_max_bytes, 16 * 1024);
        assert_eq!(lab.broker.trace_files_kept, 0);
        let err = parse(&GOOD.replace("[broker]\n", "[broker]\ntrace_file_max_kib = 0\n"))
            .expect_err("out of range");
        assert_eq!(err.key.as_deref(), Some("broker.trace_file_max_kib"));
        assert!(err.to_string().contains("help:"), "{err}");
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

    #[test]
    fn an_address_that_starts_with_a_dash_is_refused() {
        let text = GOOD.replace("\"10.77.0.2\"", "\"-oProxyCommand=touch /tmp/x\"");
        let err = parse(&text).expect_err("option-like address");
        assert_eq!(err.key.as_deref(), Some("host[0].address"));
        assert_eq!((err.line, err.column), (Some(10), Some(11)));
        assert!(err.message.contains("starts with '-'"), "{err}");
        assert!(err.to_string().contains("\nhelp: "), "{err}");
        let err = parse(&GOOD.replace("\"10.77.0.2\"", "\"10.77.0.2 -v\"")).expect_err("blank");
        assert_eq!(err.key.as_deref(), Some("host[0].address"));
        let err = parse(&GOOD.replace("\"node02\"", "\"-node02\"")).expect_err("name");
        assert_eq!(err.key.as_deref(), Some("host[0].name"));
    }

    #[test]
    fn a_host_named_like_a_symbolic_name_is_refused() {
        for name in ["anyLinux", "ANYHOST", "anyPublic", "anyx86_64"] {
            let text = GOOD.replace("\"node03\"", &format!("\"{name}\""));
            let err = parse(&text).expect_err(name);
            assert_eq!(err.key.as_deref(), Some("host[1].name"), "{name}");
            assert_eq!(err.line, Some(14), "{name}");
            assert!(err.message.contains("symbolic name"), "{err}");
        }
        let text = GOOD.replace("\"node03\"", "\"anything.example.org\"");
        parse(&text).expect("a qualified name is a real host");
    }

    #[test]
    fn two_hosts_with_one_address_are_refused() {
        let text = GOOD.replace(
            "owner = \"alice\"",
            "owner = \"alice\"\naddress = \"10.77.0.2\"",
        );
        let err = parse(&text).expect_err("same address");
        assert_eq!(err.key.as_deref(), Some("host[1].address"));
        assert_eq!(err.line, Some(16));
        assert!(err.message.contains("host[0]"), "{err}");
        // A host reached by its name collides with another's explicit address too.
        let text = GOOD.replace("\"10.77.0.2\"", "\"NODE03\"");
        let err = parse(&text).expect_err("name is the other's address");
        assert_eq!(err.key.as_deref(), Some("host[1].name"));
    }

    #[test]
    fn every_unknown_key_of_a_file_is_reported() {
        let text = GOOD
            .replace("[broker]\n", "[broker]\nlisten_port = 7700\n")
            .replace("owner = \"alice\"", "owner = \"alice\"\ncolour = \"red\"")
            .replace("address = \"10.77.0.2\"", "adress = \"10.77.0.2\"")
            + "\n[extra]\n";
        let err = parse(&text).expect_err("unknown keys");
        assert_eq!(err.count(), 4, "{err}");
        let keys: Vec<_> = std::iter::once(&err)
            .chain(&err.more)
            .map(|e| (e.key.clone().unwrap_or_default(), e.line.unwrap_or(0)))
            .collect();
        let expect = [
            ("broker.listen_port", 3),
            ("host[0].adress", 11),
            ("host[1].colour", 17),
            ("extra", 19),
        ];
        let expect: Vec<_> = expect.iter().map(|(k, l)| (k.to_string(), *l)).collect();
        assert_eq!(keys, expect, "{err}");
        let shown = err.to_string();
        assert!(shown.contains("did you mean `address`?"), "{shown}");
        assert_eq!(shown.matches("\nhelp: ").count(), 4, "{shown}");
    }

    #[test]
    fn a_loopback_listen_with_a_remote_transport_warns_but_loads() {
        assert!(parse(GOOD).expect("valid").warnings().is_empty());
        let text = GOOD.replace("10.77.0.1:7700", "127.0.0.1:7700");
        let lab = parse(&text).expect("a warning is not an error");
        let warnings = lab.warnings();
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].key, "broker.listen");
        assert!(warnings[0]
            .to_string()
            .starts_with("lab.toml: broker.listen: warning:"));
        let local = text.replace("transport = \"ssh\"", "transport = \"local\"");
        assert!(parse(&local).expect("valid").warnings().is_empty());
        let rsh = text.replace("transport = \"ssh\"", "transport = \"rsh\"");
        assert_eq!(parse(&rsh).expect("valid").warnings().len(), 1);
    }
}
