//! Writing the forwarded heads: the fields of a request or response as they came, minus the
//! hop-by-hop ones (RFC 9110 §7.6.1) and those a rule removes or replaces, plus the forwarding
//! headers, persistence cookies and framing the proxy adds.
//!
//! The writers are generic over a `Sink`: HTTP/1 heads go straight into the bytes of the write
//! buffer, HTTP/2 ones into a header map.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::client::Client;
use crate::head::{FieldKind, RequestHead, ResponseHead, Version};
use crate::rules::{CompiledRule, Edits};
use crate::sticky::{MemberId, Sticky};

pub use crate::sink::{write_status_line, Sink};

/// Collects fields into a header map (HTTP/2). Fields that are not valid there are dropped.
#[derive(Default)]
pub struct MapSink {
    pub map: HeaderMap,
    name: Option<HeaderName>,
    value: Vec<u8>,
}

impl Sink for MapSink {
    fn begin(&mut self, name: &[u8]) {
        self.name = HeaderName::from_bytes(name).ok();
        self.value.clear();
    }
    fn push(&mut self, value: &[u8]) {
        self.value.extend_from_slice(value);
    }
    fn end(&mut self) {
        if let Some(name) = self.name.take() {
            if let Ok(v) = HeaderValue::from_bytes(&self.value) {
                self.map.append(name, v);
            }
        }
    }
}

/// How a request body goes to the member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqFraming {
    None,
    Length(u64),
    Chunked,
}

/// Begins a list field this hop appends to: the values the message carried (`earlier`, when
/// they are kept), each followed by a comma, so the caller pushes its own item last.
fn begin_list<'a, S: Sink + ?Sized>(
    out: &mut S,
    name: &[u8],
    earlier: Option<impl Iterator<Item = &'a [u8]>>,
) {
    out.begin(name);
    for v in earlier.into_iter().flatten() {
        out.push(v);
        out.push(b", ");
    }
}

/// Via (RFC 9110 §7.6.3): the hops the message already went through, then this one, named by
/// the protocol version it arrived with.
fn write_via<'a, S: Sink + ?Sized>(
    out: &mut S,
    earlier: Option<impl Iterator<Item = &'a [u8]>>,
    version: Version,
) {
    begin_list(out, b"via", earlier);
    out.push(match version {
        Version::Http10 => b"1.0 fulcrum",
        Version::Http11 => b"1.1 fulcrum",
        Version::Http2 => b"2 fulcrum",
    });
    out.end();
}

fn edits_drop(edits: Option<&Edits>, name: &[u8]) -> bool {
    edits.is_some_and(|e| e.drops(name))
}

fn write_edits<S: Sink>(out: &mut S, edits: Option<&Edits>) {
    if let Some(e) = edits {
        for (n, v) in e.set.iter().chain(&e.add) {
            out.field(n.as_str().as_bytes(), v.as_bytes());
        }
    }
}

/// Appends the client address as written in forwarding headers.
fn forwarded_for(out: &mut Vec<u8>, client: &Client) {
    if client.ip.is_ipv6() {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(client.ip_text.as_bytes());
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(client.ip_text.as_bytes());
    }
}

/// The request line for an HTTP/1.1 member: the method, the target (rewritten by the rule, or
/// origin-form for an absolute-form request), HTTP/1.1.
pub fn write_request_line(out: &mut Vec<u8>, req: &RequestHead, rule: Option<&CompiledRule>) {
    out.extend_from_slice(req.method_bytes());
    out.push(b' ');
    write_target(out, req, rule);
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

/// The request target to forward.
pub fn write_target(out: &mut Vec<u8>, req: &RequestHead, rule: Option<&CompiledRule>) {
    match rule.and_then(|r| r.rewritten_path(req)) {
        Some(path) => {
            out.extend_from_slice(&path);
            if let Some(q) = req.query() {
                out.push(b'?');
                out.extend_from_slice(q);
            }
        }
        None if req.host_from_target || req.version == Version::Http2 => {
            let path = req.path();
            out.extend_from_slice(if path.is_empty() { b"/" } else { path });
            if let Some(q) = req.query() {
                out.push(b'?');
                out.extend_from_slice(q);
            }
        }
        None => out.extend_from_slice(req.target()),
    }
}

/// What the field writers need of their service, and nothing more: the forwarding headers it
/// adds, its persistence (cookies to strip, learn and rewrite), whether clients reach it over
/// TLS, and the authorities its members answer as (a `Location` naming one is rewritten).
#[derive(Clone, Copy)]
pub struct Settings<'a> {
    pub forward: fulcrum_config::ForwardHeaders,
    pub sticky: Option<&'a Sticky>,
    pub https: bool,
}

