//! Whether the kernel can run WireGuard itself: the kernel path is taken only when it can.

use cni_kernel::netlink::{Conn, LinkKind, LinkSpec};

use crate::genl::KernelWireguard;

/// Ok when the kernel of `conn`'s namespace makes a link of kind `wireguard` (a probe, made
/// and deleted at once) and its `wireguard` generic netlink family answers; else why not.
pub async fn kernel_support(conn: &Conn) -> Result<(), String> {
    let probe = format!("wgprobe{}", std::process::id() % 10_000_000);
    let spec = LinkSpec {
        name: probe.clone(),
        kind: LinkKind::Named("wireguard"),
        mtu: None,
        mac: None,
    };
    match conn.create_link(&spec).await {
        Ok(_) => {
            if let Ok(Some(link)) = conn.link_by_name(&probe).await {
                let _ = conn.delete_link(link.index).await;
            }
        }
        Err(e) if e.errno().map(|n| n as i32) == Some(libc::EOPNOTSUPP) => {
            return Err("the kernel has no WireGuard: it knows no link kind \"wireguard\"".into());
        }
        Err(e) => return Err(format!("probing for kernel WireGuard: {e}")),
    }
    match KernelWireguard::open() {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(
            "the kernel made a wireguard link but has no \"wireguard\" generic netlink family"
                .into(),
        ),
        Err(e) => Err(format!(
            "opening the \"wireguard\" generic netlink family: {e}"
        )),
    }
}
