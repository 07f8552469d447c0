//! What flanneld's wireguard backend puts in and reads from leases: the BackendData carrying
//! the node's public key, and the endpoint chosen for a node that has both families.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::Value;

use crate::key::Key;

/// The lease's BackendData / BackendV6Data, byte for byte as flanneld writes it since v0.26:
/// the public key and the port the family's device listens on.
pub fn backend_data(public: &Key, port: u16) -> String {
    // Keys are base64: nothing in them needs escaping in JSON.
    format!(
        "{{\"PublicKey\":\"{}\",\"Port\":{port}}}",
        public.to_base64()
    )
}

/// A remote node's announcement: its public key and, from flanneld versions that add it, the
/// port its device listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    pub public_key: Key,
    pub port: Option<u16>,
}

/// Reads BackendData; the error says what is wrong with it (the caller names the node).
pub fn parse_backend_data(raw: &str) -> Result<Announced, String> {
    let v: Value =
        serde_json::from_str(raw).map_err(|e| format!("backend data {raw:?} is not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("backend data {raw:?} is not a JSON object"))?;
    // Go's decoder matches field names without regard to case.
    let field = |name: &str| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let key = match field("PublicKey") {
        None | Some(Value::Null) => return Err("the lease announces no PublicKey".into()),
        Some(Value::String(s)) if s.is_empty() => {
            return Err("the lease announces no PublicKey".into())
        }
        Some(Value::String(s)) => Key::from_base64(s).map_err(|e| format!("PublicKey: {e}"))?,
        Some(other) => return Err(format!("PublicKey {other} is not a string")),
    };
    let port = match field("Port") {
        None | Some(Value::Null) => None,
        Some(p) => match p.as_u64() {
            Some(0) => None,
            Some(n) if n <= u64::from(u16::MAX) => Some(n as u16),
            _ => return Err(format!("Port {p} is not a UDP port")),
        },
    };
    Ok(Announced {
        public_key: key,
        port,
    })
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    ip.is_private()
}

/// RFC 4193 unique local addresses, as flannel's IP6.IsPrivate.
fn is_private_v6(ip: Ipv6Addr) -> bool {
    ip.octets()[0] & 0xfe == 0xfc
}

/// The address to reach a node at in `auto` mode, as flanneld chooses it: its only address;
/// else IPv4 when its IPv4 is public and this node has IPv4; else IPv6 when both sides' IPv6
/// is public; else IPv4.
pub fn auto_endpoint(
    remote_v4: Option<Ipv4Addr>,
    remote_v6: Option<Ipv6Addr>,
    local_v4: Option<Ipv4Addr>,
    local_v6: Option<Ipv6Addr>,
) -> Option<IpAddr> {
    match (remote_v4, remote_v6) {
        (None, None) => None,
        (Some(v4), None) => Some(IpAddr::V4(v4)),
        (None, Some(v6)) => Some(IpAddr::V6(v6)),
        (Some(v4), Some(v6)) => {
            if !is_private_v4(v4) && local_v4.is_some() {
                Some(IpAddr::V4(v4))
            } else if !is_private_v6(v6) && local_v6.is_some_and(|l| !is_private_v6(l)) {
                Some(IpAddr::V6(v6))
            } else {
                Some(IpAddr::V4(v4))
            }
        }
    }
}

/// flanneld's one overhead for the device's MTU, whatever the underlay: an IPv6 header (40),
/// UDP (8), WireGuard's header and tag (32).
pub const MTU_OVERHEAD: u32 = 80;

/// The device's MTU on an external interface of MTU `external`.
pub fn device_mtu(external: u32) -> u32 {
    external.saturating_sub(MTU_OVERHEAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_data_is_flanneld_s_byte_for_byte_and_reads_back() {
        let key = Key::from_base64("HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=").unwrap();
        let raw = backend_data(&key, 51830);
        assert_eq!(
            raw,
            r#"{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=","Port":51830}"#
        );
        assert_eq!(
            parse_backend_data(&raw).unwrap(),
            Announced {
                public_key: key,
                port: Some(51830)
            }
        );
        // flanneld before v0.26 wrote no port.
        let older = r#"{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}"#;
        assert_eq!(parse_backend_data(older).unwrap().port, None);
        let lower = r#"{"publickey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}"#;
        assert_eq!(parse_backend_data(lower).unwrap().public_key, key);
    }

    #[test]
    fn leases_without_a_usable_key_are_refused_saying_why() {
        for (raw, why) in [
            ("{}", "no PublicKey"),
            (r#"{"PublicKey":""}"#, "no PublicKey"),
            (r#"{"PublicKey":"AAAA"}"#, "3 bytes"),
            (r#"{"PublicKey":"@@@"}"#, "not base64"),
            (r#"{"PublicKey":5}"#, "not a string"),
            ("null", "not a JSON object"),
            ("{", "not JSON"),
            (
                r#"{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=","Port":70000}"#,
                "not a UDP port",
            ),
        ] {
            let err = parse_backend_data(raw).unwrap_err();
            assert!(err.contains(why), "{raw}: {err}");
        }
    }

    #[test]
    fn auto_mode_prefers_public_ipv4_then_public_ipv6_then_ipv4() {
        let pub4: Ipv4Addr = "198.51.100.2".parse().unwrap();
        let priv4: Ipv4Addr = "192.168.0.2".parse().unwrap();
        let pub6: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let ula6: Ipv6Addr = "fd00::2".parse().unwrap();
        let local4 = Some("192.168.0.1".parse().unwrap());
        let local6 = Some("2001:db8::1".parse().unwrap());
        assert_eq!(
            auto_endpoint(Some(priv4), None, local4, local6),
            Some(IpAddr::V4(priv4))
        );
        assert_eq!(
            auto_endpoint(None, Some(ula6), local4, local6),
            Some(IpAddr::V6(ula6))
        );
        assert_eq!(
            auto_endpoint(Some(pub4), Some(pub6), local4, local6),
            Some(IpAddr::V4(pub4))
        );
        assert_eq!(
            auto_endpoint(Some(priv4), Some(pub6), local4, local6),
            Some(IpAddr::V6(pub6))
        );
        assert_eq!(
            auto_endpoint(Some(priv4), Some(pub6), local4, Some(ula6)),
            Some(IpAddr::V4(priv4))
        );
        assert_eq!(
            auto_endpoint(Some(priv4), Some(ula6), local4, local6),
            Some(IpAddr::V4(priv4))
        );
        assert_eq!(
            auto_endpoint(Some(pub4), Some(pub6), None, local6),
            Some(IpAddr::V6(pub6))
        );
        assert_eq!(auto_endpoint(None, None, local4, local6), None);
    }

    #[test]
    fn device_mtu_is_the_external_less_80_whatever_the_family() {
        assert_eq!(device_mtu(1500), 1420);
        assert_eq!(device_mtu(9001), 8921);
        assert_eq!(device_mtu(40), 0);
    }
}
