//! The shared HTTP cache of a virtual service (RFC 9111), `virtual_service.cache`.
//!
//! - `policy`: the RFC's rules as pure functions (storability, freshness, age, request and
//!   response directives, conditionals, Vary);
//! - `store`: stored responses in a byte-bounded TinyLFU cache shared by all workers;
//! - this module: a request's way through the cache, the same for HTTP/1 and HTTP/2 clients:
//!
//! ```text
//!   GET/HEAD ─▶ key (scheme, host, target) ─▶ variant (Vary) ─▶ fresh? ─▶ answer (Age,
//!   Cache-Status; 304 to a matching conditional) │ stale ─▶ conditional GET to a member ─▶ 304:
//!   freshen + answer │ 200: replace │ error: stale-if-error / 504 for must-revalidate
//!   │ miss ─▶ one member fetch per key (others wait, bounded) ─▶ body streamed to the client
//!   and into the store together (abandoned past max_object)
//! ```
//!
//! The way of a request through it (the `cached` module) is written once for both client
//! protocols; this module holds the cache itself, the stored and streaming bodies (a body
//! filter) and the writers for each client protocol.

pub mod policy;
pub mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::AsyncWrite;

use crate::body::{BoxError, DownBody, FramePoll};
use crate::h1_out::write_timed;
use crate::head::{Method, RequestHead, Version};
use crate::local::Local;
use crate::sink::Sink;
use policy::{ByteRange, Directives};
use store::Store;
pub use store::{CacheStats, Entry};

/// Longest a request waits for another request's fetch of the same URL before it asks a member
/// itself.
pub(crate) const COLLAPSE_WAIT: Duration = Duration::from_secs(5);
/// Bodies up to this size are kept as one contiguous buffer (one write per hit).
const COALESCE: u64 = 1 << 20;

/// A fetch in progress that other requests for the same variant wait for.
pub(crate) struct Pending {
    pub(crate) done: AtomicBool,
    /// The variant being stored (the Vary fields and the leading request's values), known
    /// once the member's response head is in: waiters of another variant stop waiting then.
    pub(crate) variant: std::sync::OnceLock<Vec<(String, Option<Vec<u8>>)>>,
    pub(crate) notify: tokio::sync::Notify,
}

impl Pending {
    pub(crate) fn new() -> Arc<Pending> {
        Arc::new(Pending {
            done: AtomicBool::new(false),
            variant: std::sync::OnceLock::new(),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// Tells the waiters which variant this fetch stores.
    pub(crate) fn publish(&self, variant: Vec<(String, Option<Vec<u8>>)>) {
        if self.variant.set(variant).is_ok() {
            self.notify.notify_waiters();
        }
    }
}

/// The key concurrent misses collapse on: the URL, and the request's values of the fields its
/// stored responses vary on (`names`), so requests for different variants do not wait for each
/// other. Values are only compared, never parsed: a lossy UTF-8 reading at worst collapses two
/// variants, which the lookup after the wait tells apart.
pub(crate) fn collapse_key(key: &str, names: &[String], head: &RequestHead) -> String {
    let mut k = String::from(key);
    for n in names {
        k.push('\n');
        k.push_str(n);
        match policy::vary_value(n, head.values_named(n.as_bytes())) {
            Some(v) => {
                k.push('=');
                k.push_str(&String::from_utf8_lossy(&v));
            }
            None => k.push('!'),
        }
    }
    k
}

/// The cache of one virtual service, kept across reloads by service name.
pub struct HttpCache {
    pub(crate) store: Store,
    max_object: AtomicU64,
    pub stats: Arc<CacheStats>,
    pub(crate) pending: Mutex<HashMap<Arc<str>, Arc<Pending>>>,
    /// Bytes held by responses being stored while they stream (fills in progress), together
    /// at most `size`: many concurrent large fills cannot hold more than the cache may.
    filling: AtomicU64,
}

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache")
            .field("size", &self.store.size)
            .finish()
    }
}

/// Releases a fetch's waiters when dropped (stored or not).
pub(crate) struct Leader {
    pub(crate) cache: Arc<HttpCache>,
    pub(crate) key: Arc<str>,
    pub(crate) pending: Arc<Pending>,
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.cache.pending.lock().remove(&self.key);
        self.pending.done.store(true, Ordering::Release);
        self.pending.notify.notify_waiters();
    }
}