/// For a Location value that points at one of `authorities` (`http://10.0.0.1:8080/x`), the
/// part after the authority (`/x`).
pub fn member_location_rest<'v>(authorities: &[Vec<u8>], location: &'v [u8]) -> Option<&'v [u8]> {
    let lower = location.get(..8)?.to_ascii_lowercase();
    let rest = if lower.starts_with(b"http://") {
        &location[7..]
    } else if lower.starts_with(b"https://") {
        &location[8..]
    } else {
        return None;
    };
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    authorities
        .iter()
        .any(|a| a.eq_ignore_ascii_case(authority))
        .then(|| &rest[end..])
}

/// Everything the request field writer needs besides the request.
pub struct RequestCtx<'a> {
    pub settings: Settings<'a>,
    pub client: &'a Client,
    pub rule: Option<&'a CompiledRule>,
    pub framing: ReqFraming,
    /// Whether the member connection is HTTP/2 (no connection-specific fields at all).
    pub h2: bool,
}

/// Writes the request fields for the member (without the request line or final CRLF).
pub fn write_request_fields<S: Sink>(out: &mut S, req: &RequestHead, cx: &RequestCtx<'_>) {
    let fwd = cx.settings.forward;
    let edits = cx.rule.and_then(|r| r.request_headers.as_ref());
    let sticky = cx.settings.sticky;
    let join_cookies =
        crate::sticky::cookie_fields(req) > 1 || sticky.is_some_and(Sticky::strips_request_cookie);
    let mut cookies_done = false;
    let mut host_written = false;
    let mut xff_seen = false;
    let mut via_seen = false;
    let mut fwd_seen = false;
    let replace = |kind: FieldKind| match kind {
        FieldKind::XForwardedProto => fwd.x_forwarded_proto,
        FieldKind::XForwardedHost => fwd.x_forwarded_host,
        FieldKind::XRealIp => fwd.x_real_ip,
        _ => false,
    };
    for f in &req.fields {
        if f.hop || f.kind.is_hop_by_hop() {
            continue;
        }
        let name = req.name(f);
        if edits_drop(edits, name) {
            continue;
        }
        match f.kind {
            FieldKind::Host => {
                if req.host_from_target || host_written {
                    continue;
                }
                host_written = true;
            }
            FieldKind::Expect if req.expect_continue => continue,
            FieldKind::Cookie if join_cookies => {
                if !cookies_done {
                    cookies_done = true;
                    write_joined_cookies(out, req, sticky);
                }
                continue;
            }
            FieldKind::XForwardedFor if fwd.x_forwarded_for => {
                xff_seen = true;
                continue;
            }
            FieldKind::Via if fwd.via => {
                via_seen = true;
                continue;
            }
            FieldKind::Forwarded if fwd.forwarded => {
                fwd_seen = true;
                continue;
            }
            k if replace(k) => continue,
            _ => {}
        }
        out.field(name, req.value(f));
    }
    if !host_written && !edits_drop(edits, b"host") {
        match req.authority() {
            Some(a) => out.field(b"host", a),
            // HTTP/1.0 without Host: name the address the client connected to.
            None => out.field(b"host", cx.client.info.local.to_string().as_bytes()),
        }
    }
    write_edits(out, edits);

    let scheme: &[u8] = if cx.settings.https { b"https" } else { b"http" };
    let mut scratch = Vec::new();
    if fwd.x_forwarded_for && !edits_drop(edits, b"x-forwarded-for") {
        let earlier = xff_seen.then(|| req.values(FieldKind::XForwardedFor));
        begin_list(out, b"x-forwarded-for", earlier);
        out.push(cx.client.ip_text.as_bytes());
        out.end();
    }
    if fwd.x_forwarded_proto && !edits_drop(edits, b"x-forwarded-proto") {
        out.field(b"x-forwarded-proto", scheme);
    }
    if fwd.x_forwarded_host && !edits_drop(edits, b"x-forwarded-host") {
        if let Some(a) = req.authority() {
            out.field(b"x-forwarded-host", a);
        }
    }
    if fwd.x_real_ip && !edits_drop(edits, b"x-real-ip") {
        out.field(b"x-real-ip", cx.client.ip_text.as_bytes());
    }
    if fwd.forwarded && !edits_drop(edits, b"forwarded") {
        let earlier = fwd_seen.then(|| req.values(FieldKind::Forwarded));
        begin_list(out, b"forwarded", earlier);
        scratch.clear();
        scratch.extend_from_slice(b"for=");
        forwarded_for(&mut scratch, cx.client);
        scratch.extend_from_slice(b";proto=");
        scratch.extend_from_slice(scheme);
        if let Some(a) = req.authority() {
            scratch.extend_from_slice(b";host=\"");
            scratch.extend_from_slice(a);
            scratch.push(b'"');
        }
        out.push(&scratch);
        out.end();
    }
    if fwd.via && !edits_drop(edits, b"via") {
        write_via(
            out,
            via_seen.then(|| req.values(FieldKind::Via)),
            req.version,
        );
    }
    if cx.h2 {
        if let ReqFraming::Length(n) = cx.framing {
            out.field(b"content-length", itoa::Buffer::new().format(n).as_bytes());
        }
        return;
    }
    match cx.framing {
        ReqFraming::None => {
            // A POST without a body still says so, as HTTP/1.1 expects.
            if req.content_length == Some(0) {
                out.field(b"content-length", b"0");
            }
        }
        ReqFraming::Length(n) => {
            out.field(b"content-length", itoa::Buffer::new().format(n).as_bytes())
        }
        ReqFraming::Chunked => {
            // The codings before `chunked` are kept (the body stays in them); the proxy
            // applies chunked itself.
            out.begin(b"transfer-encoding");
            for v in req.values(FieldKind::TransferEncoding) {
                for c in crate::head::list_items(v) {
                    if !c.eq_ignore_ascii_case(b"chunked") {
                        out.push(c);
                        out.push(b", ");
                    }
                }
            }
            out.push(b"chunked");
            out.end();
        }
    }
    if let Some(proto) = req.upgrade() {
        out.field(b"connection", b"upgrade");
        out.field(b"upgrade", proto);
    }
}

