//! Parsing a member's response head, building one from HTTP/2 fields or a filter's, and
//! the framing the response declares.

use std::mem::MaybeUninit;

use super::{
    copy_fields, is_token, parse_length, trim, ConnectionField, Field, FieldKind, HeadError,
    Method, Parse, ResponseHead, Span, Version, MAX_RESPONSE_HEAD,
};

const MAX_RESPONSE_FIELDS: usize = 256;

/// Appends a field's name and value to `buf` and its spans to `fields` (heads built rather than
/// parsed: from HTTP/2, or as a filter left them).
fn push_field(buf: &mut Vec<u8>, fields: &mut Vec<Field>, name: &[u8], value: &[u8], hop: bool) {
    let ns = buf.len() as u32;
    buf.extend_from_slice(name);
    let vs = buf.len() as u32;
    buf.extend_from_slice(value);
    fields.push(Field {
        name: Span { start: ns, end: vs },
        value: Span {
            start: vs,
            end: buf.len() as u32,
        },
        kind: FieldKind::of(name),
        hop,
    });
}

fn bad_response(reason: &'static str) -> HeadError {
    HeadError {
        status: 502,
        reason,
    }
}

impl ResponseHead {
    /// Whether the head still has a Content-Length field (a filter may have removed it, which
    /// leaves the member's framing in `content_length` for reading its body).
    pub fn states_length(&self) -> bool {
        self.fields
            .iter()
            .any(|f| f.kind == FieldKind::ContentLength)
    }

    /// An empty head around `buf` (bytes already read are kept).
    pub fn with_buffer(buf: Vec<u8>) -> ResponseHead {
        ResponseHead {
            buf,
            ..ResponseHead::default()
        }
    }