/// What the cache says of an answer (RFC 9211 Cache-Status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Hit,
    /// A stale response served (max-stale, stale-if-error).
    Stale,
    /// Validated with the member (304) and served from the cache.
    Revalidated,
    Miss,
    VaryMiss,
    /// The client asked to bypass (no-cache, max-age, min-fresh).
    Request,
    /// Stale and refetched (the member answered with a new response).
    StaleRefetched,
    Bypass,
}

impl Status {
    fn header(self, stored: bool) -> &'static str {
        match (self, stored) {
            (Status::Hit, _) => "fulcrum; hit",
            (Status::Stale, _) => "fulcrum; hit; detail=stale",
            (Status::Revalidated, _) => "fulcrum; fwd=stale; fwd-status=304",
            (Status::Miss, true) => "fulcrum; fwd=uri-miss; stored",
            (Status::Miss, false) => "fulcrum; fwd=uri-miss",
            (Status::VaryMiss, true) => "fulcrum; fwd=vary-miss; stored",
            (Status::VaryMiss, false) => "fulcrum; fwd=vary-miss",
            (Status::Request, true) => "fulcrum; fwd=request; stored",
            (Status::Request, false) => "fulcrum; fwd=request",
            (Status::StaleRefetched, true) => "fulcrum; fwd=stale; stored",
            (Status::StaleRefetched, false) => "fulcrum; fwd=stale",
            (Status::Bypass, _) => "fulcrum; fwd=bypass",
        }
    }
}

/// How the cache answers a request.
pub(crate) enum Reply {
    /// From a stored response; `not_modified` answers a client conditional with 304, `part`
    /// a Range request with 206 or 416.
    Stored(Stored),
    /// The member's response (being stored while it streams, when `stored`).
    Member {
        resp: Response<DownBody>,
        member: SocketAddr,
        status: Status,
        stored: bool,
    },
    Local(Local),
    /// Not for the cache: forward as usual.
    Bypass,
    /// A stored or member answer made whole, its fields final (the service's filters ran over
    /// it): sent as it is.
    Ready {
        resp: Response<DownBody>,
        member: Option<SocketAddr>,
    },
}

/// An answer from a stored response.
pub(crate) struct Stored {
    pub entry: Arc<Entry>,
    pub age: u64,
    pub status: Status,
    pub not_modified: bool,
    pub part: ByteRange,
}

impl Stored {
    /// What of the stored response answers the request (status, range, body length), with the
    /// entry, its age, the Cache-Status and whether the answer is a 304.
    fn selected(self) -> (Selected, Arc<Entry>, u64, Status, bool) {
        let sel = Selected::of(&self.entry, self.not_modified, self.part);
        (sel, self.entry, self.age, self.status, self.not_modified)
    }
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Request fields that make a GET/HEAD go around the cache (precondition requests are
/// forwarded as they are; Range and If-Range are answered from stored responses).
fn bypassed_field(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"if-match") || name.eq_ignore_ascii_case(b"if-unmodified-since")
}

impl HttpCache {
    pub fn new(size: u64, max_object: u64) -> Arc<HttpCache> {
        let stats = Arc::new(CacheStats::default());
        Arc::new(HttpCache {
            store: Store::new(size, stats.clone()),
            max_object: AtomicU64::new(max_object),
            stats,
            pending: Mutex::new(HashMap::new()),
            filling: AtomicU64::new(0),
        })
    }

    /// This cache for a reloaded `cache` table: the same one when `size` is unchanged, else a
    /// new one of the new size holding the same entries and counters.
    pub fn with_config(self: &Arc<Self>, size: u64, max_object: u64) -> Arc<HttpCache> {
        let cur = &self.store;
        if cur.size == size {
            self.max_object.store(max_object, Ordering::Relaxed);
            return self.clone();
        }
        Arc::new(HttpCache {
            store: cur.resized(size, self.stats.clone()),
            max_object: AtomicU64::new(max_object),
            stats: self.stats.clone(),
            pending: Mutex::new(HashMap::new()),
            filling: AtomicU64::new(0),
        })
    }

    pub fn max_object(&self) -> u64 {
        self.max_object.load(Ordering::Relaxed)
    }

