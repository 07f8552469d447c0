//! A node's subnet lease in flannel's schema: the key names the subnet(s), the value is
//! flannel's `LeaseAttrs` JSON, byte for byte as flanneld writes and reads it.

use crate::family::IpFamily;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a stored lease cannot be read: outside data, logged with its key and skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadLease {
    /// The key's last element is not a subnet.
    Key(String),
    /// The value is not a JSON object.
    NotObject,
    /// The value does not decode as flannel's lease attributes.
    Value(String),
}

impl fmt::Display for BadLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadLease::Key(key) => write!(f, "{key:?} is not a subnet key (like 10.5.52.0-24)"),
            BadLease::NotObject => f.write_str("not a lease value: not a JSON object"),
            BadLease::Value(why) => write!(f, "not a lease value: {why}"),
        }
    }
}

impl std::error::Error for BadLease {}

/// The subnet(s) a lease holds; at least one family is present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubnetKey {
    pub ipv4: Option<Ipv4Network>,
    pub ipv6: Option<Ipv6Network>,
}

impl fmt::Display for SubnetKey {
    /// flannel's key: `10.5.52.0-24`, `10.5.52.0-24&fc00:0:0:1::-64`, `0.0.0.0-0&fc00::-64`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4 {
            Some(n) => write!(f, "{}-{}", n.network(), n.prefix())?,
            None => write!(f, "0.0.0.0-0")?,
        }
        if let Some(n) = self.ipv6 {
            write!(f, "&{}-{}", n.network(), n.prefix())?;
        }
        Ok(())
    }
}

impl SubnetKey {
    /// Parses the last path element of a lease key.
    pub fn parse(key: &str) -> Result<SubnetKey, BadLease> {
        let bad = || BadLease::Key(key.to_string());
        let (v4, v6) = match key.split_once('&') {
            Some((a, b)) => (a, Some(b)),
            None => (key, None),
        };
        let (addr, len) = v4.split_once('-').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        let ipv4 = if len == 0 && addr.is_unspecified() {
            None
        } else {
            let n = Ipv4Network::new(addr, len).map_err(|_| bad())?;
            if n.network() != addr {
                return Err(bad());
            }
            Some(n)
        };
        let ipv6 = match v6 {
            None => None,
            Some(v6) => {
                let (addr, len) = v6.split_once('-').ok_or_else(bad)?;
                let addr: Ipv6Addr = addr.parse().map_err(|_| bad())?;
                let len: u8 = len.parse().map_err(|_| bad())?;
                let n = Ipv6Network::new(addr, len).map_err(|_| bad())?;
                if n.network() != addr {
                    return Err(bad());
                }
                Some(n)
            }
        };
        if ipv4.is_none() && ipv6.is_none() {
            return Err(bad());
        }
        Ok(SubnetKey { ipv4, ipv6 })
    }

    /// Whether the two leases overlap in either family: they cannot both be held.
    pub fn shares_a_subnet_with(&self, other: &SubnetKey) -> bool {
        let v4 = matches!((self.ipv4, other.ipv4), (Some(a), Some(b)) if a.overlaps(b));
        let v6 = matches!((self.ipv6, other.ipv6), (Some(a), Some(b)) if a.overlaps(b));
        v4 || v6
    }

    /// The key with `subnet` as its subnet of that subnet's family.
    pub fn with(mut self, subnet: IpNetwork) -> SubnetKey {
        match subnet {
            IpNetwork::V4(n) => self.ipv4 = Some(n),
            IpNetwork::V6(n) => self.ipv6 = Some(n),
        }
        self
    }

    /// The subnet of one family, if the lease holds one.
    pub fn subnet(&self, family: IpFamily) -> Option<IpNetwork> {
        match family {
            IpFamily::V4 => self.ipv4.map(IpNetwork::V4),
            IpFamily::V6 => self.ipv6.map(IpNetwork::V6),
        }
    }
}

/// Which families of its lease a node's Node annotations carry (`--kube-subnet-mgr`), as
/// flannel's backend of the lease's type writes them: each backend says it
/// (`backend::api::Backend::annotated`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Annotated {
    /// IPv4's are written only with IPv4 backend data (vxlan: an IPv6-only network leaves
    /// them alone); else always.
    pub ipv4_needs_data: bool,
    pub ipv6: Ipv6Annotated,
}

