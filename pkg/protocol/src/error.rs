//! The CNI error object and the spec's error codes.

use serde_json::{json, Value};
use std::fmt;

/// Incompatible CNI version.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// Unsupported field in network configuration.
pub const UNSUPPORTED_FIELD: u32 = 2;
/// Container unknown or does not exist.
pub const UNKNOWN_CONTAINER: u32 = 3;
/// Invalid necessary environment variables.
pub const INVALID_ENVIRONMENT: u32 = 4;
/// I/O failure.
pub const IO_FAILURE: u32 = 5;
/// Failed to decode content.
pub const DECODING_FAILURE: u32 = 6;
/// Invalid network config.
pub const INVALID_NETWORK_CONFIG: u32 = 7;
/// Try again later.
pub const TRY_AGAIN_LATER: u32 = 11;
/// STATUS: the plugin is not available (cannot service ADD).
pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
/// STATUS: the plugin has limited connectivity.
pub const LIMITED_CONNECTIVITY: u32 = 51;
/// Anything else: the code the Go skel uses for plain errors.
pub const INTERNAL: u32 = 999;

/// An error as the CNI spec defines it: a code, a message and details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Prefixes the message with what was being done, keeping the code.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }

    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(INVALID_NETWORK_CONFIG, msg)
    }

    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(DECODING_FAILURE, msg)
    }

    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(IO_FAILURE, msg)
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(INTERNAL, msg)
    }

    pub fn env(msg: impl Into<String>) -> Self {
        Self::new(INVALID_ENVIRONMENT, msg)
    }

    /// The JSON object printed on stdout.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }

    /// Reads an error object printed by another plugin.
    pub fn from_json(v: &Value) -> Option<Self> {
        let code = v.get("code")?.as_u64()?;
        let msg = v.get("msg").and_then(Value::as_str).unwrap_or_default();
        let details = v.get("details").and_then(Value::as_str).unwrap_or_default();
        Some(CniError {
            code: u32::try_from(code).unwrap_or(INTERNAL),
            msg: msg.to_string(),
            details: details.to_string(),
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.details.is_empty() {
            write!(f, "{} (code {})", self.msg, self.code)
        } else {
            write!(f, "{}; {} (code {})", self.msg, self.details, self.code)
        }
    }
}

impl std::error::Error for CniError {}

/// Maps an I/O error to code 5 with what was being done.
pub fn io_err(what: impl fmt::Display) -> impl FnOnce(std::io::Error) -> CniError {
    move |e| CniError::io(format!("{what}: {e}"))
}

pub type Result<T, E = CniError> = std::result::Result<T, E>;

/// The kernel layer's errors at a plugin's edge: a namespace that is not there is code 3
/// (unknown container), an argument refused before the kernel saw it code 7, anything the
/// kernel or a rule tool refused code 5; a tool's input goes in the details.
#[cfg(feature = "kernel")]
impl From<cni_kernel::Error> for CniError {
    fn from(e: cni_kernel::Error) -> CniError {
        let code = match e.kind() {
            cni_kernel::Kind::NoNamespace => UNKNOWN_CONTAINER,
            cni_kernel::Kind::Invalid => INVALID_NETWORK_CONFIG,
            cni_kernel::Kind::Failed => IO_FAILURE,
        };
        CniError::new(code, e.to_string()).with_details(e.input())
    }
}

#[cfg(all(test, feature = "kernel"))]
mod kernel_tests {
    use super::*;
    use cni_kernel::{Error, Kind};

    #[test]
    fn kernel_errors_take_the_spec_code_of_their_kind() {
        let gone = Error::failed("opening network namespace", "/run/netns/x", "gone")
            .with_kind(Kind::NoNamespace);
        assert_eq!(CniError::from(gone).code, UNKNOWN_CONTAINER);
        let bad = Error::invalid("addressing the sysctls of interface", "\"all\"", "no");
        assert_eq!(CniError::from(bad).code, INVALID_NETWORK_CONFIG);
        let tool = Error::failed("running", "nft -f -", "syntax error").with_input("add rule x");
        let e = CniError::from(tool);
        assert_eq!(e.code, IO_FAILURE);
        assert_eq!(e.msg, "running nft -f -: syntax error");
        assert_eq!(e.details, "add rule x");
    }
}