    /// Bytes held by fills in progress.
    pub fn filling(&self) -> u64 {
        self.filling.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes for a fill in progress, unless fills would then hold more than `size`.
    fn reserve(&self, n: u64) -> bool {
        self.filling
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n)
                    .filter(|&total| total <= self.store.size)
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        self.filling.fetch_sub(n, Ordering::AcqRel);
    }

    /// Whether a request goes through the cache at all (GET and HEAD without a body or
    /// preconditions other than the validators and If-Range).
    pub fn applies(&self, head: &RequestHead) -> bool {
        matches!(head.method, Method::Get | Method::Head)
            && !head.has_body()
            && head.upgrade().is_none()
            && !head.fields.iter().any(|f| bypassed_field(head.name(f)))
    }

    /// (URLs, variants, bytes) stored.
    pub fn usage(&self) -> (u64, u64, u64) {
        self.store.usage()
    }

    /// Removes every variant of the URLs `select` accepts (given host, path with query).
    /// Returns how many URLs were removed.
    pub fn purge(&self, select: impl Fn(&str, &str) -> bool) -> u64 {
        self.store.remove_where(|key| {
            let (host, target) = split_key(key);
            select(host, target)
        })
    }

    /// Invalidation after an unsafe request (RFC 9111 §4.4): a non-error response to a
    /// method other than GET/HEAD/OPTIONS/TRACE removes the target URI and the same-origin
    /// Location and Content-Location.
    pub fn after_unsafe(
        &self,
        scheme: &str,
        head: &RequestHead,
        status: u16,
        location: Option<&[u8]>,
        content_location: Option<&[u8]>,
    ) {
        if matches!(
            head.method,
            Method::Get | Method::Head | Method::Options | Method::Trace
        ) || !(200..400).contains(&status)
        {
            return;
        }
        let store = &self.store;
        store.remove(&primary_key(scheme, head));
        let host = host_lower(head);
        for uri in [location, content_location].into_iter().flatten() {
            if let Some(target) = same_origin_target(scheme, &host, uri) {
                let mut key = String::with_capacity(scheme.len() + host.len() + target.len() + 3);
                key.push_str(scheme);
                key.push_str("://");
                key.push_str(&host);
                key.push_str(&target);
                store.remove(&key);
            }
        }
    }
}

/// (host, target) of a key `scheme://host/target`.
fn split_key(key: &str) -> (&str, &str) {
    let rest = key.split_once("://").map_or(key, |(_, r)| r);
    match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    }
}

fn host_lower(head: &RequestHead) -> String {
    String::from_utf8_lossy(head.host_name().unwrap_or(b"")).to_ascii_lowercase()
}

/// The primary cache key (§2): scheme, host (lower case, without port) and target, the same for
/// GET and HEAD.
pub fn primary_key(scheme: &str, head: &RequestHead) -> String {
    let host = head.host_name().unwrap_or(b"");
    let path = head.path();
    let query = head.query();
    let mut k = String::with_capacity(scheme.len() + 3 + host.len() + path.len() + 32);
    k.push_str(scheme);
    k.push_str("://");
    for &b in host {
        k.push(b.to_ascii_lowercase() as char);
    }
    k.push_str(&String::from_utf8_lossy(if path.is_empty() {
        b"/"
    } else {
        path
    }));
    if let Some(q) = query {
        k.push('?');
        k.push_str(&String::from_utf8_lossy(q));
    }
    k
}

