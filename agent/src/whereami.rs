//! The machine the agent runs on, as the broker needs it to find the lab host
//! ([`proto::msg::AgentHost`] in the registration): the host name and every address of the
//! machine's interfaces except loopback and IPv6 link-local ones (those name no lab host).

use std::net::IpAddr;

use proto::msg::AgentHost;

/// This machine: `gethostname` and its interfaces' addresses (empty when unreadable).
pub fn this_host() -> AgentHost {
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let addresses: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|ifs| {
            ifs.filter_map(|i| i.address)
                .filter_map(|a| {
                    a.as_sockaddr_in()
                        .map(|s| IpAddr::V4(s.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
                })
                .collect()
        })
        .unwrap_or_default();
    agent_host(hostname, &addresses)
}

/// The registration's view of a machine: the addresses that can name a lab host, each once.
pub fn agent_host(hostname: String, addresses: &[IpAddr]) -> AgentHost {
    let mut kept: Vec<String> = Vec::new();
    for a in addresses.iter().filter(|a| names_a_host(a)) {
        let text = a.to_string();
        if !kept.contains(&text) {
            kept.push(text);
        }
    }
    AgentHost {
        hostname,
        addresses: kept,
    }
}

fn names_a_host(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_link_local_addresses_are_left_out_and_duplicates_kept_once() {
        let addrs: Vec<IpAddr> = [
            "127.0.0.1",
            "10.77.0.2",
            "::1",
            "fe80::1",
            "10.77.0.2",
            "2001:db8::2",
        ]
        .iter()
        .map(|a| a.parse().expect("address"))
        .collect();
        let h = agent_host("node02".into(), &addrs);
        assert_eq!(h.hostname, "node02");
        assert_eq!(h.addresses, ["10.77.0.2", "2001:db8::2"]);
    }

    #[test]
    fn this_host_has_a_name_and_no_loopback_address() {
        let h = this_host();
        assert!(!h.hostname.is_empty());
        assert!(h.addresses.iter().all(|a| a != "127.0.0.1" && a != "::1"));
    }
}
