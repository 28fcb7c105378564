//! RTSP/1.0 framing (RFC 2326): the messages of a control connection — requests and responses
//! in both directions (a server may send requests too) — and the interleaved binary frames
//! (`$`, channel, 2-byte length, payload: §10.12) between them. Only what the proxy needs is
//! read: the start line, the header fields, `Content-Length` for the body, and the URL's
//! authority and path for the rules. Everything else passes as received.

use std::ops::Range;

/// Longest message head (start line and header fields) accepted.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in one message.
pub const MAX_FIELDS: usize = 64;
/// Longest body accepted (SDP descriptions and parameters are a few KiB).
pub const MAX_BODY: usize = 64 * 1024;
/// Longest frame of either kind: what a direction buffers at most.
pub const MAX_FRAME: usize = MAX_HEAD + MAX_BODY;

/// What starts a buffer: a whole message, or a whole interleaved frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// `$`, a channel, a 2-byte length and that many bytes: `len` is the whole frame's.
    Interleaved {
        channel: u8,
        len: usize,
    },
    Message(Message),
}

impl Frame {
    /// The frame's length in the buffer.
    pub fn len(&self) -> usize {
        match self {
            Frame::Interleaved { len, .. } => *len,
            Frame::Message(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartLine {
    /// `METHOD URL RTSP/1.0`
    Request {
        method: Range<usize>,
        url: Range<usize>,
    },
    /// `RTSP/1.0 200 OK`
    Response { status: u16 },
}

/// A parsed message: positions into the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub start: StartLine,
    /// (name, value) of each header field, the value without surrounding white space.
    pub fields: Vec<(Range<usize>, Range<usize>)>,
    /// Bytes of the start line and fields, with the empty line ending them.
    pub head_len: usize,
    /// `Content-Length` (0 without one).
    pub body_len: usize,
}

/// Why bytes are not an RTSP message.
pub type Malformed = &'static str;

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The line starting at `at` without its end (CRLF or LF), and where the next one starts;
/// `None` when no line end is buffered yet.
fn line(buf: &[u8], at: usize) -> Option<(Range<usize>, usize)> {
    let rest = buf.get(at..)?;
    let n = memchr::memchr(b'\n', rest)?;
    let end = if n > 0 && rest[n - 1] == b'\r' {
        at + n - 1
    } else {
        at + n
    };
    Some((at..end, at + n + 1))
}

fn trim(buf: &[u8], mut r: Range<usize>) -> Range<usize> {
    while r.start < r.end && matches!(buf[r.start], b' ' | b'\t') {
        r.start += 1;
    }
    while r.end > r.start && matches!(buf[r.end - 1], b' ' | b'\t') {
        r.end -= 1;
    }
    r
}

fn is_version(v: &[u8]) -> bool {
    v.len() == 8 && v.starts_with(b"RTSP/1.") && v[7].is_ascii_digit()
}

fn start_line(buf: &[u8], r: Range<usize>) -> Result<StartLine, Malformed> {
    let text = &buf[r.clone()];
    let mut parts = text.split(|b| *b == b' ');
    let first = parts.next().unwrap_or_default();
    if is_version(first) {
        let code = parts.next().unwrap_or_default();
        if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
            return Err("invalid status code");
        }
        let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
        if !(100..=999).contains(&status) {
            return Err("invalid status code");
        }
        return Ok(StartLine::Response { status });
    }
    let (Some(url), Some(version), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err("invalid request line");
    };
    if first.is_empty() || !first.iter().all(|b| is_token(*b)) {
        return Err("invalid method");
    }
    if url.is_empty() || url.iter().any(|b| *b <= b' ' || *b == 0x7f) {
        return Err("invalid request URL");
    }
    if !is_version(version) {
        return Err("not RTSP/1.x");
    }
    let method = r.start..r.start + first.len();
    let url_start = method.end + 1;
    Ok(StartLine::Request {
        method,
        url: url_start..url_start + url.len(),
    })
}

fn content_length(v: &[u8]) -> Result<usize, Malformed> {
    if v.is_empty() || v.len() > 9 || !v.iter().all(u8::is_ascii_digit) {
        return Err("invalid Content-Length");
    }
    let n = v.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
    if n > MAX_BODY {
        return Err("body too large");
    }
    Ok(n)
}

/// Reads the frame at the start of `buf`: `Ok(None)` asks for more bytes; an error means the
/// bytes cannot be framed (the connection cannot go on).
pub fn parse(buf: &[u8]) -> Result<Option<Frame>, Malformed> {
    if buf.first() == Some(&b'$') {
        let Some(header) = buf.get(..4) else {
            return Ok(None);
        };
        let len = 4 + usize::from(u16::from_be_bytes([header[2], header[3]]));
        return Ok((buf.len() >= len).then_some(Frame::Interleaved {
            channel: header[1],
            len,
        }));
    }
    let Some((first, mut at)) = line(buf, 0) else {
        return if buf.len() > MAX_HEAD {
            Err("start line too long")
        } else {
            Ok(None)
        };
    };
    let start = start_line(buf, first)?;
    let mut fields = Vec::new();
    let mut body_len = None;
    loop {
        let Some((field, next)) = line(buf, at) else {
            return if buf.len() > MAX_HEAD {
                Err("head too large")
            } else {
                Ok(None)
            };
        };
        if next > MAX_HEAD {
            return Err("head too large");
        }
        at = next;
        if field.is_empty() {
            break;
        }
        if matches!(buf[field.start], b' ' | b'\t') {
            return Err("folded header line");
        }
        let Some(colon) = memchr::memchr(b':', &buf[field.clone()]) else {
            return Err("header line without a colon");
        };
        let name = field.start..field.start + colon;
        if name.is_empty() || !buf[name.clone()].iter().all(|b| is_token(*b)) {
            return Err("invalid header name");
        }
        let value = trim(buf, name.end + 1..field.end);
        if buf[value.clone()]
            .iter()
            .any(|b| (*b < b' ' && *b != b'\t') || *b == 0x7f)
        {
            return Err("invalid header value");
        }
        if buf[name.clone()].eq_ignore_ascii_case(b"content-length") {
            let n = content_length(&buf[value.clone()])?;
            if body_len.is_some_and(|m| m != n) {
                return Err("conflicting Content-Length");
            }
            body_len = Some(n);
        }
        if fields.len() == MAX_FIELDS {
            return Err("too many header fields");
        }
        fields.push((name, value));
    }
    let message = Message {
        start,
        fields,
        head_len: at,
        body_len: body_len.unwrap_or(0),
    };
    Ok((buf.len() >= message.len()).then_some(Frame::Message(message)))
}

impl Message {
    /// The whole message's length: head and body.
    pub fn len(&self) -> usize {
        self.head_len + self.body_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first value of header `name` (any case).
    pub fn header<'a>(&self, buf: &'a [u8], name: &str) -> Option<&'a [u8]> {
        self.fields
            .iter()
            .find(|(n, _)| buf[n.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| &buf[v.clone()])
    }

    pub fn method<'a>(&self, buf: &'a [u8]) -> Option<&'a [u8]> {
        match &self.start {
            StartLine::Request { method, .. } => Some(&buf[method.clone()]),
            StartLine::Response { .. } => None,
        }
    }