    /// Parses a response head at the start of `buf`; `Partial` asks for more bytes. Errors are
    /// 502: the member sent something the proxy cannot pass on safely.
    pub fn parse(&mut self) -> Result<Parse, HeadError> {
        let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_RESPONSE_FIELDS] =
            [const { MaybeUninit::uninit() }; MAX_RESPONSE_FIELDS];
        let mut resp = httparse::Response::new(&mut []);
        let buf = &self.buf[..];
        let n = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if buf.len() >= MAX_RESPONSE_HEAD {
                    return Err(bad_response("response head too large"));
                }
                return Ok(Parse::Partial);
            }
            Err(_) => return Err(bad_response("malformed response head")),
        };
        self.head_len = n;
        self.status = resp.code.unwrap_or(0);
        self.reason = Span::of(buf, resp.reason.unwrap_or_default().as_bytes());
        self.version = Version::of_minor(resp.version);
        copy_fields(&mut self.fields, buf, resp.headers);
        self.analyse()?;
        Ok(Parse::Complete)
    }

    /// Builds a head from an HTTP/2 member's response.
    pub fn from_h2(parts: &http::response::Parts) -> ResponseHead {
        let mut h = ResponseHead {
            status: parts.status.as_u16(),
            version: Version::Http2,
            ..ResponseHead::default()
        };
        let reason = parts.status.canonical_reason().unwrap_or("");
        h.buf.extend_from_slice(reason.as_bytes());
        h.reason = Span {
            start: 0,
            end: reason.len() as u32,
        };
        for (name, value) in &parts.headers {
            let n = name.as_str().as_bytes();
            push_field(&mut h.buf, &mut h.fields, n, value.as_bytes(), false);
        }
        h.head_len = h.buf.len();
        // Framing is HTTP/2's own; a content-length is kept as a hint for HTTP/1.1 clients.
        let _ = h.analyse();
        h.chunked = false;
        h
    }

    /// This head as a filter left it: `:status` and the fields in `pairs`. The framing of the
    /// member's body (length, chunked, close) stays the member's: it is how the body that
    /// follows is read. The bytes after the head stay after it.
    pub fn rebuilt(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<ResponseHead, HeadError> {
        let status = pairs
            .iter()
            .find(|(n, _)| n == b":status")
            .map(|(_, v)| v.as_slice());
        let status = match status {
            None => self.status,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .filter(|s| (100..1000).contains(s))
                .ok_or(HeadError {
                    status: 500,
                    reason: "a filter set an invalid :status",
                })?,
        };
        let mut h = ResponseHead {
            status,
            version: self.version,
            content_length: self.content_length,
            chunked: self.chunked,
            close: self.close,
            ..ResponseHead::default()
        };
        let reason: &[u8] = if status == self.status {
            self.reason()
        } else {
            http::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .as_bytes()
        };
        h.buf.extend_from_slice(reason);
        h.reason = Span {
            start: 0,
            end: reason.len() as u32,
        };
        for (n, v) in pairs.iter().filter(|(n, _)| !n.starts_with(b":")) {
            if !is_token(n) || v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(HeadError {
                    status: 500,
                    reason: "a filter set an invalid header field",
                });
            }
            // A field the member's Connection named stays hop-by-hop.
            let hop = self
                .fields
                .iter()
                .any(|f| f.hop && self.name(f).eq_ignore_ascii_case(n));
            push_field(&mut h.buf, &mut h.fields, n, v, hop);
        }
        h.head_len = h.buf.len();
        h.buf.extend_from_slice(self.after_head());
        Ok(h)
    }

    fn analyse(&mut self) -> Result<(), HeadError> {
        let buf = &self.buf[..];
        let mut connection = ConnectionField::default();
        let mut te = false;
        let mut te_chunked_last = false;
        let mut lengths: Option<u64> = None;
        for f in &self.fields {
            let v = f.value.get(buf);
            match f.kind {
                FieldKind::ContentLength => {
                    // Members sometimes repeat an identical Content-Length; different values
                    // are ambiguous (RFC 9112 §6.3).
                    for item in v.split(|b| *b == b',').map(trim) {
                        let Some(n) = parse_length(item) else {
                            return Err(bad_response("invalid Content-Length from the member"));
                        };
                        if lengths.is_some_and(|l| l != n) {
                            return Err(bad_response("conflicting Content-Length from the member"));
                        }
                        lengths = Some(n);
                    }
                }
                FieldKind::TransferEncoding => {
                    te = true;
                    te_chunked_last = v
                        .rsplit(|b| *b == b',')
                        .map(trim)
                        .find(|c| !c.is_empty())
                        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
                }
                FieldKind::Connection => {
                    // A member's odd token is not worth refusing its answer for.
                    connection.read(buf, v);
                }
                _ => {}
            }
        }
        connection.hops.mark(&mut self.fields, buf);
        self.close = match self.version {
            Version::Http10 => !connection.keep_alive,
            _ => connection.close,
        };
        if te {
            // Transfer-Encoding overrides Content-Length; a response with both is passed on
            // de-chunked and the member connection closed afterwards (RFC 9112 §6.3).
            if lengths.is_some() {
                self.close = true;
            }
            if !te_chunked_last {
                // Framed by the end of the connection.
                self.close = true;
                self.content_length = None;
                self.chunked = false;
                return Ok(());
            }
            self.chunked = true;
            self.content_length = None;
        } else {
            self.content_length = lengths;
        }
        Ok(())
    }

    pub fn reason(&self) -> &[u8] {
        self.reason.get(&self.buf)
    }
    pub fn name(&self, f: &Field) -> &[u8] {
        f.name.get(&self.buf)
    }
    pub fn value(&self, f: &Field) -> &[u8] {
        f.value.get(&self.buf)
    }
    pub fn after_head(&self) -> &[u8] {
        self.buf.get(self.head_len..).unwrap_or_default()
    }
    /// Whether a response to `method` with this status has no body, whatever its fields say.
    pub fn bodiless(&self, method: Method) -> bool {
        method == Method::Head
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
    }
}
