//! `/healthz` (200 while the enforcer runs) and `/metrics`, over a minimal HTTP/1.1 server.

use crate::metrics::METRICS;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The status and body of one request line.
pub fn answer(request: &str) -> (u16, String) {
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return (405, "method not allowed\n".into());
    }
    match path.split('?').next().unwrap_or("") {
        "/healthz" => (200, "ok\n".into()),
        "/metrics" => (200, METRICS.render()),
        _ => (404, "not found\n".into()),
    }
}

async fn serve_one(mut s: TcpStream) {
    let mut buf = vec![0u8; 2048];
    let mut len = 0;
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while len < buf.len() && !buf[..len].contains(&b'\n') {
            match s.read(&mut buf[len..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => len += n,
            }
        }
    })
    .await;
    if read.is_err() || len == 0 {
        return;
    }
    let text = String::from_utf8_lossy(&buf[..len]);
    let line = text.lines().next().unwrap_or("");
    let (code, body) = answer(line);
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !line.starts_with("HEAD ") {
        out.extend_from_slice(body.as_bytes());
    }
    let _ = s.write_all(&out).await;
    let _ = s.shutdown().await;
}

/// Binds now, so that a port in use is said at start, and serves in the background.
pub async fn start(addr: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        loop {
            if let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve_one(s));
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_metrics_and_nothing_else() {
        assert_eq!(answer("GET /healthz HTTP/1.1").0, 200);
        let (code, body) = answer("GET /metrics HTTP/1.1");
        assert_eq!(code, 200);
        assert!(body.contains("flannel_netpol_policies "));
        assert_eq!(answer("GET /nope HTTP/1.1").0, 404);
        assert_eq!(answer("POST /metrics HTTP/1.1").0, 405);
    }
}