/// One Cookie field made of all the request's Cookie fields, the persistence marker taken off.
fn write_joined_cookies<S: Sink>(out: &mut S, req: &RequestHead, sticky: Option<&Sticky>) {
    out.begin(b"cookie");
    let mut first = true;
    for v in req.values(FieldKind::Cookie) {
        for part in v.split(|b| *b == b';') {
            let part = trim_ows(part);
            if part.is_empty() {
                continue;
            }
            if !first {
                out.push(b"; ");
            }
            first = false;
            match (sticky, memchr::memchr(b'=', part)) {
                (Some(s), Some(eq)) if s.strips_request_cookie() => {
                    let name = trim_ows(&part[..eq]);
                    let value = trim_ows(&part[eq + 1..]);
                    out.push(name);
                    out.push(b"=");
                    out.push(s.forwarded_cookie_value(name, value));
                }
                _ => out.push(part),
            }
        }
    }
    out.end();
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// How a response body goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespFraming {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    Length(u64),
    /// Chunked to the client (the member's body is chunked or ends with the connection).
    Chunked,
    /// Until the connection closes (HTTP/1.0 clients).
    Close,
}

/// The field edits of a body filter that changes what the response's fields mean (compression:
/// Content-Encoding, ETag, Vary). The field writer asks it about each member field and lets it
/// add its own after them, without knowing which filter it is.
pub trait FieldEdits: Copy {
    /// Whether the filter edits any field (most responses: no).
    fn edits(self) -> bool;
    /// Writes `name: value` as the filter wants it, or drops it; `true` when it took care of it.
    fn rewrite_field<S: Sink>(self, out: &mut S, name: &[u8], value: &[u8]) -> bool;
    /// Writes the filter's own fields after the member's.
    fn write_added_fields<S: Sink>(self, out: &mut S, resp: &ResponseHead);
}

