//! The daemon's own errors, one type per layer: a bad start (exit status 2) and a lost lease
//! (exit status 1); a plane's pass that failed (logged, tried again) is the planes' own
//! (`planes::PassError`). Each says what it was doing in the words the log lines have always
//! used.

use crate::config::ConfigError;
use crate::iface::IfaceError;
use crate::lease::SubnetKey;
use crate::registry::RegistryError;
use std::fmt;

/// Why the start cannot go on: a bad network config, external interface or backend for this
/// node (exit status 2); or, for `doctor`, which looks once and waits for nothing, what it
/// could not find.
#[derive(Debug)]
pub enum StartError {
    Config(ConfigError),
    /// `doctor`: no network config where the registry keeps it.
    NoConfig(String),
    /// `doctor`: the registry did not answer (`where_` says which).
    Registry {
        where_: String,
        error: RegistryError,
    },
    /// `doctor`: no lease carries this node's address.
    NoLease(String),
    Interface(IfaceError),
    /// The backend cannot serve this node as it is (host-gw with a public address that is not
    /// the interface's).
    Backend(crate::backend::api::Refusal),
    /// The kernel refused what the backend needs before the lease is taken (its device).
    Kernel(cni_kernel::Error),
    /// The registry's lease cannot serve this network config (a podCIDR outside `Network`).
    Lease(RegistryError),
    /// `--ip-masq` asks for rules no installed tool can write.
    Firewall(cni_kernel::Error),
    /// The iptables mode `--iptables-mode` asks for cannot be run here.
    IptablesMode(cni_kernel::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::NoConfig(at) => write!(f, "no network config at {at}"),
            StartError::Registry { where_, error } => write!(f, "{where_}: {error}"),
            StartError::NoLease(where_) => {
                write!(f, "no lease carries this node's address in {where_}")
            }
            StartError::Interface(e) => e.fmt(f),
            StartError::Backend(why) => why.fmt(f),
            StartError::Kernel(e) => e.fmt(f),
            StartError::Lease(why) => why.fmt(f),
            StartError::Firewall(e) => write!(f, "--ip-masq: {e}"),
            StartError::IptablesMode(e) => write!(f, "--iptables-mode: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

impl StartError {
    /// What `doctor` calls the thing that is wrong or missing.
    pub fn kind(&self) -> &'static str {
        match self {
            StartError::Config(_) | StartError::NoConfig(_) | StartError::Backend(_) => "config",
            StartError::Registry { .. } => "registry",
            StartError::NoLease(_) | StartError::Lease(_) => "lease",
            StartError::Interface(_) => "interface",
            StartError::Kernel(_) => "kernel",
            StartError::Firewall(_) | StartError::IptablesMode(_) => "firewall",
        }
    }

    /// `missing` or `wrong`, as `doctor` says it.
    pub fn state(&self) -> &'static str {
        match self {
            StartError::NoConfig(_) | StartError::NoLease(_) => "missing",
            _ => "wrong",
        }
    }
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> StartError {
        StartError::Config(e)
    }
}

impl From<IfaceError> for StartError {
    fn from(e: IfaceError) -> StartError {
        StartError::Interface(e)
    }
}

impl From<cni_kernel::Error> for StartError {
    fn from(e: cni_kernel::Error) -> StartError {
        StartError::Kernel(e)
    }
}

/// Why this node's lease is gone: exit status 1, so that the next start takes one again.
#[derive(Debug)]
pub enum LeaseLost {
    /// Someone deleted it from the registry (`where_` says which).
    Removed { own: SubnetKey, where_: String },
    /// The task following the registry ended without saying so.
    Follower(tokio::task::JoinError),
}

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLost::Removed { own, where_ } => {
                write!(f, "this node's lease {own} was removed from {where_}")
            }
            LeaseLost::Follower(why) => write!(f, "the lease watcher failed: {why}"),
        }
    }
}

impl std::error::Error for LeaseLost {}
