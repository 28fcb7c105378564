//! The wire side of alert delivery: an HTTP POST of JSON, an RFC 5424 datagram, an SMTP
//! transaction. Each returns an error to retry on; none retries itself.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How an https webhook's certificate is checked.
#[derive(Debug, Clone, Copy)]
pub struct WebhookTls<'a> {
    /// false: any certificate (the handshake signature is still checked).
    pub verify: bool,
    /// A PEM bundle to trust instead of the Mozilla roots.
    pub ca: Option<&'a std::path::Path>,
}

/// The host of an authority ("[::1]:8443" → "::1", "alerts.example.org" → itself), the name
/// an https receiver's certificate must carry.
fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// An HTTP/1.1 client connection over `stream` (TCP, TLS, a Unix socket); its connection task
/// runs beside.
pub async fn http1_client<S>(
    stream: S,
) -> hyper::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// POSTs `body` as JSON to an `http://` or `https://host:port/path` URL; a 2xx answer is
/// success. https goes through fulcrum-tls's client (the one pools re-encrypt with): the
/// receiver's certificate must name the URL's host and chain to `tls.ca` or the Mozilla roots.
pub async fn http_post(
    url: &str,
    body: &serde_json::Value,
    tls: &WebhookTls<'_>,
) -> Result<(), String> {
    let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(r), _) => (r, false),
        (_, Some(r)) => (r, true),
        _ => return Err(format!("{url}: not an http:// or https:// URL")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let default_port = if https { 443 } else { 80 };
    let addr = tokio::net::lookup_host(if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    })
    .await
    .map_err(|e| format!("{authority}: {e}"))?
    .next()
    .ok_or_else(|| format!("{authority}: no address"))?;
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut sender = if https {
        let client = fulcrum_tls::client::MemberTls::load_with_alpn(
            &fulcrum_config::UpstreamTls {
                verify: tls.verify,
                ca: tls.ca.map(Into::into),
                sni: Some(host_of(authority).to_string()),
            },
            vec![b"http/1.1".to_vec()],
            "alert.webhook",
        )
        .map_err(|(key, e)| format!("{key}: {e}"))?;
        let stream = client
            .connect(stream, addr)
            .await
            .map_err(|e| format!("TLS with {authority}: {e}"))?;
        http1_client(stream)
            .await
            .map_err(|e| format!("{addr}: {e}"))?
    } else {
        http1_client(stream)
            .await
            .map_err(|e| format!("{addr}: {e}"))?
    };
    let req = http::Request::post(path)
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("fulcrum/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    // A receiver's answer is a few words; one that goes on and on is not a receiver that
    // took the alert, and must not grow this process's memory.
    let text = http_body_util::Limited::new(resp.into_body(), MAX_HTTP_REPLY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                format!("{url}: HTTP {status}: the reply's body is over {MAX_HTTP_REPLY} bytes")
            } else {
                format!("{url}: HTTP {status}: reading the reply: {e}")
            }
        })?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "{url}: HTTP {status}: {}",
            crate::escape::log_escape(String::from_utf8_lossy(&text[..text.len().min(200)]).trim())
        ))
    }
}

/// One syslog message in one UDP datagram (RFC 5426).
pub async fn syslog(to: SocketAddr, message: &str) -> Result<(), String> {
    let bind: SocketAddr = if to.is_ipv6() {
        "[::]:0".parse().map_err(|_| "bind address")?
    } else {
        "0.0.0.0:0".parse().map_err(|_| "bind address")?
    };
    let sock = tokio::net::UdpSocket::bind(bind)
        .await
        .map_err(|e| e.to_string())?;
    sock.send_to(message.as_bytes(), to)
        .await
        .map(|_| ())
        .map_err(|e| format!("send to {to}: {e}"))
}

/// The most of a webhook's reply body read (its headers are bounded by hyper).
const MAX_HTTP_REPLY: usize = 64 * 1024;
/// The longest SMTP reply line taken (RFC 5321 §4.5.3.1.5 allows 512 bytes).
const MAX_SMTP_LINE: u64 = 4096;
/// The most lines of one multi-line SMTP reply (an EHLO answer has a dozen).
const MAX_SMTP_REPLY_LINES: usize = 100;