/// Everything the response field writer needs besides the response; `E` is the body filter's
/// field edits (the compression plan).
pub struct ResponseCtx<'a, E> {
    pub settings: Settings<'a>,
    /// The authorities the target's members answer as (`Location` rewriting).
    pub authorities: &'a [Vec<u8>],
    /// The member that answered.
    pub member: Option<std::net::SocketAddr>,
    pub req: &'a RequestHead,
    pub rule: Option<&'a CompiledRule>,
    /// The member id to set in an inserted cookie (cookie_insert, when the request did not
    /// already name this member).
    pub insert_cookie: Option<&'a MemberId>,
    /// The member id for cookie_rewrite.
    pub rewrite_id: Option<&'a MemberId>,
    pub framing: RespFraming,
    /// Tell the client the connection closes after this response.
    pub close: bool,
    /// The client speaks HTTP/2 (no connection-specific fields).
    pub h2: bool,
    /// The body filter's field edits (compression): the fields it rewrites and adds.
    pub plan: E,
}

/// Writes the response fields for the client (without status line or final CRLF).
pub fn write_response_fields<S: Sink, E: FieldEdits>(
    out: &mut S,
    resp: &ResponseHead,
    cx: &ResponseCtx<'_, E>,
) {
    let edits = cx.rule.and_then(|r| r.response_headers.as_ref());
    let sticky = cx.settings.sticky;
    let member_addr = cx.member;
    let fwd = cx.settings.forward;
    let mut via_seen = false;
    let mut scratch = Vec::new();
    let switching = resp.status == 101;
    for f in &resp.fields {
        // Trailers are not passed on (chunked bodies are re-encoded), so neither is their
        // announcement.
        if f.kind == FieldKind::Trailer {
            continue;
        }
        if f.hop || f.kind.is_hop_by_hop() {
            // A bodiless response keeps the member's Content-Length: for HEAD and 304 it
            // describes the representation.
            let keep_length = f.kind == FieldKind::ContentLength
                && cx.framing == RespFraming::None
                && !(100..200).contains(&resp.status)
                && resp.status != 204;
            if !keep_length {
                continue;
            }
        }
        let name = resp.name(f);
        if edits_drop(edits, name) {
            continue;
        }
        let value = resp.value(f);
        if cx.plan.edits() && cx.plan.rewrite_field(out, name, value) {
            continue;
        }
        match f.kind {
            FieldKind::Location => {
                if let Some(rest) = member_location_rest(cx.authorities, value) {
                    scratch.clear();
                    scratch.extend_from_slice(if cx.settings.https {
                        b"https://"
                    } else {
                        b"http://"
                    });
                    scratch.extend_from_slice(cx.req.authority().unwrap_or(b"localhost"));
                    scratch.extend_from_slice(rest);
                    out.field(name, &scratch);
                    continue;
                }
            }
            FieldKind::SetCookie => {
                if let (Some(s), Some(addr)) = (sticky, member_addr) {
                    s.learn(value, addr);
                    if let (true, Some(id)) = (s.rewrites(value), cx.rewrite_id) {
                        scratch.clear();
                        s.rewrite_set_cookie(value, id, &mut scratch);
                        out.field(name, &scratch);
                        continue;
                    }
                }
            }
            FieldKind::Via if fwd.via => {
                via_seen = true;
                continue;
            }
            _ => {}
        }
        out.field(name, value);
    }
    if let (Some(s), Some(id)) = (sticky, cx.insert_cookie) {
        scratch.clear();
        s.insert_cookie(id, &mut scratch);
        out.field(b"set-cookie", &scratch);
    }
    if cx.plan.edits() {
        cx.plan.write_added_fields(out, resp);
    }
    write_edits(out, edits);
    if fwd.via && !edits_drop(edits, b"via") {
        let earlier = resp
            .fields
            .iter()
            .filter(|f| f.kind == FieldKind::Via)
            .map(|f| resp.value(f));
        write_via(out, via_seen.then_some(earlier), resp.version);
    }
    if cx.h2 {
        if let RespFraming::Length(n) = cx.framing {
            out.field(b"content-length", itoa::Buffer::new().format(n).as_bytes());
        }
        return;
    }
    if switching {
        out.field(b"connection", b"upgrade");
        if let Some(u) = resp.fields.iter().find(|f| f.kind == FieldKind::Upgrade) {
            out.field(b"upgrade", resp.value(u));
        }
        return;
    }
    match cx.framing {
        RespFraming::Length(n) => {
            out.field(b"content-length", itoa::Buffer::new().format(n).as_bytes())
        }
        RespFraming::Chunked => out.field(b"transfer-encoding", b"chunked"),
        RespFraming::None | RespFraming::Close => {}
    }
    if cx.close {
        out.field(b"connection", b"close");
    } else if cx.req.version == Version::Http10 {
        out.field(b"connection", b"keep-alive");
    }
}
