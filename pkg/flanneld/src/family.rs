//! The address families, so that IPv4 and IPv6 go through the same code: each per-family field
//! of a lease, a config or an interface is read through one accessor taking the family.

use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// Both, in the order everything is done in: IPv4 first.
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(ip: IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The prefix length of a single address: 32 or 128.
    pub fn host_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    /// How the flags and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}
