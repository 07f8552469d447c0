//! The CNI exec protocol, shared by every plugin of the suite.
//!
//! From the `cni-plugin` crate this takes the MAC address and DNS types; the
//! environment, versions, results, errors and delegation are owned here because
//! that crate accepts only 0.4.0 and 1.0.0, has no STATUS or GC, refuses
//! upper-case container IDs and requires result fields real results omit.

pub mod env;
pub mod error;
pub mod gokeys;
pub mod invoke;
pub mod request;
pub mod result;
pub mod skel;
pub mod version;

pub use cni_plugin::config::Dns;
pub use cni_plugin::macaddr::MacAddr;
pub use env::{Command, Env};
pub use error::{CniError, Result};
pub use request::{decode, decode_lenient, Attachment, Request};
pub use result::{CniResult, Interface, IpConfig, Route};
pub use skel::{run, Plugin};
pub use version::Version;
