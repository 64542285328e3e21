//! Where a Valkey node serves clients: its IP (a Pod IP, or a loopback address in tests) and
//! client port. The cluster bus listens 10000 above the client port, as Valkey fixes it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// The client port every node of the operator listens on.
pub const CLIENT_PORT: u16 = 6379;

/// A node's client address, kept as a typed socket address from the Pod IP to the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddress(SocketAddr);

impl NodeAddress {
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Self(SocketAddr::new(ip, port))
    }

    /// A Pod's IP (as `status.podIP` holds it) on the standard client port.
    pub fn of_pod_ip(ip: &str) -> Option<Self> {
        Some(Self::new(ip.parse().ok()?, CLIENT_PORT))
    }

    pub fn ip(&self) -> IpAddr {
        self.0.ip()
    }

    pub fn port(&self) -> u16 {
        self.0.port()
    }
}

impl fmt::Display for NodeAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for NodeAddress {
    type Err = std::net::AddrParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}

impl From<SocketAddr> for NodeAddress {
    fn from(address: SocketAddr) -> Self {
        Self(address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_ip_becomes_an_address_on_the_client_port() {
        let address = NodeAddress::of_pod_ip("127.0.3.7");
        assert_eq!(
            address.map(|a| a.to_string()),
            Some("127.0.3.7:6379".into())
        );
        assert_eq!(NodeAddress::of_pod_ip("not an ip"), None);
    }

    #[test]
    fn an_ipv6_address_is_written_with_brackets() {
        let address = NodeAddress::of_pod_ip("fd00::5");
        assert_eq!(
            address.map(|a| a.to_string()),
            Some("[fd00::5]:6379".into())
        );
        assert_eq!("[fd00::5]:6379".parse::<NodeAddress>().ok(), address);
    }
}
