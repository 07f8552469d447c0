//! One way to drive a WireGuard device whichever runs it: the kernel (generic netlink) or a
//! userspace tunnel (its UAPI socket); and the choice between them, made once at start.

use std::fmt;
use std::io;
use std::path::Path;

use crate::genl::KernelWireguard;
use crate::uapi::{DeviceConfig, DeviceState, UapiClient};

/// Which WireGuard runs the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelMode {
    Kernel,
    Userspace,
}

impl TunnelMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TunnelMode::Kernel => "kernel",
            TunnelMode::Userspace => "userspace",
        }
    }

    /// Reads a forced mode: "kernel", "userspace", or "auto" (None: chosen at start).
    pub fn parse_forced(text: &str) -> Result<Option<TunnelMode>, String> {
        match text {
            "auto" | "" => Ok(None),
            "kernel" => Ok(Some(TunnelMode::Kernel)),
            "userspace" => Ok(Some(TunnelMode::Userspace)),
            other => Err(format!("{other:?} is not kernel, userspace or auto")),
        }
    }
}

impl fmt::Display for TunnelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mode to run, and why, given a forced one and whether the kernel has WireGuard
/// (`kernel`: Ok, or why not). Forcing the kernel's on a kernel without it is an error.
pub fn choose_mode(
    forced: Option<TunnelMode>,
    kernel: &Result<(), String>,
) -> Result<(TunnelMode, String), String> {
    match (forced, kernel) {
        (Some(TunnelMode::Kernel), Ok(())) => Ok((TunnelMode::Kernel, "forced".into())),
        (Some(TunnelMode::Kernel), Err(why)) => Err(format!(
            "the kernel tunnel is forced, but the kernel cannot run one: {why}"
        )),
        (Some(TunnelMode::Userspace), _) => Ok((TunnelMode::Userspace, "forced".into())),
        (None, Ok(())) => Ok((TunnelMode::Kernel, "the kernel has WireGuard".into())),
        (None, Err(why)) => Ok((TunnelMode::Userspace, why.clone())),
    }
}

/// A device's controls: generic netlink for the kernel's, the UAPI socket for a userspace one.
#[derive(Debug, Clone)]
pub enum Control {
    Kernel { name: String },
    Userspace(UapiClient),
}

impl Control {
    pub fn for_mode(mode: TunnelMode, name: &str, socket_dir: &Path) -> Control {
        match mode {
            TunnelMode::Kernel => Control::Kernel {
                name: name.to_string(),
            },
            TunnelMode::Userspace => Control::Userspace(UapiClient::in_dir(socket_dir, name)),
        }
    }

    fn kernel() -> io::Result<KernelWireguard> {
        KernelWireguard::open()?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel has no \"wireguard\" generic netlink family",
            )
        })
    }

    pub fn get(&self) -> io::Result<DeviceState> {
        match self {
            Control::Kernel { name } => Self::kernel()?.get(name),
            Control::Userspace(c) => c.get().map_err(|e| io::Error::other(e.to_string())),
        }
    }

    pub fn set(&self, config: &DeviceConfig) -> io::Result<()> {
        match self {
            Control::Kernel { name } => Self::kernel()?.set(name, config),
            Control::Userspace(c) => c.set(config).map_err(|e| io::Error::other(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_s_tunnel_is_taken_when_it_can_be_and_forcing_it_fails_when_not() {
        let has: Result<(), String> = Ok(());
        let lacks: Result<(), String> = Err("no link kind wireguard".into());
        assert_eq!(choose_mode(None, &has).unwrap().0, TunnelMode::Kernel);
        let (mode, why) = choose_mode(None, &lacks).unwrap();
        assert_eq!(
            (mode, why.as_str()),
            (TunnelMode::Userspace, "no link kind wireguard")
        );
        assert_eq!(
            choose_mode(Some(TunnelMode::Userspace), &has).unwrap().0,
            TunnelMode::Userspace
        );
        let err = choose_mode(Some(TunnelMode::Kernel), &lacks).unwrap_err();
        assert!(
            err.contains("forced") && err.contains("no link kind wireguard"),
            "{err}"
        );
    }

    #[test]
    fn forced_modes_parse_and_others_are_refused() {
        assert_eq!(TunnelMode::parse_forced("auto"), Ok(None));
        assert_eq!(
            TunnelMode::parse_forced("kernel"),
            Ok(Some(TunnelMode::Kernel))
        );
        assert_eq!(
            TunnelMode::parse_forced("userspace"),
            Ok(Some(TunnelMode::Userspace))
        );
        assert!(TunnelMode::parse_forced("boringtun")
            .unwrap_err()
            .contains("\"boringtun\""));
    }
}