/// Reads one (possibly multi-line) SMTP reply; its code must be one of `want`. Lines and
/// their number are bounded: a server that never ends a line or a reply fails the delivery.
async fn reply(r: &mut BufReader<TcpStream>, want: &[u16]) -> Result<(), String> {
    for _ in 0..MAX_SMTP_REPLY_LINES {
        let mut raw = Vec::new();
        let n = (&mut *r)
            .take(MAX_SMTP_LINE)
            .read_until(b'\n', &mut raw)
            .await
            .map_err(|e| format!("smtp: {e}"))?;
        if n == 0 {
            return Err("smtp: the server closed the connection".into());
        }
        if raw.last() != Some(&b'\n') {
            return Err(if n as u64 >= MAX_SMTP_LINE {
                format!("smtp: a reply line over {MAX_SMTP_LINE} bytes")
            } else {
                "smtp: the server closed the connection".into()
            });
        }
        let line = String::from_utf8_lossy(&raw);
        let code: u16 = line.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
        if line.as_bytes().get(3) == Some(&b'-') {
            continue;
        }
        return if want.contains(&code) {
            Ok(())
        } else {
            Err(format!(
                "smtp: {}",
                crate::escape::log_escape(line.trim_end())
            ))
        };
    }
    Err(format!(
        "smtp: a reply of more than {MAX_SMTP_REPLY_LINES} lines"
    ))
}

async fn command(r: &mut BufReader<TcpStream>, line: &str, want: &[u16]) -> Result<(), String> {
    r.get_mut()
        .write_all(format!("{line}\r\n").as_bytes())
        .await
        .map_err(|e| format!("smtp: {e}"))?;
    reply(r, want)
        .await
        .map_err(|e| format!("{e} (after {})", line.split(':').next().unwrap_or(line)))
}

/// RFC 5322 date, e.g. "Tue, 01 Dec 2026 15:30:00 +0000".
fn mail_date(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = secs / 86400;
    let rfc = humantime::format_rfc3339_seconds(t).to_string(); // 2026-12-01T15:30:00Z
    let (y, mo, d) = (&rfc[0..4], &rfc[5..7], &rfc[8..10]);
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .get(mo.parse::<usize>().unwrap_or(1).saturating_sub(1))
    .copied()
    .unwrap_or("Jan");
    // 1970-01-01 was a Thursday.
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    format!("{wd}, {d} {month} {y} {} +0000", &rfc[11..19])
}

/// One plain SMTP transaction to a relay. Writing the few commands of RFC 5321 here keeps a
/// mail stack (TLS, auth, MIME builders) out of the binary: the local MTA does the rest.
pub async fn smtp(
    s: &fulcrum_config::Smtp,
    host: &str,
    subject: &str,
    body: &str,
) -> Result<(), String> {
    let stream = TcpStream::connect(s.server)
        .await
        .map_err(|e| format!("smtp: connect {}: {e}", s.server))?;
    let mut r = BufReader::new(stream);
    reply(&mut r, &[220]).await?;
    command(&mut r, &format!("EHLO {host}"), &[250]).await?;
    command(&mut r, &format!("MAIL FROM:<{}>", s.from), &[250]).await?;
    for to in &s.to {
        command(&mut r, &format!("RCPT TO:<{to}>"), &[250, 251]).await?;
    }
    command(&mut r, "DATA", &[354]).await?;
    let now = std::time::SystemTime::now();
    let id = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let subject: String = subject
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let mut msg = format!(
        "From: {}\r\nTo: {}\r\nSubject: {subject}\r\nDate: {}\r\nMessage-ID: <{id}.fulcrum@{host}>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n",
        s.from,
        s.to.join(", "),
        mail_date(now),
    );
    for line in body.lines() {
        // Dot-stuffing (RFC 5321 §4.5.2).
        if line.starts_with('.') {
            msg.push('.');
        }
        msg.push_str(line);
        msg.push_str("\r\n");
    }
    msg.push_str(".\r\n");
    r.get_mut()
        .write_all(msg.as_bytes())
        .await
        .map_err(|e| format!("smtp: {e}"))?;
    reply(&mut r, &[250]).await?;
    let _ = command(&mut r, "QUIT", &[221]).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn mail_date_has_the_weekday() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_139_000);
        // 2026-12-01 was a Tuesday.
        assert_eq!(super::mail_date(t), "Tue, 01 Dec 2026 15:30:00 +0000");
    }
}