/// The target of a Location/Content-Location value if it names the same origin (a relative
/// reference, or an absolute URI with the same scheme and host).
fn same_origin_target(scheme: &str, host: &str, uri: &[u8]) -> Option<String> {
    let uri = std::str::from_utf8(uri).ok()?.trim();
    if uri.starts_with('/') && !uri.starts_with("//") {
        return Some(uri.to_string());
    }
    let (s, rest) = uri.split_once("://")?;
    if !s.eq_ignore_ascii_case(scheme) {
        return None;
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let h = match authority.rfind(':') {
        Some(i) if !authority.ends_with(']') => &authority[..i],
        _ => authority,
    };
    if !h.eq_ignore_ascii_case(host) {
        return None;
    }
    let t = &rest[end..];
    Some(if t.is_empty() || t.starts_with('?') {
        format!("/{t}")
    } else {
        t.to_string()
    })
}

/// The request facts the cache decides on, parsed once.
pub(crate) struct Request {
    pub(crate) cc: Directives,
    pub(crate) no_cache: bool,
    pub(crate) authorization: bool,
    if_none_match: Vec<Vec<u8>>,
    if_modified_since: Option<i64>,
    pub(crate) conditional: bool,
    /// A GET's Range value (range handling is defined for GET only, RFC 9110 §14.2).
    pub(crate) range: Option<Vec<u8>>,
    if_range: Option<Vec<u8>>,
}

impl Request {
    pub(crate) fn of(head: &RequestHead) -> Request {
        let cc = Directives::parse(head.values_named(b"cache-control"));
        let pragma = !cc.present
            && head.values_named(b"pragma").any(|v| {
                v.split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"no-cache"))
            });
        let if_none_match: Vec<Vec<u8>> = head
            .values_named(b"if-none-match")
            .map(<[u8]>::to_vec)
            .collect();
        let ims = head.first_value_named(b"if-modified-since");
        Request {
            no_cache: cc.no_cache || pragma,
            cc,
            authorization: head.first_value_named(b"authorization").is_some(),
            conditional: !if_none_match.is_empty() || ims.is_some(),
            if_modified_since: ims.and_then(policy::http_date),
            if_none_match,
            range: (head.method == Method::Get)
                .then(|| head.first_value_named(b"range").map(<[u8]>::to_vec))
                .flatten(),
            if_range: head.first_value_named(b"if-range").map(<[u8]>::to_vec),
        }
    }

    /// The part of the stored response `e` this request asks for: a Range applies to a 200
    /// whose validator If-Range (if any) names.
    pub(crate) fn part(&self, e: &Entry) -> ByteRange {
        let Some(range) = &self.range else {
            return ByteRange::Whole;
        };
        if e.status != 200
            || self
                .if_range
                .as_ref()
                .is_some_and(|v| !policy::if_range_holds(v, e.etag.as_deref(), e.last_modified))
        {
            return ByteRange::Whole;
        }
        policy::byte_range(range, e.body_len)
    }

    pub(crate) fn not_modified(&self, e: &Entry) -> bool {
        if !self.conditional || !(200..300).contains(&e.status) {
            return false;
        }
        let inm: Vec<&[u8]> = self.if_none_match.iter().map(Vec::as_slice).collect();
        policy::not_modified(
            &inm,
            self.if_modified_since,
            e.etag.as_deref(),
            e.last_modified,
            e.date,
        )
    }
}

/// A response being stored while it streams to the client.
pub struct Fill {
    pub(crate) cache: Arc<HttpCache>,
    pub(crate) key: Arc<str>,
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) vary: Vec<(String, Option<Vec<u8>>)>,
    pub(crate) request_time: i64,
    pub(crate) age_value: u64,
    pub(crate) chunks: Vec<Bytes>,
    pub(crate) len: u64,
    pub(crate) max: u64,
    pub(crate) _leader: Option<Leader>,
}

impl Drop for Fill {
    fn drop(&mut self) {
        self.cache.release(self.len);
    }
}

impl Fill {
    /// Keeps the next piece of the body; false when the response cannot be stored (larger than
    /// max_object, or no room left among the fills in progress): it streams on, unstored.
    fn add(&mut self, d: &Bytes) -> bool {
        let n = d.len() as u64;
        if self.len + n > self.max || !self.cache.reserve(n) {
            self.cache.stats.abandoned.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.len += n;
        self.chunks.push(d.clone());
        true
    }

    fn finish(mut self) {
        let declared = self
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n != self.len) {
            return;
        }
        let chunks = std::mem::take(&mut self.chunks);
        let body = if chunks.len() > 1 && self.len <= COALESCE {
            let mut all = Vec::with_capacity(self.len as usize);
            for c in &chunks {
                all.extend_from_slice(c);
            }
            vec![Bytes::from(all)]
        } else {
            chunks
        };
        let entry = Entry::new(
            self.status,
            std::mem::take(&mut self.headers),
            body,
            std::mem::take(&mut self.vary),
            self.request_time,
            now_secs(),
            self.age_value,
        );
        self.cache.store.put(&self.key, Arc::new(entry));
        self.cache.stats.stored.fetch_add(1, Ordering::Relaxed);
    }
}

