//! What Linux accepts as an interface name, checked in one place: the CNI environment
//! (`CNI_IFNAME`), bridge's config (`bridge`) and the kernel layer (a sysctl's path) all ask
//! here, so that each refuses the same names with the same words.

/// The kernel's limit (IFNAMSIZ less the terminating NUL).
pub const MAX_LEN: usize = 15;

/// Why `name` cannot be an interface name (1 to 15 bytes, not `.` or `..`, no `/`, `:` or
/// whitespace), or None when it can.
pub fn problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_LEN {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is not a valid interface name")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_says_what_is_wrong() {
        assert_eq!(problem(""), Some("is empty"));
        assert_eq!(problem("abcdefghijklmnop"), Some("is longer than 15 bytes"));
        assert_eq!(problem(".."), Some("is not a valid interface name"));
        for bad in ["a/b", "a:b", "a b", "a\tb"] {
            assert_eq!(
                problem(bad),
                Some("contains '/', ':' or whitespace"),
                "{bad:?}"
            );
        }
        for good in ["eth0", "abcdefghijklmno", "flannel.1", "cni-0_x"] {
            assert_eq!(problem(good), None, "{good:?}");
        }
    }
}