/// When a lease's IPv6 family goes into the annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Annotated {
    /// Never: the backend is flannel's IPv4-only one (udp, alloc).
    Never,
    /// With an IPv6 public address (host-gw, extension).
    WithAddress,
    /// With an IPv6 public address and IPv6 backend data (vxlan, wireguard).
    WithData,
}

impl Default for Annotated {
    /// flannel's IPv4-only backends'.
    fn default() -> Annotated {
        Annotated {
            ipv4_needs_data: false,
            ipv6: Ipv6Annotated::Never,
        }
    }
}

/// flannel's `LeaseAttrs`, with the same field names, order and omissions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseAttrs {
    #[serde(rename = "PublicIP", with = "public_ip", default)]
    pub public_ip: Option<Ipv4Addr>,
    #[serde(rename = "PublicIPv6", default)]
    pub public_ipv6: Option<Ipv6Addr>,
    #[serde(
        rename = "BackendType",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub backend_type: String,
    #[serde(
        rename = "BackendData",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub backend_data: Option<Box<RawValue>>,
    #[serde(
        rename = "BackendV6Data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub backend_v6_data: Option<Box<RawValue>>,
}

impl PartialEq for LeaseAttrs {
    fn eq(&self, other: &Self) -> bool {
        let raw = |v: &Option<Box<RawValue>>| v.as_ref().map(|r| r.get().to_string());
        self.public_ip == other.public_ip
            && self.public_ipv6 == other.public_ipv6
            && self.backend_type == other.backend_type
            && raw(&self.backend_data) == raw(&other.backend_data)
            && raw(&self.backend_v6_data) == raw(&other.backend_v6_data)
    }
}

impl Eq for LeaseAttrs {}

/// Go writes an IPv4-less lease's PublicIP as "0.0.0.0"; that reads back as None.
mod public_ip {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::net::Ipv4Addr;

    pub fn serialize<S: Serializer>(ip: &Option<Ipv4Addr>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&ip.unwrap_or(Ipv4Addr::UNSPECIFIED))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Ipv4Addr>, D::Error> {
        let ip = Option::<Ipv4Addr>::deserialize(d)?;
        Ok(ip.filter(|ip| !ip.is_unspecified()))
    }
}

impl LeaseAttrs {
    /// The value stored under the lease's key.
    pub fn encode(&self) -> String {
        // Serialising plain strings, addresses and raw JSON cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(value: &[u8]) -> Result<LeaseAttrs, BadLease> {
        // serde would also take an array for a struct; Go's decoder takes only an object.
        if value.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(BadLease::NotObject);
        }
        serde_json::from_slice(value).map_err(|e| BadLease::Value(e.to_string()))
    }

    /// The public address of one family.
    pub fn public(&self, family: IpFamily) -> Option<IpAddr> {
        match family {
            IpFamily::V4 => self.public_ip.map(IpAddr::V4),
            IpFamily::V6 => self.public_ipv6.map(IpAddr::V6),
        }
    }

    /// The backend's data for one family (`BackendData`, `BackendV6Data`).
    pub fn backend_data_of(&self, family: IpFamily) -> Option<&RawValue> {
        match family {
            IpFamily::V4 => self.backend_data.as_deref(),
            IpFamily::V6 => self.backend_v6_data.as_deref(),
        }
    }

    /// Sets the backend's data of one family.
    pub fn set_backend_data(&mut self, family: IpFamily, data: Option<Box<RawValue>>) {
        match family {
            IpFamily::V4 => self.backend_data = data,
            IpFamily::V6 => self.backend_v6_data = data,
        }
    }
}

/// One node's lease, as every node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: SubnetKey,
    pub attrs: LeaseAttrs,
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        if let Some(ip) = self.attrs.public_ip {
            write!(f, " public-ip {ip}")?;
        }
        if let Some(ip) = self.attrs.public_ipv6 {
            write!(f, " public-ipv6 {ip}")?;
        }
        if !self.attrs.backend_type.is_empty() {
            write!(f, " backend {}", self.attrs.backend_type)?;
        }
        Ok(())
    }
}

