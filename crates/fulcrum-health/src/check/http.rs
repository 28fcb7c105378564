//! http / https: one HTTP/1.1 request per run; the status, and optionally the body, decide.

use std::net::SocketAddr;

use fulcrum_config::Monitor;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{connect, read_more, tls, Probe, Verdict};
use crate::text::{self, contains_from, excerpt, resume_at, EXCERPT};

/// Head and body read at most: a health page is small, and a member must not make the checker
/// buffer without bound.
const LIMIT: usize = 64 * 1024;
/// Response headers parsed at most.
const MAX_HEADERS: usize = 64;

#[derive(Debug)]
pub(crate) struct HttpCheck {
    tls: bool,
    method: String,
    path: String,
    host: Option<String>,
    expect_status: Vec<u16>,
    expect_body: Option<Vec<u8>>,
    /// Why the configured request cannot be sent as it is; every run fails with it.
    invalid: Option<String>,
}

impl HttpCheck {
    pub fn new(monitor: &Monitor, tls: bool) -> Self {
        let invalid = if monitor.method.is_empty() || !monitor.method.bytes().all(is_tchar) {
            Some(format!("invalid method {:?}", monitor.method))
        } else if monitor.path.is_empty() || !monitor.path.bytes().all(is_visible) {
            Some(format!("invalid path {:?}", monitor.path))
        } else {
            match &monitor.host {
                Some(h) if h.is_empty() || !h.bytes().all(is_visible) => {
                    Some(format!("invalid host {h:?}"))
                }
                _ => None,
            }
        };
        HttpCheck {
            tls,
            method: monitor.method.clone(),
            path: monitor.path.clone(),
            host: monitor.host.clone(),
            expect_status: monitor.expect_status.clone(),
            expect_body: monitor.expect_body.clone().map(String::into_bytes),
            invalid,
        }
    }

    fn request(&self, member: SocketAddr) -> Vec<u8> {
        let host = match &self.host {
            Some(h) => h.clone(),
            None => member.to_string(),
        };
        format!(
            "{} {} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nUser-Agent: fulcrum-health\r\n\r\n",
            self.method, self.path
        )
        .into_bytes()
    }

    fn status_ok(&self, code: u16) -> bool {
        if self.expect_status.is_empty() {
            (200..400).contains(&code)
        } else {
            self.expect_status.contains(&code)
        }
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        if let Some(why) = &self.invalid {
            return Verdict::fail(why.clone());
        }
        let stream = match connect(probe).await {
            Ok(s) => s,
            Err(detail) => return Verdict::fail(detail),
        };
        let request = self.request(probe.member);
        if !self.tls {
            return self.exchange(stream, &request, probe).await;
        }
        let connector = match tls::connector() {
            Ok(c) => c,
            Err(why) => return Verdict::fail(why),
        };
        let name = tls::server_name(self.host.as_deref(), probe.addr.ip());
        match tokio::time::timeout_at(probe.deadline, connector.connect(name, stream)).await {
            Ok(Ok(tls)) => self.exchange(tls, &request, probe).await,
            Ok(Err(e)) => Verdict::fail(format!("TLS handshake: {}", text::io_error(&e))),
            Err(_) => Verdict::fail(format!("TLS handshake: {}", probe.timed_out())),
        }
    }

