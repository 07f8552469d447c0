//! One way to drive a WireGuard device whichever runs it: the kernel (generic netlink) or a
//! userspace tunnel (its UAPI socket); and the choice between them, made once at start.

use std::fmt;
use std::io;
use std::path::Path;

use crate::genl::KernelWireguard;
use crate::uapi::{ClientError, DeviceConfig, DeviceState, UapiClient};

/// What went wrong choosing the tunnel or driving its device.
#[derive(Debug)]
pub enum ControlError {
    /// A forced mode that is none of kernel, userspace or auto.
    UnknownMode(String),
    /// The kernel's tunnel forced on a kernel that cannot run one; why it cannot.
    KernelForced(String),
    /// The kernel's `wireguard` generic netlink family: absent, or its answer.
    Kernel(io::Error),
    /// The userspace tunnel's UAPI socket.
    Userspace(ClientError),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::UnknownMode(m) => write!(f, "{m:?} is not kernel, userspace or auto"),
            ControlError::KernelForced(why) => write!(
                f,
                "the kernel tunnel is forced, but the kernel cannot run one: {why}"
            ),
            ControlError::Kernel(e) => write!(f, "{e}"),
            ControlError::Userspace(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Kernel(e) => Some(e),
            ControlError::Userspace(e) => Some(e),
            _ => None,
        }
    }
}

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
    pub fn parse_forced(text: &str) -> Result<Option<TunnelMode>, ControlError> {
        match text {
            "auto" | "" => Ok(None),
            "kernel" => Ok(Some(TunnelMode::Kernel)),
            "userspace" => Ok(Some(TunnelMode::Userspace)),
            other => Err(ControlError::UnknownMode(other.to_string())),
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
) -> Result<(TunnelMode, String), ControlError> {
    match (forced, kernel) {
        (Some(TunnelMode::Kernel), Ok(())) => Ok((TunnelMode::Kernel, "forced".into())),
        (Some(TunnelMode::Kernel), Err(why)) => Err(ControlError::KernelForced(why.clone())),
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

    fn kernel() -> Result<KernelWireguard, ControlError> {
        KernelWireguard::open()
            .map_err(ControlError::Kernel)?
            .ok_or_else(|| {
                ControlError::Kernel(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the kernel has no \"wireguard\" generic netlink family",
                ))
            })
    }

    pub fn get(&self) -> Result<DeviceState, ControlError> {
        match self {
            Control::Kernel { name } => Self::kernel()?.get(name).map_err(ControlError::Kernel),
            Control::Userspace(c) => c.get().map_err(ControlError::Userspace),
        }
    }

    pub fn set(&self, config: &DeviceConfig) -> Result<(), ControlError> {
        match self {
            Control::Kernel { name } => Self::kernel()?
                .set(name, config)
                .map_err(ControlError::Kernel),
            Control::Userspace(c) => c.set(config).map_err(ControlError::Userspace),
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
            matches!(&err, ControlError::KernelForced(why) if why == "no link kind wireguard"),
            "{err:?}"
        );
        let said = err.to_string();
        assert!(
            said.contains("forced") && said.contains("no link kind wireguard"),
            "{said}"
        );
    }

    #[test]
    fn forced_modes_parse_and_others_are_refused() {
        assert_eq!(TunnelMode::parse_forced("auto").unwrap(), None);
        assert_eq!(
            TunnelMode::parse_forced("kernel").unwrap(),
            Some(TunnelMode::Kernel)
        );
        assert_eq!(
            TunnelMode::parse_forced("userspace").unwrap(),
            Some(TunnelMode::Userspace)
        );
        let err = TunnelMode::parse_forced("boringtun").unwrap_err();
        assert!(
            matches!(&err, ControlError::UnknownMode(m) if m == "boringtun"),
            "{err:?}"
        );
        assert!(err.to_string().contains("\"boringtun\""), "{err}");
    }
}
