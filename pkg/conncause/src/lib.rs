//! Why a connection to a server failed, in the words an operator fixes it by: the
//! certificate not signed by the CA the configuration gives, a name the certificate does not
//! hold, nothing listening at an address, rather than a library's `client error (Connect)`.
//! Shared by the clients of etcd and of the Kubernetes API.

use std::error::Error;

/// The far side of a connection as the operator configured it, for the words of a cause.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// "the API server", "etcd".
    pub what: &'static str,
    /// Where the address comes from: "--etcd-endpoints", "the kubeconfig /x's server".
    pub address_from: String,
    /// The CA the server's certificate must be signed by, and where it was given.
    pub ca: String,
    /// The client certificate offered, and where it was given; None when none is.
    pub client_cert: Option<String>,
    /// What to check when the server closes the connection (a client certificate it wants).
    pub closed_hint: Option<String>,
}

impl Peer {
    /// The cause of a connection the server closed, the same however it showed.
    pub fn closed(&self, addr: &str) -> String {
        match &self.closed_hint {
            Some(h) => format!("{} at {addr} closed the connection; {h}", self.what),
            None => format!("{} at {addr} closed the connection", self.what),
        }
    }
}

/// The errors of `err`'s chain, the error itself first, with the `io::Error`s' inner errors
/// (an `io::Error`'s `source` skips the error it wraps).
fn chain<'a>(err: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        out.push(e);
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => e.source(),
        };
    }
    out
}

/// The address a TCP connect failed at, as hyper's connector knows it (only in its Debug).
fn connect_address(e: &dyn Error) -> Option<String> {
    let dbg = format!("{e:?}");
    let rest = dbg.strip_prefix("ConnectError(\"tcp connect error\", ")?;
    let addr = rest.split([',', ')']).next()?.trim();
    addr.parse::<std::net::SocketAddr>().ok()?;
    Some(addr.to_string())
}

/// A certificate's names as rustls lists them (`IpAddress(10.0.0.1)`, `DnsName("x")`), bare.
fn bare_name(n: &str) -> String {
    let inner = n
        .split_once('(')
        .map(|(_, r)| r.trim_end_matches(')'))
        .unwrap_or(n);
    inner.trim_matches('"').to_string()
}

fn server_name(n: &rustls::pki_types::ServerName<'_>) -> String {
    match n {
        rustls::pki_types::ServerName::DnsName(d) => d.as_ref().to_string(),
        rustls::pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

fn tls_cause(e: &rustls::Error, peer: &Peer, addr: &str) -> String {
    use rustls::CertificateError as C;
    let what = peer.what;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "{what} at {addr} presents a certificate that is not signed by {}",
            peer.ca
        ),
        rustls::Error::InvalidCertificate(C::NotValidForNameContext {
            expected,
            presented,
        }) => {
            let names: Vec<String> = presented.iter().map(|n| bare_name(n)).collect();
            format!(
                "{what}'s certificate at {addr} is not valid for the name {} it is reached by \
                 ({}); it is valid for {}",
                server_name(expected),
                peer.address_from,
                names.join(", ")
            )
        }
        rustls::Error::InvalidCertificate(C::NotValidForName) => format!(
            "{what}'s certificate at {addr} is not valid for the name it is reached by ({})",
            peer.address_from
        ),
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            format!("{what} at {addr} presents an expired certificate")
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            format!("{what} at {addr} presents a certificate that is not valid yet (is this machine's clock right?)")
        }
        rustls::Error::InvalidCertificate(other) => format!(
            "{what} at {addr} presents a certificate that does not verify against {}: {other:?}",
            peer.ca
        ),
        rustls::Error::AlertReceived(alert) => format!(
            "{what} at {addr} ended the TLS handshake ({alert:?}): it does not accept {}",
            peer.client_cert
                .as_deref()
                .unwrap_or("a client without a certificate")
        ),
        rustls::Error::InvalidMessage(_) => format!(
            "{what} at {addr} does not answer in TLS, though {} says https",
            peer.address_from
        ),
        other => format!("the TLS connection to {what} at {addr}: {other}"),
    }
}

/// What an operator must fix when a connection to `peer` at `addr` (host:port as configured)
/// fails with `err`; None when the chain holds no known connection failure.
pub fn connection_cause(err: &(dyn Error + 'static), peer: &Peer, addr: &str) -> Option<String> {
    let errors = chain(err);
    let addr = errors
        .iter()
        .find_map(|e| connect_address(*e))
        .unwrap_or_else(|| addr.to_string());
    let what = peer.what;
    for e in &errors {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return Some(tls_cause(t, peer, &addr));
        }
    }
    for e in &errors {
        if e.to_string() == "dns error" {
            let why = e.source().map(|s| s.to_string()).unwrap_or_default();
            return Some(format!(
                "the name in {addr} ({}) does not resolve: {why}",
                peer.address_from
            ));
        }
    }
    for e in &errors {
        let Some(io) = e.downcast_ref::<std::io::Error>() else {
            continue;
        };
        use std::io::ErrorKind as K;
        let cause = match io.kind() {
            K::ConnectionRefused => format!(
                "connection refused at {addr} ({}): nothing listens there; is {what} running \
                 and is the port right?",
                peer.address_from
            ),
            K::TimedOut => format!(
                "no connection to {addr} ({}) within the connect timeout: a host that is \
                 down, or a firewall that drops the packets",
                peer.address_from
            ),
            K::NetworkUnreachable | K::HostUnreachable => format!(
                "no route to {addr} ({}) from this node: {io}",
                peer.address_from
            ),
            K::ConnectionReset | K::BrokenPipe | K::UnexpectedEof | K::ConnectionAborted => {
                peer.closed(&addr)
            }
            _ => continue,
        };
        return Some(cause);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Peer {
        Peer {
            what: "etcd",
            address_from: "--etcd-endpoints".into(),
            ca: "the CA in --etcd-cafile /ca.crt".into(),
            client_cert: None,
            closed_hint: None,
        }
    }

    #[test]
    fn a_cause_is_found_below_the_wrappers() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let wrapped = std::io::Error::other(refused);
        let cause = connection_cause(&wrapped, &peer(), "127.0.0.1:2379").unwrap();
        assert!(
            cause.starts_with("connection refused at 127.0.0.1:2379 (--etcd-endpoints)"),
            "{cause}"
        );
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let cause = connection_cause(&tls, &peer(), "127.0.0.1:2379").unwrap();
        assert_eq!(
            cause,
            "etcd at 127.0.0.1:2379 presents a certificate that is not signed by the CA in \
             --etcd-cafile /ca.crt"
        );
        let other = std::io::Error::other("something else");
        assert_eq!(connection_cause(&other, &peer(), "x:1"), None);
    }
}
