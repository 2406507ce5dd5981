//! The lab's network: one bridge in the root namespace carrying the gateway address
//! 10.77.S.1/24, and per host a network namespace whose `eth0` (10.77.S.N/24) is one end of
//! a veth pair; the other end is a port of the bridge. Hosts get no default route, so
//! nothing can leave the lab. IPv6 address generation is switched off on every lab link.
//!
//! Creation and deletion shell out to `ip`. Deletion checks what exists first, so it
//! tolerates partly built labs and can be repeated.

use std::path::Path;

use crate::cmd::ip;
use crate::manifest::{HostRecord, Manifest};
use crate::LabError;

/// Whether a network interface exists in the root namespace.
pub(crate) fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Whether a named network namespace exists.
pub(crate) fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Creates the bridge with the gateway address.
pub(crate) fn create_bridge(m: &Manifest) -> Result<(), LabError> {
    let br = m.bridge.as_str();
    let gw = format!("{}/24", m.gateway());
    ip(&["link", "add", br, "type", "bridge"])?;
    ip(&["link", "set", br, "addrgenmode", "none"])?;
    ip(&["addr", "add", &gw, "dev", br])?;
    ip(&["link", "set", br, "up"])
}

/// Creates the host's network namespace and veth pair, and configures both ends.
pub(crate) fn create_host(m: &Manifest, h: &HostRecord) -> Result<(), LabError> {
    let (ns, veth) = (h.netns.as_str(), h.veth.as_str());
    let addr = format!("{}/24", h.address);
    ip(&["netns", "add", ns])?;
    ip(&[
        "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    ip(&["link", "set", veth, "addrgenmode", "none"])?;
    ip(&["link", "set", veth, "master", &m.bridge])?;
    ip(&[
        "link",
        "set",
        veth,
        if h.partitioned { "down" } else { "up" },
    ])?;
    ip(&["-n", ns, "link", "set", "eth0", "addrgenmode", "none"])?;
    ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
    ip(&["-n", ns, "link", "set", "eth0", "up"])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])
}

/// Takes the host's link down (partition) or up (heal), on the root side of its veth.
pub(crate) fn set_link(h: &HostRecord, up: bool) -> Result<(), LabError> {
    ip(&["link", "set", &h.veth, if up { "up" } else { "down" }])
}

/// Deletes what exists of the host's network: the netns (which takes its veth end, and so
/// the pair, with it) and the root-side veth if it survived.
pub(crate) fn delete_host(h: &HostRecord) -> Result<(), LabError> {
    if netns_exists(&h.netns) {
        ip(&["netns", "delete", &h.netns])?;
    }
    delete_link(&h.veth)
}

/// Deletes an interface if it exists. A veth whose peer's namespace was just deleted goes
/// away asynchronously, so "it vanished meanwhile" counts as success.
fn delete_link(name: &str) -> Result<(), LabError> {
    match ip(&["link", "delete", name]) {
        Err(_) if !link_exists(name) => Ok(()),
        other => other,
    }
}

/// Deletes the bridge if it exists.
pub(crate) fn delete_bridge(m: &Manifest) -> Result<(), LabError> {
    delete_link(&m.bridge)
}