/// A response body from the cache for an HTTP/2 client (or the HTTP/1 writer).
pub enum CacheBody {
    Stored {
        chunks: Vec<Bytes>,
        next: usize,
    },
    Tee {
        inner: DownBody,
        fill: Option<Box<Fill>>,
    },
}

impl Body for CacheBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        match self.get_mut() {
            CacheBody::Stored { chunks, next } => {
                let c = chunks.get(*next).cloned();
                *next += 1;
                Poll::Ready(c.map(|c| Ok(Frame::data(c))))
            }
            CacheBody::Tee { inner, fill } => match ready!(Pin::new(inner).poll_frame(cx)) {
                Some(Ok(f)) => {
                    if let (Some(d), Some(fl)) = (f.data_ref(), fill.as_mut()) {
                        if !fl.add(d) {
                            // Not storable: streamed on, never stored in part.
                            *fill = None;
                        }
                    }
                    Poll::Ready(Some(Ok(f)))
                }
                Some(Err(e)) => {
                    *fill = None;
                    Poll::Ready(Some(Err(e)))
                }
                None => {
                    if let Some(fl) = fill.take() {
                        fl.finish();
                    }
                    Poll::Ready(None)
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            CacheBody::Stored { chunks, next } => *next >= chunks.len(),
            // The end is noticed by polling, so the entry is stored.
            CacheBody::Tee { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            CacheBody::Stored { chunks, next } => {
                SizeHint::with_exact(chunks.iter().skip(*next).map(|c| c.len() as u64).sum())
            }
            CacheBody::Tee { inner, .. } => inner.size_hint(),
        }
    }
}

/// What of a stored response goes to the client: the status, the Content-Range value (206,
/// 416), the Content-Type replacing the stored one (several ranges: `multipart/byteranges`) and
/// the body pieces (for 206, slices of the stored ones: no copy of the body).
struct Selected {
    code: u16,
    content_range: Option<String>,
    multipart_type: Option<String>,
    part: Option<Vec<Bytes>>,
    len: u64,
}

impl Selected {
    fn of(entry: &Entry, not_modified: bool, part: ByteRange) -> Selected {
        let whole = |code| Selected {
            code,
            content_range: None,
            multipart_type: None,
            part: None,
            len: entry.body_len,
        };
        if not_modified {
            return whole(304);
        }
        match part {
            ByteRange::Whole => whole(entry.status),
            ByteRange::Unsatisfiable => Selected {
                code: 416,
                content_range: Some(format!("bytes */{}", entry.body_len)),
                multipart_type: None,
                part: Some(Vec::new()),
                len: 0,
            },
            ByteRange::Part { first, last } => Selected {
                code: 206,
                content_range: Some(format!("bytes {first}-{last}/{}", entry.body_len)),
                multipart_type: None,
                part: Some(slice(&entry.body, first, last)),
                len: last - first + 1,
            },
            ByteRange::Parts(ranges) => multipart(entry, &ranges),
        }
    }

    fn body<'a>(&'a self, entry: &'a Entry) -> &'a [Bytes] {
        self.part.as_deref().unwrap_or(&entry.body)
    }

    /// A 416 carries only its Content-Range of the stored fields.
    fn stored_fields(&self) -> bool {
        self.code != 416
    }
}

/// Several ranges of a stored 200 as one `multipart/byteranges` body (RFC 9110 §14.6): each
/// part under a boundary line with the stored Content-Type and its Content-Range.
fn multipart(entry: &Entry, ranges: &[(u64, u64)]) -> Selected {
    // Random per answer, so a body cannot be made to contain it on purpose.
    let boundary = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let content_type = entry
        .headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut pieces = Vec::with_capacity(ranges.len() * 2 + 1);
    for (i, &(first, last)) in ranges.iter().enumerate() {
        let mut head = if i == 0 { String::new() } else { "\r\n".into() };
        head.push_str("--");
        head.push_str(&boundary);
        if let Some(t) = &content_type {
            head.push_str("\r\ncontent-type: ");
            head.push_str(t);
        }
        head.push_str(&format!(
            "\r\ncontent-range: bytes {first}-{last}/{}\r\n\r\n",
            entry.body_len
        ));
        pieces.push(Bytes::from(head));
        pieces.extend(slice(&entry.body, first, last));
    }
    pieces.push(Bytes::from(format!("\r\n--{boundary}--\r\n")));
    Selected {
        code: 206,
        content_range: None,
        multipart_type: Some(format!("multipart/byteranges; boundary={boundary}")),
        len: pieces.iter().map(|p| p.len() as u64).sum(),
        part: Some(pieces),
    }
}

/// Bytes `first..=last` of a body kept in pieces.
fn slice(body: &[Bytes], first: u64, last: u64) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for piece in body {
        let (start, end) = (at, at + piece.len() as u64);
        at = end;
        if end <= first || start > last {
            continue;
        }
        let from = first.saturating_sub(start) as usize;
        let to = ((last + 1).min(end) - start) as usize;
        out.push(piece.slice(from..to));
    }
    out
}