    pub fn url<'a>(&self, buf: &'a [u8]) -> Option<&'a [u8]> {
        match &self.start {
            StartLine::Request { url, .. } => Some(&buf[url.clone()]),
            StartLine::Response { .. } => None,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self.start {
            StartLine::Response { status } => Some(status),
            StartLine::Request { .. } => None,
        }
    }

    pub fn cseq<'a>(&self, buf: &'a [u8]) -> Option<&'a [u8]> {
        self.header(buf, "cseq")
    }

    /// The session id of the `Session` header (without `;timeout=`).
    pub fn session<'a>(&self, buf: &'a [u8]) -> Option<&'a [u8]> {
        let v = self.header(buf, "session")?;
        let id = v.split(|b| *b == b';').next().unwrap_or_default();
        let id = id.trim_ascii();
        (!id.is_empty()).then_some(id)
    }

    /// The message with the value of header `name` (any case) replaced by `value` in each
    /// field of that name; the rest as it was.
    pub fn with_header(&self, buf: &[u8], name: &str, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() + value.len());
        let mut copied = 0;
        for (n, v) in &self.fields {
            if buf[n.clone()].eq_ignore_ascii_case(name.as_bytes()) {
                out.extend_from_slice(&buf[copied..v.start]);
                out.extend_from_slice(value);
                copied = v.end;
            }
        }
        out.extend_from_slice(&buf[copied..self.len()]);
        out
    }
}

