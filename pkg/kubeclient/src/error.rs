//! What a request was and what its failure means: the status of an error answer as the
//! caller acts on it (wait, re-authenticate, list again, give up).

use serde::Deserialize;
use std::fmt;

/// What a request was, for error messages: RBAC's verb and resource, and the object.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    pub verb: &'static str,
    /// The resource as RBAC names it: `nodes`, `nodes/status`, `networkpolicies`.
    pub resource: &'a str,
    pub name: Option<&'a str>,
}

impl fmt::Display for Op<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(n) = self.name {
            write!(f, " {n:?}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeError {
    /// The API server could not be reached, timed out or answered 429 or 5xx: try again later.
    Unavailable(String),
    /// 401: the API server does not accept the credentials (an expired token).
    Unauthenticated(String),
    /// 403: the account lacks the right to this verb on this resource.
    Denied {
        verb: &'static str,
        resource: String,
        message: String,
        /// The rights the program needs, as its operator grants them (the client's
        /// [`crate::KubeClient::needing`]).
        needs: Option<&'static str>,
    },
    NotFound(String),
    /// 410: what was asked for is older than the server keeps.
    Expired(String),
    /// Any other refusal, or an answer that is not what the API gives.
    Refused(String),
    /// No configuration to reach the API server with.
    Config(String),
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeError::Denied {
                verb,
                resource,
                message,
                needs,
            } => {
                write!(
                    f,
                    "the API server does not let this account {verb} {resource}: {message}"
                )?;
                match needs {
                    Some(n) => write!(f, " ({n})"),
                    None => Ok(()),
                }
            }
            KubeError::Unavailable(m)
            | KubeError::Unauthenticated(m)
            | KubeError::NotFound(m)
            | KubeError::Expired(m)
            | KubeError::Refused(m)
            | KubeError::Config(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for KubeError {}

/// What an answer with HTTP status `code` means for `op`.
pub fn classify(op: Op<'_>, code: u16, message: &str) -> KubeError {
    match code {
        401 => KubeError::Unauthenticated(format!("{op}: {message} (401)")),
        403 => KubeError::Denied {
            verb: op.verb,
            resource: op.resource.to_string(),
            message: message.to_string(),
            needs: None,
        },
        404 => KubeError::NotFound(format!("{op}: {message}")),
        410 => KubeError::Expired(format!("{op}: {message}")),
        429 | 500..=599 => KubeError::Unavailable(format!("{op}: {message} ({code})")),
        _ => KubeError::Refused(format!("{op}: {message} ({code})")),
    }
}

/// The message of an error answer: its Status's, else its text.
pub(crate) fn answer_message(body: &[u8], status: http::StatusCode) -> String {
    #[derive(Deserialize)]
    struct Status {
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Status>(body) {
        Ok(s) if !s.message.is_empty() => s.message,
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                status.canonical_reason().unwrap_or("").to_string()
            } else {
                text.chars().take(300).collect()
            }
        }
    }
}

/// The messages of an error's chain, each once.
pub(crate) fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let t = e.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_verb_and_the_resource() {
        let op = Op {
            verb: "patch",
            resource: "nodes/status",
            name: Some("n1"),
        };
        let msg = r#"nodes "n1" is forbidden: User "system:serviceaccount:kube-flannel:flannel" cannot patch resource "nodes/status" in API group "" at the cluster scope"#;
        let e = classify(op, 403, msg);
        assert!(matches!(
            &e,
            KubeError::Denied {
                verb: "patch",
                resource,
                ..
            } if resource == "nodes/status"
        ));
        let text = e.to_string();
        assert!(
            text.contains("patch nodes/status") && text.contains(msg),
            "{text}"
        );
        assert!(matches!(
            classify(op, 503, "down"),
            KubeError::Unavailable(_)
        ));
        assert!(matches!(classify(op, 410, "old"), KubeError::Expired(_)));
        assert!(matches!(classify(op, 422, "bad"), KubeError::Refused(_)));
    }
}