/// Fields a 304 carries from the stored response (RFC 9110 §15.4.5).
const NOT_MODIFIED_FIELDS: [&str; 7] = [
    "cache-control",
    "content-location",
    "date",
    "etag",
    "expires",
    "vary",
    "last-modified",
];

/// The response for an HTTP/2 client.
pub(crate) fn h2_response(
    reply: Reply,
    method: Method,
) -> Option<(Response<DownBody>, Option<SocketAddr>)> {
    match reply {
        Reply::Stored(stored) => {
            let (sel, entry, age, status, not_modified) = stored.selected();
            let code = sel.code;
            let mut headers = if !sel.stored_fields() {
                HeaderMap::new()
            } else if not_modified {
                let mut h = HeaderMap::new();
                for n in NOT_MODIFIED_FIELDS {
                    for v in entry.headers.get_all(n) {
                        h.append(http::HeaderName::from_static(n), v.clone());
                    }
                }
                h
            } else {
                entry.headers.clone()
            };
            headers.insert(http::header::AGE, HeaderValue::from(age));
            headers.insert(
                "cache-status",
                HeaderValue::from_static(status.header(false)),
            );
            if let Some(cr) = sel
                .content_range
                .as_deref()
                .and_then(|v| HeaderValue::from_str(v).ok())
            {
                headers.insert(http::header::CONTENT_RANGE, cr);
            }
            if let Some(t) = sel
                .multipart_type
                .as_deref()
                .and_then(|v| HeaderValue::from_str(v).ok())
            {
                headers.insert(http::header::CONTENT_TYPE, t);
            }
            let bodiless = not_modified
                || method == Method::Head
                || matches!(entry.status, 204 | 304)
                || sel.len == 0;
            if !not_modified && entry.status != 204 {
                headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(sel.len));
            }
            let pieces = sel.body(&entry);
            let body = if bodiless {
                DownBody::Full(None)
            } else if pieces.len() == 1 {
                DownBody::Full(Some(pieces[0].clone()))
            } else {
                DownBody::filtered(CacheBody::Stored {
                    chunks: pieces.to_vec(),
                    next: 0,
                })
            };
            let mut r = Response::new(body);
            *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
            *r.headers_mut() = headers;
            Some((r, None))
        }
        Reply::Member {
            mut resp,
            member,
            status,
            stored,
        } => {
            resp.headers_mut().insert(
                "cache-status",
                HeaderValue::from_static(status.header(stored)),
            );
            Some((resp, Some(member)))
        }
        Reply::Ready { resp, member } => Some((resp, member)),
        Reply::Local(_) | Reply::Bypass => None,
    }
}

/// How an answer to an HTTP/1 client went.
pub(crate) struct Written {
    pub status: u16,
    pub bytes: u64,
    pub member: Option<SocketAddr>,
    pub keep: bool,
}

fn connection_fields(out: &mut Vec<u8>, head: &RequestHead, close: bool) {
    if close || head.close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if head.version == Version::Http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
}

