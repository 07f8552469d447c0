//! The prefix of the Node annotations that hold the kube mode's leases: flanneld's default and
//! the shape the API server accepts, one check for the flag and for the kube registry.

/// flanneld's `--kube-annotation-prefix` default.
pub const DEFAULT: &str = "flannel.alpha.coreos.com";

/// A prefix the API server's annotation names cannot carry, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{prefix:?} {why}")]
pub struct BadPrefix {
    pub prefix: String,
    pub why: &'static str,
}

/// `prefix` completed as flanneld completes it (`example.com` becomes `example.com/`,
/// `example.com/net` becomes `example.com/net-`), ready to have a name appended.
pub fn complete(prefix: &str) -> Result<String, BadPrefix> {
    let refuse = |why| BadPrefix {
        prefix: prefix.to_string(),
        why,
    };
    let mut p = prefix.to_string();
    match p.matches('/').count() {
        0 => p.push('/'),
        1 => {}
        _ => return Err(refuse("has more than one slash")),
    }
    if !p.ends_with('/') && !p.ends_with('-') {
        p.push('-');
    }
    // A domain, a slash, then optionally a word and a dash. flanneld checks only the end of the
    // prefix; the whole of it is checked here, since the API server refuses annotation names
    // with anything else in front.
    let shape = regex::Regex::new(r"^[a-z0-9_-]+(?:\.[a-z0-9_-]+)+/(?:[a-z0-9_-]+-)?$");
    if !shape.is_ok_and(|re| re.is_match(&p)) {
        return Err(refuse(
            "is not a domain followed by / and an optional name (like \
             flannel.alpha.coreos.com or example.com/net)",
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_as_flanneld_does() {
        assert_eq!(complete(DEFAULT).unwrap(), "flannel.alpha.coreos.com/");
        assert_eq!(complete("example.com/net").unwrap(), "example.com/net-");
        assert_eq!(complete("example.com/net-").unwrap(), "example.com/net-");
        assert_eq!(
            complete("a.b/c/d").unwrap_err().why,
            "has more than one slash"
        );
        assert!(complete("nodomain").is_err());
        assert!(complete("Example.com").is_err());
    }
}
