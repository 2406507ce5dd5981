//! Which of this machine's addresses others reach it by: the source address the kernel
//! picks for a route to a peer. An agent advertises to its subagents its address on the
//! route to the broker's host-facing IP, since the hosts reach the broker's machine over
//! the same network (see `hosts_reach_broker_at` in [`crate::msg::FromBroker::Registered`]).

use std::net::{IpAddr, SocketAddr, UdpSocket};

/// This machine's address on the route to `peer`: `peer` itself when it is one of ours
/// (loopback included). Connecting a UDP socket only consults the routing table; no packet
/// is sent.
pub fn source_toward(peer: IpAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match peer {
        IpAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any)?;
    // Any port will do: the route depends on the address only.
    socket.connect((peer, 9))?;
    Ok(socket.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_address_routes_to_itself() {
        let lo: IpAddr = [127, 0, 0, 1].into();
        assert_eq!(source_toward(lo).expect("route to loopback"), lo);
        let other: IpAddr = [127, 0, 0, 7].into();
        assert!(source_toward(other).expect("route").is_loopback());
    }
}