/// An RTSP URL's authority (`host[:port]`) and its path with query (`/` when it has none):
/// `rtsp://cam.example:554/live/a?x=1` → (`cam.example:554`, `/live/a?x=1`). `None` for
/// `*` and for what is not an rtsp, rtspu or rtsps URL.
pub fn split_url(url: &[u8]) -> Option<(&[u8], &[u8])> {
    let scheme_end = memchr::memmem::find(url, b"://")?;
    let scheme = &url[..scheme_end];
    if !["rtsp", "rtsps", "rtspu"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s.as_bytes()))
    {
        return None;
    }
    let rest = &url[scheme_end + 3..];
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    // Userinfo is not an authority to route on.
    let authority = match memchr::memrchr(b'@', authority) {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    let path = &rest[end..];
    let path = match memchr::memchr(b'#', path) {
        Some(i) => &path[..i],
        None => path,
    };
    Some((authority, if path.is_empty() { b"/" } else { path }))
}

/// An answer Fulcrum gives a client itself: `RTSP/1.0 <status> <reason>`, with the request's
/// CSeq when it had one.
pub fn answer(status: u16, reason: &str, cseq: Option<&[u8]>) -> Vec<u8> {
    let mut out = format!("RTSP/1.0 {status} {reason}\r\n").into_bytes();
    if let Some(c) = cseq {
        out.extend_from_slice(b"CSeq: ");
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(buf: &[u8]) -> Message {
        match parse(buf) {
            Ok(Some(Frame::Message(m))) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_responses_and_interleaved_frames() {
        let req = b"SETUP rtsp://cam:8554/a/trackID=0 RTSP/1.0\r\nCSeq: 3\r\nTransport: RTP/AVP;unicast;client_port=5000-5001\r\nUser-Agent: Lavf\r\n\r\nrest";
        let m = message(req);
        assert_eq!(m.method(req), Some(&b"SETUP"[..]));
        assert_eq!(m.url(req), Some(&b"rtsp://cam:8554/a/trackID=0"[..]));
        assert_eq!(m.cseq(req), Some(&b"3"[..]));
        assert_eq!(m.len(), req.len() - 4);
        assert_eq!(
            m.header(req, "TRANSPORT"),
            Some(&b"RTP/AVP;unicast;client_port=5000-5001"[..])
        );
        let rewritten = m.with_header(req, "transport", b"RTP/AVP;unicast;client_port=7000-7001");
        let again = message(&rewritten);
        assert_eq!(
            again.header(&rewritten, "transport"),
            Some(&b"RTP/AVP;unicast;client_port=7000-7001"[..])
        );
        assert_eq!(again.len(), rewritten.len());

        let resp =
            b"RTSP/1.0 200 OK\nCSeq: 3\nSession: 1234ABCD;timeout=60\nContent-Length: 4\n\nv=0\n";
        let m = message(resp);
        assert_eq!(m.status(), Some(200));
        assert_eq!(m.session(resp), Some(&b"1234ABCD"[..]));
        assert_eq!(m.len(), resp.len());
        // The body is waited for.
        assert_eq!(parse(&resp[..resp.len() - 1]), Ok(None));

        assert_eq!(
            parse(b"$\x01\x00\x02ab$"),
            Ok(Some(Frame::Interleaved { channel: 1, len: 6 }))
        );
        assert_eq!(parse(b"$\x01\x00\x02a"), Ok(None));
        assert_eq!(parse(b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n"), Ok(None));
    }

    #[test]
    fn malformed_messages() {
        for bad in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"SETUP rtsp://a/ RTSP/1.0 extra\r\n\r\n",
            b"RTSP/1.0 2000 OK\r\n\r\n",
            b"DESCRIBE rtsp://a/ RTSP/1.0\r\nContent-Length: 99999999\r\n\r\n",
            b"DESCRIBE rtsp://a/ RTSP/1.0\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"DESCRIBE rtsp://a/ RTSP/1.0\r\n folded\r\n\r\n",
            b"DESCRIBE rtsp://a/ RTSP/1.0\r\nno colon\r\n\r\n",
            b"DESCRIBE rtsp://a/ RTSP/1.0\r\nBad Name: x\r\n\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = vec![b'a'; MAX_HEAD + 1];
        assert!(parse(&long).is_err());
    }

    #[test]
    fn urls() {
        assert_eq!(
            split_url(b"rtsp://cam.example:554/live/a?x=1"),
            Some((&b"cam.example:554"[..], &b"/live/a?x=1"[..]))
        );
        assert_eq!(split_url(b"RTSP://u:p@cam"), Some((&b"cam"[..], &b"/"[..])));
        assert_eq!(split_url(b"*"), None);
        assert_eq!(split_url(b"http://a/b"), None);
    }
}