    async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut stream: S,
        request: &[u8],
        probe: &Probe,
    ) -> Verdict {
        let send = async {
            stream.write_all(request).await?;
            stream.flush().await
        };
        match tokio::time::timeout_at(probe.deadline, send).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Verdict::fail(format!("send: {}", text::io_error(&e))),
            Err(_) => return Verdict::fail(format!("send: {}", probe.timed_out())),
        }

        let mut buf = Vec::with_capacity(4096);
        // Where the final response's head starts, after any interim (1xx) responses.
        let mut start = 0;
        let (code, framing, body_start) = loop {
            match parse_head(&buf[start..], self.method.eq_ignore_ascii_case("HEAD")) {
                Head::Complete { code, len, .. } if (100..200).contains(&code) && code != 101 => {
                    start += len;
                    continue;
                }
                Head::Complete { code, len, framing } => break (code, framing, start + len),
                Head::Invalid(why) => return Verdict::fail(format!("bad response: {why}")),
                Head::Partial => {}
            }
            if buf.len() >= LIMIT {
                return Verdict::fail(format!("response head larger than {} KiB", LIMIT / 1024));
            }
            match tokio::time::timeout_at(probe.deadline, read_more(&mut stream, &mut buf, LIMIT))
                .await
            {
                Ok(Ok(0)) if buf.is_empty() => {
                    return Verdict::fail("connection closed without a response")
                }
                Ok(Ok(0)) => {
                    return Verdict::fail(format!(
                        "connection closed mid-response: \"{}\"",
                        excerpt(&buf[start..], EXCERPT)
                    ))
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Verdict::fail(text::io_error(&e)),
                Err(_) => {
                    return Verdict::fail(format!("{} waiting for the response", probe.timed_out()))
                }
            }
        };

        if !self.status_ok(code) {
            return Verdict::fail(format!("HTTP {code}"));
        }
        let Some(needle) = &self.expect_body else {
            return Verdict::pass(format!("HTTP {code}"));
        };
        let wanted = excerpt(needle, EXCERPT);
        let mut chunked = Chunked::default();
        let mut decoded = Vec::new();
        let mut searched = 0;
        loop {
            let raw = &buf[body_start..];
            let (body, complete): (&[u8], bool) = match framing {
                Framing::Empty => (&[], true),
                Framing::Length(n) => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    (&raw[..raw.len().min(n)], raw.len() >= n)
                }
                Framing::Close => (raw, false),
                Framing::Chunked => match chunked.advance(raw, &mut decoded) {
                    Ok(done) => (&decoded, done),
                    Err(why) => return Verdict::fail(format!("HTTP {code}, {why}")),
                },
            };
            // Searching as the body arrives passes a check whose server keeps the connection
            // open despite `Connection: close`.
            if contains_from(body, needle, searched) {
                return Verdict::pass(format!("HTTP {code}"));
            }
            searched = resume_at(body.len(), needle);
            if complete {
                return Verdict::fail(format!("HTTP {code}, body lacks \"{wanted}\""));
            }
            if buf.len() >= LIMIT {
                return Verdict::fail(format!(
                    "HTTP {code}, \"{wanted}\" not in the first {} KiB",
                    LIMIT / 1024
                ));
            }
            match tokio::time::timeout_at(probe.deadline, read_more(&mut stream, &mut buf, LIMIT))
                .await
            {
                Ok(Ok(0)) if framing == Framing::Close => {
                    return Verdict::fail(format!("HTTP {code}, body lacks \"{wanted}\""))
                }
                Ok(Ok(0)) => {
                    return Verdict::fail(format!("HTTP {code}, connection closed mid-body"))
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    return Verdict::fail(format!(
                        "HTTP {code}, {} reading the body",
                        text::io_error(&e)
                    ))
                }
                Err(_) => {
                    return Verdict::fail(format!(
                        "HTTP {code}, {} reading the body",
                        probe.timed_out()
                    ))
                }
            }
        }
    }
}