/// Writes a stored or member answer to an HTTP/1.x client.
pub(crate) async fn write_h1<W: AsyncWrite + Unpin>(
    client: crate::h1_out::Client<'_, W>,
    head: &RequestHead,
    reply: Reply,
) -> Written {
    let out = &mut *client.out;
    out.clear();
    match reply {
        Reply::Stored(stored) => {
            let (sel, entry, age, status, not_modified) = stored.selected();
            let code = sel.code;
            crate::sink::write_status_line(out, code, b"");
            if let Some(cr) = &sel.content_range {
                out.field(b"content-range", cr.as_bytes());
            }
            if not_modified {
                for n in NOT_MODIFIED_FIELDS {
                    for v in entry.headers.get_all(n) {
                        out.field(n.as_bytes(), v.as_bytes());
                    }
                }
            } else if let Some(t) = &sel.multipart_type {
                for (n, v) in entry.headers.iter() {
                    if n != http::header::CONTENT_TYPE {
                        out.field(n.as_str().as_bytes(), v.as_bytes());
                    }
                }
                out.field(b"content-type", t.as_bytes());
            } else if sel.stored_fields() {
                out.extend_from_slice(&entry.h1_fields);
            }
            out.field(b"age", itoa::Buffer::new().format(age).as_bytes());
            out.field(b"cache-status", status.header(false).as_bytes());
            if !not_modified && entry.status != 204 {
                out.field(
                    b"content-length",
                    itoa::Buffer::new().format(sel.len).as_bytes(),
                );
            }
            connection_fields(out, head, false);
            out.extend_from_slice(b"\r\n");
            let with_body =
                !not_modified && head.method != Method::Head && entry.status != 204 && sel.len > 0;
            let mut ok;
            let mut bytes = 0;
            let (io, timer, idle) = (client.io, client.timer, client.idle);
            if with_body {
                let pieces = sel.body(&entry);
                if sel.len as usize + out.len() <= 64 * 1024 {
                    for c in pieces {
                        out.extend_from_slice(c);
                    }
                    ok = write_timed(io, timer, out, idle).await.is_ok();
                } else {
                    ok = write_timed(io, timer, out, idle).await.is_ok();
                    for c in pieces {
                        if !ok {
                            break;
                        }
                        ok = write_timed(io, timer, c, idle).await.is_ok();
                    }
                }
                if ok {
                    bytes = sel.len;
                }
            } else {
                ok = write_timed(io, timer, out, idle).await.is_ok();
            }
            Written {
                status: code,
                bytes,
                member: None,
                keep: ok && !head.close,
            }
        }
        Reply::Member {
            resp,
            member,
            status,
            stored,
        } => {
            write_response(
                client,
                head,
                resp,
                Some(member),
                Some(status.header(stored)),
            )
            .await
        }
        Reply::Ready { resp, member } => write_response(client, head, resp, member, None).await,
        Reply::Local(_) | Reply::Bypass => Written {
            status: 0,
            bytes: 0,
            member: None,
            keep: false,
        },
    }
}

/// Writes a whole response to an HTTP/1.x client, with `cache_status` when it has none yet.
async fn write_response<W: AsyncWrite + Unpin>(
    client: crate::h1_out::Client<'_, W>,
    head: &RequestHead,
    resp: Response<DownBody>,
    member: Option<SocketAddr>,
    cache_status: Option<&str>,
) -> Written {
    let out = &mut *client.out;
    let (parts, mut body) = resp.into_parts();
    let code = parts.status.as_u16();
    crate::sink::write_status_line(out, code, b"");
    let mut length = None;
    for (n, v) in &parts.headers {
        if n == http::header::CONTENT_LENGTH {
            length = v.to_str().ok().and_then(|v| v.parse::<u64>().ok());
        }
        out.field(n.as_str().as_bytes(), v.as_bytes());
    }
    if let Some(cs) = cache_status {
        out.field(b"cache-status", cs.as_bytes());
    }
    let bodiless = head.method == Method::Head || code == 204 || code == 304;
    let chunked = !bodiless && length.is_none() && head.version != Version::Http10;
    let close = !bodiless && length.is_none() && !chunked;
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    connection_fields(out, head, close);
    out.extend_from_slice(b"\r\n");
    let mut bytes = 0u64;
    let ok = if bodiless {
        // Drained (nothing to read for a bodiless answer) so the member connection is
        // released.
        let idle = client.idle;
        loop {
            client.timer.set_after(idle);
            let Some(Some(Ok(_))) = client.timer.run(body.frame()).await else {
                break;
            };
        }
        write_timed(client.io, client.timer, client.out, idle)
            .await
            .is_ok()
    } else {
        crate::h1_out::relay_body(client, &mut body, chunked, |n| bytes += n as u64).await
    };
    Written {
        status: code,
        bytes,
        member,
        keep: ok && !close && !head.close,
    }
}

#[cfg(test)]
mod tests;
