//! The kernel layer's one error: what it was doing, on which object, and why (an errno, or a
//! tool's own message). Callers that speak CNI turn it into a CNI error at their edge.

use nix::errno::Errno;
use std::fmt;

/// What kind of failure, as far as a caller needs to tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A network namespace that does not exist (or cannot be opened).
    NoNamespace,
    /// An argument the kernel layer refuses before asking the kernel (a bad interface name).
    Invalid,
    /// The kernel or a tool said no.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: Kind,
    op: String,
    object: String,
    errno: Option<Errno>,
    cause: String,
    input: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `op` says what was being done ("creating bridge"), `object` on what ("cni0").
    pub fn new(kind: Kind, op: impl Into<String>, object: impl fmt::Display) -> Error {
        Error {
            kind,
            op: op.into(),
            object: object.to_string(),
            errno: None,
            cause: String::new(),
            input: String::new(),
        }
    }

    /// The kernel refused with `errno`.
    pub fn os(op: impl Into<String>, object: impl fmt::Display, errno: Errno) -> Error {
        Error {
            errno: Some(errno),
            ..Error::new(Kind::Failed, op, object)
        }
    }

    /// A failure described by text (a tool's stderr, a decoding problem).
    pub fn failed(
        op: impl Into<String>,
        object: impl fmt::Display,
        cause: impl fmt::Display,
    ) -> Error {
        Error::new(Kind::Failed, op, object).with_cause(cause)
    }

    /// An argument refused before the kernel saw it.
    pub fn invalid(
        op: impl Into<String>,
        object: impl fmt::Display,
        cause: impl fmt::Display,
    ) -> Error {
        Error::new(Kind::Invalid, op, object).with_cause(cause)
    }

    /// From an I/O error: its errno when it has one, else its text.
    pub fn io(op: impl Into<String>, object: impl fmt::Display, e: &std::io::Error) -> Error {
        match e.raw_os_error() {
            Some(n) => Error::os(op, object, Errno::from_raw(n)),
            None => Error::failed(op, object, e),
        }
    }

    pub fn with_kind(mut self, kind: Kind) -> Error {
        self.kind = kind;
        self
    }

    pub fn with_cause(mut self, cause: impl fmt::Display) -> Error {
        self.cause = cause.to_string();
        self
    }

    /// What a tool was given (a rule batch), for the caller to show.
    pub fn with_input(mut self, input: impl Into<String>) -> Error {
        self.input = input.into();
        self
    }

    /// Names the object the way the caller knows it (a device by its name, not its index).
    pub fn with_object(mut self, object: impl fmt::Display) -> Error {
        self.object = object.to_string();
        self
    }

    /// Prefixes what was being done with the larger operation it was part of.
    pub fn context(mut self, what: impl fmt::Display) -> Error {
        self.op = format!("{what}: {}", self.op);
        self
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn op(&self) -> &str {
        &self.op
    }

    pub fn object(&self) -> &str {
        &self.object
    }

    pub fn errno(&self) -> Option<Errno> {
        self.errno
    }

    pub fn cause(&self) -> &str {
        &self.cause
    }

    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.op)?;
        if !self.object.is_empty() {
            write!(f, " {}", self.object)?;
        }
        match (self.errno, self.cause.is_empty()) {
            (Some(e), true) => write!(f, ": {} ({e:?})", e.desc()),
            (Some(e), false) => write!(f, ": {} ({e:?}): {}", e.desc(), self.cause),
            (None, false) => write!(f, ": {}", self.cause),
            (None, true) => Ok(()),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_what_on_which_and_why() {
        let e = Error::os("creating bridge", "cni0", Errno::EEXIST);
        assert_eq!(e.to_string(), "creating bridge cni0: File exists (EEXIST)");
        assert_eq!(e.errno(), Some(Errno::EEXIST));
        let e = Error::failed("running", "nft", "syntax error").context("removing rules");
        assert_eq!(e.to_string(), "removing rules: running nft: syntax error");
        assert_eq!(e.kind(), Kind::Failed);
        let io = std::io::Error::from_raw_os_error(libc_enoent());
        assert_eq!(Error::io("reading", "/x", &io).errno(), Some(Errno::ENOENT));
    }

    fn libc_enoent() -> i32 {
        Errno::ENOENT as i32
    }
}