/// RFC 9110 token characters, which a method consists of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Bytes that may stand in a request target or a Host value without breaking the request line
/// or header apart (no spaces, no control characters).
fn is_visible(b: u8) -> bool {
    b > b' ' && b != 0x7f
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// HEAD, 1xx, 204, 304: no body whatever the headers say.
    Empty,
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    Close,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Head {
    Partial,
    Invalid(String),
    Complete {
        code: u16,
        /// Bytes of the head, blank line included.
        len: usize,
        framing: Framing,
    },
}

/// Parses a response head at the start of `bytes`.
pub(crate) fn parse_head(bytes: &[u8], head_request: bool) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(e) => return Head::Invalid(e.to_string()),
    };
    let code = response.code.unwrap_or(0);
    if head_request || code < 200 || code == 204 || code == 304 {
        return Head::Complete {
            code,
            len,
            framing: Framing::Empty,
        };
    }
    let mut transfer_encoding = None;
    let mut length: Option<u64> = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            // A list of equal values is allowed (RFC 9110 §8.6); anything else is a framing
            // error, which a proxy must not guess around.
            let values = std::str::from_utf8(h.value).unwrap_or("x").split(',');
            for v in values {
                match v.trim().parse::<u64>() {
                    Ok(n) if length.is_none() || length == Some(n) => length = Some(n),
                    _ => return Head::Invalid("bad Content-Length".into()),
                }
            }
        }
    }
    let framing = match (transfer_encoding, length) {
        // Transfer-Encoding overrides Content-Length; without chunked last, the body runs to
        // the close (RFC 9112 §6.3).
        (Some(te), _) => {
            let last = te.rsplit(|&b| b == b',').next().unwrap_or_default();
            if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                Framing::Chunked
            } else {
                Framing::Close
            }
        }
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::Close,
    };
    Head::Complete { code, len, framing }
}

/// An incremental chunked-body decoder over a growing buffer of the raw body.
#[derive(Debug, Default)]
pub(crate) struct Chunked {
    /// How far into the raw body the decoder has got.
    pos: usize,
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The last (zero-size) chunk was seen; trailers are of no interest.
    Done,
}

impl Chunked {
    /// Decodes what `raw` (the whole raw body so far, a prefix of what it will be) holds beyond
    /// the previous call into `out`; true when the last chunk has been seen.
    pub fn advance(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<bool, &'static str> {
        loop {
            let rest = raw.get(self.pos..).unwrap_or_default();
            match self.state {
                ChunkState::Done => return Ok(true),
                ChunkState::Size => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((n, 0))) => {
                        self.pos += n;
                        self.state = ChunkState::Done;
                    }
                    Ok(httparse::Status::Complete((n, size))) => {
                        self.pos += n;
                        self.state = ChunkState::Data(size);
                    }
                    Ok(httparse::Status::Partial) => return Ok(false),
                    Err(_) => return Err("bad chunk size"),
                },
                ChunkState::Data(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    out.extend_from_slice(&rest[..take]);
                    self.pos += take;
                    let left = left - take as u64;
                    if left > 0 {
                        self.state = ChunkState::Data(left);
                        return Ok(false);
                    }
                    self.state = ChunkState::DataEnd;
                }
                ChunkState::DataEnd => {
                    if rest.len() < 2 {
                        return Ok(false);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err("bad chunk delimiter");
                    }
                    self.pos += 2;
                    self.state = ChunkState::Size;
                }
            }
        }
    }
}

