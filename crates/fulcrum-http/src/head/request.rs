//! Parsing and checking a client's request head (RFC 9112 §3, §5, §6; RFC 9110's field
//! rules), and what the proxy reads from it.

use std::mem::MaybeUninit;

use super::{
    bad, copy_fields, httparse_error, is_token, list_items, parse_length,
    request_line_has_three_parts, trim, valid_host, ConnectionField, Field, FieldKind, HeadError,
    Limits, Method, Parse, RequestHead, Span, Version, HEAD_TOO_LARGE, MAX_FIELDS, TARGET_TOO_LONG,
};

impl RequestHead {
    /// An empty head around `buf` (bytes already read are kept).
    pub fn with_buffer(buf: Vec<u8>) -> RequestHead {
        RequestHead {
            buf,
            ..RequestHead::default()
        }
    }

    /// Forgets the parsed head, keeping the buffer's bytes.
    pub fn reset(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut fields = std::mem::take(&mut self.fields);
        fields.clear();
        *self = RequestHead {
            buf,
            fields,
            ..RequestHead::default()
        };
    }

    /// Parses `buf` as an HTTP/1.x request head. `Partial` asks for more bytes; an error names
    /// the status to answer (400, 414, 431, 505) before closing.
    pub fn parse(&mut self, limits: &Limits) -> Result<Parse, HeadError> {
        let max_fields = limits.max_headers.min(MAX_FIELDS);
        let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_FIELDS] =
            [const { MaybeUninit::uninit() }; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut []);
        let buf = &self.buf[..];
        let status = req
            .parse_with_uninit_headers(buf, &mut slots[..max_fields])
            .map_err(|e| match e {
                // "GET /a b HTTP/1.1" fails on its version, but is a malformed request line.
                httparse::Error::Version if !request_line_has_three_parts(buf) => {
                    bad("invalid request line")
                }
                e => httparse_error(e),
            })?;
        let head_len = match status {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => {
                if buf.len() >= limits.max_header_size {
                    return Err(match memchr::memchr(b'\n', buf) {
                        None if buf.len() > limits.max_uri => TARGET_TOO_LONG,
                        _ => HEAD_TOO_LARGE,
                    });
                }
                if memchr::memchr(b'\n', buf).is_none() && buf.len() > limits.max_uri + 32 {
                    return Err(TARGET_TOO_LONG);
                }
                return Ok(Parse::Partial);
            }
        };
        if head_len > limits.max_header_size {
            return Err(HEAD_TOO_LARGE);
        }
        let method = req.method.unwrap_or_default().as_bytes();
        let target = req.path.unwrap_or_default().as_bytes();
        if target.len() > limits.max_uri {
            return Err(TARGET_TOO_LONG);
        }
        self.head_len = head_len;
        self.method_span = Span::of(buf, method);
        self.method = Method::of(method);
        self.target = Span::of(buf, target);
        self.version = Version::of_minor(req.version);
        copy_fields(&mut self.fields, buf, req.headers);
        self.validate()?;
        Ok(Parse::Complete)
    }

    /// Builds a head from parts that an HTTP/2 connection already decoded: serialises them into
    /// the same byte form, so everything after this point treats both protocols alike. RFC 9113
    /// §8.2.3 lets a client split Cookie over several fields; they stay separate here and are
    /// joined when forwarded to an HTTP/1.1 member.
    pub fn from_h2(
        method: &[u8],
        path_and_query: &[u8],
        authority: Option<&[u8]>,
        headers: &http::HeaderMap,
        limits: &Limits,
    ) -> Result<RequestHead, HeadError> {
        if path_and_query.len() > limits.max_uri {
            return Err(TARGET_TOO_LONG);
        }
        if headers.len() > limits.max_headers {
            return Err(HeadError {
                status: 431,
                reason: "too many header fields",
            });
        }
        let mut buf = Vec::with_capacity(256);
        let target = if path_and_query.is_empty() {
            &b"/"[..]
        } else {
            path_and_query
        };
        let mut h = RequestHead {
            method_span: Span::pushed(&mut buf, method),
            method: Method::of(method),
            target: Span::pushed(&mut buf, target),
            version: Version::Http2,
            ..RequestHead::default()
        };
        let mut size = buf.len();
        if let Some(a) = authority {
            let name = Span::pushed(&mut buf, b"host");
            let value = Span::pushed(&mut buf, a);
            h.fields.push(Field {
                name,
                value,
                kind: FieldKind::Host,
                hop: false,
            });
        }
        for (name, value) in headers {
            // An HTTP/2 request carries its authority in :authority; a Host field as well is
            // allowed, but :authority wins (RFC 9113 §8.3.1).
            if authority.is_some() && name == http::header::HOST {
                continue;
            }
            let n = name.as_str().as_bytes();
            size += n.len() + value.len() + 4;
            let ns = Span::pushed(&mut buf, n);
            let vs = Span::pushed(&mut buf, value.as_bytes());
            h.fields.push(Field {
                name: ns,
                value: vs,
                kind: FieldKind::of(n),
                hop: false,
            });
        }
        if size > limits.max_header_size {
            return Err(HEAD_TOO_LARGE);
        }
        h.head_len = buf.len();
        h.buf = buf;
        h.validate()?;
        Ok(h)
    }

    /// This head as a filter left it: `pairs` holds the pseudo-fields (`:method`, `:path`,
    /// `:authority`; `:scheme` is the connection's and is ignored) and the fields, and the result
    /// is checked as a received head is. The bytes after the head (body, pipelined requests)
    /// stay after it. The framing may not change: the client's body is framed as it sent it.
    pub fn rebuilt(
        &self,
        pairs: &[(Vec<u8>, Vec<u8>)],
        limits: &Limits,
    ) -> Result<RequestHead, HeadError> {
        let pseudo = |n: &[u8]| {
            pairs
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_slice())
        };
        let method = pseudo(b":method").unwrap_or(self.method_bytes());
        let target = pseudo(b":path").unwrap_or(self.target());
        let authority = pseudo(b":authority");
        if !is_token(method) {
            return Err(bad("a filter set an invalid :method"));
        }
        if target.is_empty() || target.iter().any(|&b| b <= b' ' || b == 0x7f) {
            return Err(bad("a filter set an invalid :path"));
        }
        if target.len() > limits.max_uri {
            return Err(TARGET_TOO_LONG);
        }
        let size: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
        if size > limits.max_header_size {
            return Err(HEAD_TOO_LARGE);
        }
        let mut buf = Vec::with_capacity(size + 16 + self.after_head().len());
        let mut h = RequestHead {
            method_span: Span::pushed(&mut buf, method),
            method: Method::of(method),
            target: Span::pushed(&mut buf, target),
            version: self.version,
            ..RequestHead::default()
        };
        let regular = pairs.iter().filter(|(n, _)| !n.starts_with(b":"));
        let host = authority.map(|a| (&b"host"[..], a));
        for (n, v) in host.into_iter().chain(
            regular
                .filter(|(n, _)| authority.is_none() || !n.eq_ignore_ascii_case(b"host"))
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        ) {
            if !is_token(n) || v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(bad("a filter set an invalid header field"));
            }
            let name = Span::pushed(&mut buf, n);
            let value = Span::pushed(&mut buf, trim(v));
            h.fields.push(Field {
                name,
                value,
                kind: FieldKind::of(n),
                hop: false,
            });
        }
        h.head_len = buf.len();
        buf.extend_from_slice(self.after_head());
        h.buf = buf;
        h.validate()?;
        if h.content_length != self.content_length || h.chunked != self.chunked {
            return Err(HeadError {
                status: 500,
                reason: "a filter changed the framing of the request body",
            });
        }
        Ok(h)
    }

    /// Puts `body` in place of the request's body, which ended at `old_end` in the buffer (the
    /// bytes after it, pipelined requests, stay): the request then has a Content-Length body
    /// held whole in the buffer. Filters that read request bodies see them decoded and
    /// buffered; what they leave is forwarded this way (chunked trailers are not kept).
    pub fn replace_body(&mut self, body: &[u8], old_end: usize) {
        let rest = self.buf.split_off(old_end.min(self.buf.len()));
        self.buf.truncate(self.head_len);
        self.buf.extend_from_slice(body);
        self.buf.extend_from_slice(&rest);
        self.content_length = Some(body.len() as u64);
        self.chunked = false;
    }

    /// RFC 9112 framing checks: anything ambiguous is refused, never forwarded.
    fn validate(&mut self) -> Result<(), HeadError> {
        let buf = &self.buf[..];
        let h2 = self.version == Version::Http2;
        let mut host: Option<Span> = None;
        let mut connection = ConnectionField::default();
        let mut transfer_encoding = false;
        let mut te_chunked_last = false;
        let mut upgrade: Option<Span> = None;
        for f in &self.fields {
            let v = f.value.get(buf);
            match f.kind {
                FieldKind::Host => {
                    if host.is_some() {
                        return Err(bad("more than one Host field"));
                    }
                    if !valid_host(v) {
                        return Err(bad("invalid Host"));
                    }
                    host = Some(f.value);
                }
                FieldKind::ContentLength => {
                    if self.content_length.is_some() {
                        return Err(bad("repeated Content-Length"));
                    }
                    let Some(n) = parse_length(v) else {
                        return Err(bad("invalid Content-Length"));
                    };
                    self.content_length = Some(n);
                }
                FieldKind::TransferEncoding => {
                    if h2 {
                        return Err(bad("Transfer-Encoding in an HTTP/2 request"));
                    }
                    if self.version == Version::Http10 {
                        return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
                    }
                    transfer_encoding = true;
                    for coding in v.split(|b| *b == b',').map(trim) {
                        if coding.is_empty() {
                            continue;
                        }
                        // `chunked` may be applied once, and only as the last coding.
                        if te_chunked_last {
                            return Err(bad("Transfer-Encoding coding after chunked"));
                        }
                        if coding.eq_ignore_ascii_case(b"chunked") {
                            te_chunked_last = true;
                        } else if !is_token(coding) {
                            return Err(bad("invalid Transfer-Encoding"));
                        }
                    }
                }
                FieldKind::Connection if !connection.read(buf, v) => {
                    return Err(bad("invalid Connection"));
                }
                FieldKind::Upgrade => upgrade = Some(f.value),
                FieldKind::Expect if v.eq_ignore_ascii_case(b"100-continue") => {
                    self.expect_continue = true;
                }
                _ => {}
            }
        }
        if transfer_encoding {
            if !te_chunked_last {
                return Err(bad("Transfer-Encoding does not end with chunked"));
            }
            if self.content_length.is_some() {
                return Err(bad("both Content-Length and Transfer-Encoding"));
            }
            self.chunked = true;
        }
        connection.hops.mark(&mut self.fields, buf);

        let (host, target_path) = self.target_form(host)?;
        if let Some(p) = target_path {
            self.split_target(p);
        }
        let buf = &self.buf[..];
        if host.is_none() && self.version == Version::Http11 {
            return Err(bad("HTTP/1.1 request without Host"));
        }
        self.host = host;
        self.close = match self.version {
            Version::Http10 => !connection.keep_alive,
            Version::Http11 => connection.close,
            Version::Http2 => false,
        };
        if connection.upgrade && upgrade.is_some() && self.version == Version::Http11 {
            let proto = upgrade.map(|s| s.get(buf)).unwrap_or_default();
            // An h2c upgrade is a request to this hop, which speaks HTTP/2 only by prior
            // knowledge: answered as HTTP/1.1 and not passed on.
            if !list_items(proto).any(|p| p.eq_ignore_ascii_case(b"h2c")) {
                self.upgrade = upgrade;
            }
        }
        Ok(())
    }

    /// Reads the request target's form: origin (`/path`), asterisk (`*`, OPTIONS only) or
    /// absolute (`http://host/path`, whose authority replaces Host: RFC 9112 §3.2.2). Returns
    /// the host and the span to split into path and query.
    fn target_form(
        &mut self,
        mut host: Option<Span>,
    ) -> Result<(Option<Span>, Option<Span>), HeadError> {
        let buf = &self.buf[..];
        let target = self.target.get(buf);
        let mut split = None;
        match target.first() {
            Some(b'/') => {
                split = Some(self.target);
            }
            Some(b'*') if target.len() == 1 => {
                if self.method != Method::Options {
                    return Err(bad("asterisk-form target outside OPTIONS"));
                }
                self.path = self.target;
            }
            _ if self.method == Method::Connect => {
                return Err(HeadError {
                    status: 405,
                    reason: "CONNECT is not served here",
                });
            }
            _ => {
                // absolute-form: the authority in the target replaces Host (RFC 9112 §3.2.2).
                let lower = target.get(..8).map(|p| p.to_ascii_lowercase());
                let rest = match lower.as_deref() {
                    Some(p) if p.starts_with(b"http://") => &target[7..],
                    Some(p) if p.starts_with(b"https://") => &target[8..],
                    _ => return Err(bad("invalid request target")),
                };
                let end = rest
                    .iter()
                    .position(|b| matches!(b, b'/' | b'?' | b'#'))
                    .unwrap_or(rest.len());
                let authority = &rest[..end];
                if authority.contains(&b'@') || !valid_host(authority) {
                    return Err(bad("invalid authority in the request target"));
                }
                host = Some(Span::of(buf, authority));
                self.host_from_target = true;
                let path = Span::of(buf, &rest[end..]);
                if path.is_empty() {
                    self.path = path;
                } else {
                    split = Some(path);
                }
            }
        }
        Ok((host, split))
    }

    fn split_target(&mut self, t: Span) {
        let bytes = t.get(&self.buf);
        let end = memchr::memchr(b'#', bytes).unwrap_or(bytes.len());
        match memchr::memchr(b'?', &bytes[..end]) {
            Some(q) => {
                self.path = Span {
                    start: t.start,
                    end: t.start + q as u32,
                };
                self.query = Some(Span {
                    start: t.start + q as u32 + 1,
                    end: t.start + end as u32,
                });
            }
            None => {
                self.path = Span {
                    start: t.start,
                    end: t.start + end as u32,
                };
            }
        }
    }

    pub fn method_bytes(&self) -> &[u8] {
        self.method_span.get(&self.buf)
    }
    /// The request target as received.
    pub fn target(&self) -> &[u8] {
        self.target.get(&self.buf)
    }
    /// The path of the target, as received (percent-encoding kept).
    pub fn path(&self) -> &[u8] {
        self.path.get(&self.buf)
    }
    /// The query string without its `?`.
    pub fn query(&self) -> Option<&[u8]> {
        self.query.map(|q| q.get(&self.buf))
    }
    /// The authority the client asked for: Host, or the target's for an absolute-form target.
    pub fn authority(&self) -> Option<&[u8]> {
        self.host.map(|h| h.get(&self.buf))
    }
    /// The host name without port, for matching; brackets of an IPv6 literal kept.
    pub fn host_name(&self) -> Option<&[u8]> {
        let a = self.authority()?;
        if a.first() == Some(&b'[') {
            let end = memchr::memchr(b']', a).map_or(a.len(), |i| i + 1);
            return Some(&a[..end]);
        }
        let a = match memchr::memrchr(b':', a) {
            Some(i) => &a[..i],
            None => a,
        };
        Some(a.strip_suffix(b".").unwrap_or(a))
    }
    /// The protocol the client asks to upgrade to.
    pub fn upgrade(&self) -> Option<&[u8]> {
        self.upgrade.map(|s| s.get(&self.buf))
    }
    pub fn has_body(&self) -> bool {
        self.chunked || self.content_length.is_some_and(|n| n > 0)
    }
    pub fn name(&self, f: &Field) -> &[u8] {
        f.name.get(&self.buf)
    }
    pub fn value(&self, f: &Field) -> &[u8] {
        f.value.get(&self.buf)
    }
    /// Values of the fields of `kind`.
    pub fn values(&self, kind: FieldKind) -> impl Iterator<Item = &[u8]> {
        self.fields
            .iter()
            .filter(move |f| f.kind == kind)
            .map(|f| f.value.get(&self.buf))
    }
    /// Values of the fields named `name` (case-insensitive).
    pub fn values_named<'a>(&'a self, name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |f| f.name.get(&self.buf).eq_ignore_ascii_case(name))
            .map(|f| f.value.get(&self.buf))
    }
    pub fn first_value_named(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.name.get(&self.buf).eq_ignore_ascii_case(name))
            .map(|f| f.value.get(&self.buf))
    }
    /// The first cookie named `name`, over every Cookie field.
    pub fn cookie(&self, name: &[u8]) -> Option<&[u8]> {
        self.values(FieldKind::Cookie)
            .flat_map(crate::cookie::pairs)
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }
    /// The body bytes (and anything after) read together with the head.
    pub fn after_head(&self) -> &[u8] {
        self.buf.get(self.head_len..).unwrap_or_default()
    }
}
