//! The spec versions and what each allows.

use crate::error::{CniError, INCOMPATIBLE_VERSION};
use std::fmt;

/// Every spec version this suite speaks, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest version: used where no config names one (VERSION, early errors).
pub const LATEST: Version = Version::V1_1_0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V0_1_0,
    V0_2_0,
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl Version {
    pub const ALL: [Version; 7] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_3_1,
        Version::V0_4_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    pub fn as_str(self) -> &'static str {
        SUPPORTED_VERSIONS[self as usize]
    }

    /// Parses a version string; an unknown one is error code 1 naming it.
    pub fn parse(s: &str) -> Result<Version, CniError> {
        SUPPORTED_VERSIONS
            .iter()
            .position(|v| *v == s)
            .map(|i| Version::ALL[i])
            .ok_or_else(|| {
                CniError::new(
                    INCOMPATIBLE_VERSION,
                    format!(
                        "incompatible CNI versions: config requests cniVersion {s:?}, this plugin supports {}",
                        SUPPORTED_VERSIONS.join(", ")
                    ),
                )
            })
    }

    /// Results of 0.1.0 and 0.2.0 have `ip4`/`ip6` instead of `ips`.
    pub fn has_legacy_result(self) -> bool {
        self < Version::V0_3_0
    }

    pub fn allows_check(self) -> bool {
        self >= Version::V0_4_0
    }

    pub fn allows_status_and_gc(self) -> bool {
        self >= Version::V1_1_0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_version_and_orders_them() {
        for (i, s) in SUPPORTED_VERSIONS.iter().enumerate() {
            let v = Version::parse(s).unwrap();
            assert_eq!(v.as_str(), *s);
            assert_eq!(v, Version::ALL[i]);
        }
        assert!(Version::V0_3_1 < Version::V0_4_0);
        assert!(!Version::V0_3_1.allows_check());
        assert!(Version::V0_4_0.allows_check());
        assert!(!Version::V1_0_0.allows_status_and_gc());
        assert!(Version::V1_1_0.allows_status_and_gc());
    }

    #[test]
    fn unknown_version_is_code_1_naming_it() {
        let e = Version::parse("9.9.9").unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("\"9.9.9\""), "{}", e.msg);
    }
}