/// For the fuzz target `health_replies`: a member's reply to an HTTP check, parsed as `run`
/// parses it, its body decoded by its framing twice (the raw body whole, and growing in two
/// pieces cut at `split`); both decodings must agree. Returns the status code when the head
/// is complete.
#[doc(hidden)]
pub fn fuzz_reply(reply: &[u8], head_request: bool, split: usize) -> Option<u16> {
    let Head::Complete { code, len, framing } = parse_head(reply, head_request) else {
        return None;
    };
    let body = &reply[len..];
    if matches!(framing, Framing::Chunked) {
        let mut whole = Vec::new();
        let a = Chunked::default().advance(body, &mut whole);
        let mut pieces = Vec::new();
        let mut c = Chunked::default();
        let cut = split.min(body.len());
        let first = c.advance(&body[..cut], &mut pieces);
        let b = match first {
            Ok(true) => Ok(true),
            Ok(false) => c.advance(body, &mut pieces),
            Err(e) => Err(e),
        };
        assert_eq!(a.is_ok(), b.is_ok(), "split at {cut}: {a:?} vs {b:?}");
        if let (Ok(x), Ok(y)) = (a, b) {
            assert_eq!(x, y, "split at {cut}");
            assert_eq!(whole, pieces, "split at {cut}");
        }
    }
    Some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(bytes: &[u8]) -> (u16, usize, Framing) {
        match parse_head(bytes, false) {
            Head::Complete { code, len, framing } => (code, len, framing),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn framing_follows_the_headers() {
        let (code, len, f) = complete(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!((code, len, f), (200, 38, Framing::Length(5)));
        let (_, _, f) = complete(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(f, Framing::Length(5));
        let (_, _, f) = complete(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\nContent-Length: 3\r\n\r\n",
        );
        assert_eq!(f, Framing::Chunked);
        let (_, _, f) = complete(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
        assert_eq!(f, Framing::Close);
        let (_, _, f) = complete(b"HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(f, Framing::Close);
        let (_, _, f) = complete(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(f, Framing::Empty);
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true),
            Head::Complete {
                framing: Framing::Empty,
                ..
            }
        ));
    }

    #[test]
    fn bad_heads_are_reported() {
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nCont", false), Head::Partial);
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", false),
            Head::Invalid(_)
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false),
            Head::Invalid(_)
        ));
        assert!(matches!(
            parse_head(b"SSH-2.0-OpenSSH\r\n\r\n", false),
            Head::Invalid(_)
        ));
        let many: Vec<u8> = [
            &b"HTTP/1.1 200 OK\r\n"[..],
            &b"X: y\r\n".repeat(MAX_HEADERS + 1),
            b"\r\n",
        ]
        .concat();
        assert!(matches!(parse_head(&many, false), Head::Invalid(_)));
    }

    #[test]
    fn chunked_decodes_across_arbitrary_splits() {
        let raw = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n";
        for split in 0..raw.len() {
            let mut dec = Chunked::default();
            let mut out = Vec::new();
            // The last chunk's size line ends at byte 30; from there on the body is complete.
            let done = split >= 30;
            assert_eq!(
                dec.advance(&raw[..split], &mut out),
                Ok(done),
                "split {split}"
            );
            assert_eq!(dec.advance(raw, &mut out), Ok(true), "split {split}");
            assert_eq!(out, b"hello world");
        }
    }

    #[test]
    fn chunked_rejects_garbage() {
        let mut out = Vec::new();
        assert!(Chunked::default().advance(b"zz\r\n", &mut out).is_err());
        assert!(Chunked::default().advance(b"2\r\nabXX", &mut out).is_err());
        // A huge declared size only means waiting for more bytes, never a large allocation.
        let mut dec = Chunked::default();
        assert_eq!(dec.advance(b"ffffffffffffffff\r\nab", &mut out), Ok(false));
    }

    #[test]
    fn requests_name_the_member_unless_a_host_is_set() {
        let mut m = crate::testutil::monitor("m", fulcrum_config::MonitorKind::Http);
        m.path = "/health".into();
        let addr: SocketAddr = "[::1]:8080".parse().unwrap();
        let req = HttpCheck::new(&m, false).request(addr);
        assert_eq!(
            req,
            b"GET /health HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\nUser-Agent: fulcrum-health\r\n\r\n"
        );
        m.host = Some("api.example.com".into());
        m.method = "HEAD".into();
        let req = String::from_utf8(HttpCheck::new(&m, false).request(addr)).unwrap();
        assert!(req.starts_with("HEAD /health HTTP/1.1\r\nHost: api.example.com\r\n"));
        m.path = "/a b".into();
        assert!(HttpCheck::new(&m, false).invalid.is_some());
        m.path = "/".into();
        m.method = "GET\r\nX: y".into();
        assert!(HttpCheck::new(&m, false).invalid.is_some());
    }
}
