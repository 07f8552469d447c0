//! The backend types, each in its own module behind one trait ([`api::Backend`]): what the
//! datapath programs for the other nodes' leases. Adding a type is its module and a line in
//! [`TYPES`].

pub mod alloc;
pub mod api;
pub mod extension;
pub mod hostgw;
pub mod ipip;
pub mod ipsec;
pub mod udp;
pub mod vxlan;
pub mod wireguard;

use crate::config::{ConfigError, NetConfig};
use api::Backend;
use std::sync::Arc;

type Make = fn(&NetConfig) -> Result<Arc<dyn Backend>, ConfigError>;

/// Every backend type by its `Backend.Type`, and how it reads its keys from the config.
const TYPES: &[(&str, Make)] = &[
    ("vxlan", |cfg| Ok(Arc::new(vxlan::Vxlan::from_config(cfg)?))),
    ("host-gw", |_| Ok(Arc::new(hostgw::HostGw))),
    ("alloc", |_| Ok(Arc::new(alloc::Alloc))),
    ("wireguard", |cfg| {
        Ok(Arc::new(wireguard::WireGuard::from_config(cfg)?))
    }),
    ("udp", |cfg| Ok(Arc::new(udp::Udp::from_config(cfg)?))),
    ("extension", |cfg| {
        Ok(Arc::new(extension::Extension::from_config(cfg)?))
    }),
    ("ipip", |_| Ok(Arc::new(ipip::Ipip))),
    ("ipsec", |_| Ok(Arc::new(ipsec::Ipsec))),
];

/// The backend the network config names, its keys checked; each refusal names the key.
pub fn select(cfg: &NetConfig) -> Result<Arc<dyn Backend>, ConfigError> {
    match TYPES.iter().find(|(name, _)| *name == cfg.backend_type) {
        Some((_, make)) => make(cfg),
        None => {
            let names: Vec<&str> = TYPES.iter().map(|(n, _)| *n).collect();
            let (last, rest) = names.split_last().unwrap_or((&"", &[]));
            Err(ConfigError {
                key: "Backend.Type".into(),
                value: cfg.backend_type.clone(),
                reason: format!("is not supported: use {} or {last}", rest.join(", ")),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    fn name(text: &str) -> Result<&'static str, ConfigError> {
        select(&config::parse(text).unwrap()).map(|b| b.name())
    }

    #[test]
    fn each_type_says_which_families_its_node_annotations_carry() {
        use crate::lease::{Annotated, Ipv6Annotated::*};
        let of = |t: &str| {
            let text = format!(r#"{{"Network":"10.5.0.0/16","Backend":{{"Type":"{t}"}}}}"#);
            select(&config::parse(&text).unwrap()).unwrap().annotated()
        };
        let a = |ipv4_needs_data, ipv6| Annotated {
            ipv4_needs_data,
            ipv6,
        };
        assert_eq!(of("vxlan"), a(true, WithData));
        assert_eq!(of("wireguard"), a(false, WithData));
        assert_eq!(of("host-gw"), a(false, WithAddress));
        assert_eq!(of("alloc"), a(false, Never));
    }

    #[test]
    fn each_type_by_its_name_and_a_refusal_naming_the_others() {
        assert_eq!(name(r#"{"Network":"10.5.0.0/16"}"#).unwrap(), "udp");
        assert_eq!(
            name(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap(),
            "vxlan"
        );
        assert_eq!(
            name(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#).unwrap(),
            "host-gw"
        );
        assert_eq!(
            name(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"alloc"}}"#).unwrap(),
            "alloc"
        );
        let e = name(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"gre"}}"#).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("Backend.Type", "gre"));
        assert_eq!(
            e.reason,
            "is not supported: use vxlan, host-gw, alloc, wireguard, udp, extension, ipip or ipsec"
        );
        let e = name(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":"one"}}"#)
            .unwrap_err();
        assert_eq!(e.key, "Backend.VNI");
    }
}