impl Lease {
    /// Decodes a stored lease from its key's last element and its value.
    pub fn decode(key: &str, value: &[u8]) -> Result<Lease, BadLease> {
        Ok(Lease {
            key: SubnetKey::parse(key)?,
            attrs: LeaseAttrs::decode(value)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_differ_can_still_share_a_subnet_of_one_family() {
        let k = |t: &str| SubnetKey::parse(t).unwrap();
        let dual = k("10.5.52.0-24&fc00:0:0:1::-64");
        assert!(dual.shares_a_subnet_with(&k("10.5.53.0-24&fc00:0:0:1::-64")));
        assert!(dual.shares_a_subnet_with(&k("10.5.52.0-24&fc00:0:0:2::-64")));
        assert!(dual.shares_a_subnet_with(&k("10.5.52.0-24")));
        assert!(dual.shares_a_subnet_with(&k("0.0.0.0-0&fc00:0:0:1::-64")));
        assert!(!dual.shares_a_subnet_with(&k("10.5.53.0-24&fc00:0:0:2::-64")));
        assert!(!dual.shares_a_subnet_with(&k("0.0.0.0-0&fc00:0:0:2::-64")));
        assert!(!k("10.5.52.0-24").shares_a_subnet_with(&k("0.0.0.0-0&fc00::-64")));
    }

    #[test]
    fn keys_are_written_and_read_as_flannel_does() {
        let cases = [
            "10.5.52.0-24",
            "10.5.52.0-24&fc00:0:0:1::-64",
            "0.0.0.0-0&fc00::-64",
            "10.244.0.0-30",
        ];
        for text in cases {
            let key = SubnetKey::parse(text).unwrap();
            assert_eq!(key.to_string(), text);
        }
        let key = SubnetKey::parse("10.5.52.0-24&fc00:0:0:1::-64").unwrap();
        assert_eq!(key.ipv4.unwrap().to_string(), "10.5.52.0/24");
        assert_eq!(key.ipv6.unwrap().to_string(), "fc00:0:0:1::/64");
        assert!(SubnetKey::parse("0.0.0.0-0&fc00::-64")
            .unwrap()
            .ipv4
            .is_none());
    }

    #[test]
    fn bad_keys_are_refused() {
        for bad in [
            "",
            "10.5.52.0",
            "10.5.52.0-33",
            "10.5.52.1-24",
            "10.5.52.0-24&fc00::",
            "10.5.52.0-24&zz::-64",
            "0.0.0.0-0",
            "banana",
            "10.5.52.0-24-1",
        ] {
            assert!(SubnetKey::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn values_are_byte_for_byte_flannels() {
        let text = r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;
        let attrs = LeaseAttrs::decode(text.as_bytes()).unwrap();
        assert_eq!(attrs.public_ip, Some(Ipv4Addr::new(192, 168, 64, 3)));
        assert_eq!(attrs.public_ipv6, None);
        assert_eq!(attrs.backend_type, "vxlan");
        assert_eq!(attrs.encode(), text);

        let ours = LeaseAttrs {
            public_ip: Some(Ipv4Addr::new(10, 0, 0, 2)),
            public_ipv6: None,
            backend_type: "host-gw".into(),
            backend_data: None,
            backend_v6_data: None,
        };
        assert_eq!(
            ours.encode(),
            r#"{"PublicIP":"10.0.0.2","PublicIPv6":null,"BackendType":"host-gw"}"#
        );
    }

    #[test]
    fn dual_stack_and_v6_only_values() {
        let text = r#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00::3","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}}"#;
        let attrs = LeaseAttrs::decode(text.as_bytes()).unwrap();
        assert_eq!(attrs.public_ip, None);
        assert_eq!(attrs.public_ipv6, Some("fd00::3".parse().unwrap()));
        assert_eq!(attrs.encode(), text);
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &b"not json"[..],
            br#"{"PublicIP":"300.1.1.1"}"#,
            br#"{"PublicIP":7}"#,
            br#"[]"#,
            b"",
        ] {
            assert!(LeaseAttrs::decode(bad).is_err(), "{bad:?} accepted");
        }
    }
}
