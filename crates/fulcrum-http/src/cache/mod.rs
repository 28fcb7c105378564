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
//! Member fetches go through the HTTP/2 client path's `forward` (which speaks to HTTP/1.1 and
//! HTTP/2 members alike and yields a streaming body), so member choice, retries, health
//! reporting and connection reuse are the ones every other request gets.

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
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::body::{BoxError, DownBody};
use crate::exchange::Route;
use crate::head::{FieldKind, Method, RequestHead, Version};
use crate::service::{Client, Local};
use policy::{Directives, Usable};
use store::Store;
pub use store::{CacheStats, Entry};

/// Longest a request waits for another request's fetch of the same URL before it asks a member
/// itself.
const COLLAPSE_WAIT: Duration = Duration::from_secs(5);
/// Bodies up to this size are kept as one contiguous buffer (one write per hit).
const COALESCE: u64 = 1 << 20;

/// A fetch in progress that other requests for the same URL wait for.
struct Pending {
    done: AtomicBool,
    notify: tokio::sync::Notify,
}

/// The cache of one virtual service, kept across reloads by service name.
pub struct HttpCache {
    store: Store,
    max_object: AtomicU64,
    pub stats: Arc<CacheStats>,
    pending: Mutex<HashMap<Arc<str>, Arc<Pending>>>,
}

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache")
            .field("size", &self.store.size)
            .finish()
    }
}

/// Releases a fetch's waiters when dropped (stored or not).
struct Leader {
    cache: Arc<HttpCache>,
    key: Arc<str>,
    pending: Arc<Pending>,
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
    /// From a stored response; `not_modified` answers a client conditional with 304.
    Stored {
        entry: Arc<Entry>,
        age: u64,
        status: Status,
        not_modified: bool,
    },
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
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Request fields that make a GET/HEAD go around the cache (range and precondition requests
/// are forwarded as they are).
fn bypassed_field(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"range")
        || name.eq_ignore_ascii_case(b"if-match")
        || name.eq_ignore_ascii_case(b"if-unmodified-since")
        || name.eq_ignore_ascii_case(b"if-range")
}

impl HttpCache {
    pub fn new(size: u64, max_object: u64) -> Arc<HttpCache> {
        let stats = Arc::new(CacheStats::default());
        Arc::new(HttpCache {
            store: Store::new(size, stats.clone()),
            max_object: AtomicU64::new(max_object),
            stats,
            pending: Mutex::new(HashMap::new()),
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
        })
    }

    pub fn max_object(&self) -> u64 {
        self.max_object.load(Ordering::Relaxed)
    }

    /// Whether a request goes through the cache at all (GET and HEAD without a body, ranges or
    /// preconditions).
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
struct Request {
    cc: Directives,
    no_cache: bool,
    authorization: bool,
    if_none_match: Vec<Vec<u8>>,
    if_modified_since: Option<i64>,
    conditional: bool,
}

impl Request {
    fn of(head: &RequestHead) -> Request {
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
        }
    }

    fn not_modified(&self, e: &Entry) -> bool {
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

fn find_variant(list: &[Arc<Entry>], head: &RequestHead) -> Option<Arc<Entry>> {
    list.iter()
        .find(|e| e.matches(&|name| policy::vary_value(name, head.values_named(name.as_bytes()))))
        .cloned()
}

/// Serves a GET or HEAD through the cache of `svc`.
pub(crate) async fn serve(route: Route<'_>, client: &Client, head: &RequestHead) -> Reply {
    let svc = route.svc;
    let origin = Origin { route, client };
    let Some(cache) = svc.cache.clone() else {
        return Reply::Bypass;
    };
    let req = Request::of(head);
    if req.cc.no_store && !req.cc.only_if_cached {
        // Nothing of this exchange may be stored, and the client asks for a response the
        // member makes for it.
        return Reply::Bypass;
    }
    let key: Arc<str> = Arc::from(primary_key(svc.scheme(), head));
    let mut waited = false;
    loop {
        let now = now_secs();
        let variants = cache.store.get(&key);
        let found = variants.as_deref().and_then(|l| find_variant(l, head));
        if let Some(e) = found {
            let age = e.age(now);
            let stored = policy::Stored {
                cc: &e.cc,
                lifetime: e.lifetime,
                age,
            };
            match policy::usable(&req.cc, req.no_cache, &stored) {
                Usable::Fresh => {
                    cache.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return stored_reply(&req, e, age, Status::Hit);
                }
                Usable::StaleAllowed => {
                    cache.stats.stale.fetch_add(1, Ordering::Relaxed);
                    return stored_reply(&req, e, age, Status::Stale);
                }
                Usable::Validate => {
                    if policy::stale_while_revalidate(&req.cc, req.no_cache, &stored)
                        && head.method == Method::Get
                    {
                        cache.stats.stale.fetch_add(1, Ordering::Relaxed);
                        revalidate_in_background(&cache, origin, head, &key, &e);
                        return stored_reply(&req, e, age, Status::Stale);
                    }
                    if req.cc.only_if_cached {
                        return Reply::Local(Local::error(504, "only-if-cached: not fresh"));
                    }
                    if head.method != Method::Get {
                        return head_update(&cache, origin, head, &req, &key, e).await;
                    }
                    let bypass =
                        req.no_cache || req.cc.max_age.is_some() || req.cc.min_fresh.is_some();
                    return revalidate(&cache, origin, head, &req, key, e, bypass).await;
                }
            }
        }
        if req.cc.only_if_cached {
            cache.stats.misses.fetch_add(1, Ordering::Relaxed);
            return Reply::Local(Local::error(504, "only-if-cached: not in the cache"));
        }
        if head.method != Method::Get {
            cache.stats.misses.fetch_add(1, Ordering::Relaxed);
            return Reply::Bypass;
        }
        let status = if variants.is_some() {
            Status::VaryMiss
        } else {
            Status::Miss
        };
        // A client conditional is passed on; its 304 is not stored, and nobody waits for it.
        let leader = if req.conditional || waited {
            None
        } else {
            let (pending, lead) = {
                let mut map = cache.pending.lock();
                match map.get(&key) {
                    Some(p) => (p.clone(), false),
                    None => {
                        let p = Arc::new(Pending {
                            done: AtomicBool::new(false),
                            notify: tokio::sync::Notify::new(),
                        });
                        map.insert(key.clone(), p.clone());
                        (p, true)
                    }
                }
            };
            if !lead {
                let notified = pending.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if !pending.done.load(Ordering::Acquire) {
                    let _ = tokio::time::timeout(COLLAPSE_WAIT, notified).await;
                }
                waited = true;
                continue;
            }
            Some(Leader {
                cache: cache.clone(),
                key: key.clone(),
                pending,
            })
        };
        cache.stats.misses.fetch_add(1, Ordering::Relaxed);
        let request_time = now_secs();
        let fill = Filling {
            key,
            status,
            request_time,
            leader,
        };
        return match crate::h2::fetch(route, client, head).await {
            Ok(fetched) => take_response(&cache, &req, head, fetched, fill),
            Err(l) => Reply::Local(l),
        };
    }
}

/// A request's way to a member when the cache asks one: its route and client.
#[derive(Clone, Copy)]
struct Origin<'a> {
    route: Route<'a>,
    client: &'a Client,
}

impl Origin<'_> {
    /// The member's response to `head` (which may be the cache's own conditional request).
    async fn fetch(&self, head: &RequestHead) -> Result<(Response<DownBody>, SocketAddr), Local> {
        crate::h2::fetch(self.route, self.client, head).await
    }
}

/// What a member's response is stored as, should it be storable.
struct Filling {
    key: Arc<str>,
    status: Status,
    request_time: i64,
    /// The fetch other requests for the URL wait for, released once stored (or not).
    leader: Option<Leader>,
}

fn stored_reply(req: &Request, entry: Arc<Entry>, age: u64, status: Status) -> Reply {
    Reply::Stored {
        not_modified: req.not_modified(&entry),
        entry,
        age,
        status,
    }
}

/// A HEAD for a URL whose stored response is stale: forwarded, and a 200 with the same
/// validators updates the stored response's fields and freshness (RFC 9111 §4.3.5); the client
/// is answered from the updated entry. Different validators mean the stored response is
/// outdated: it is removed.
async fn head_update(
    cache: &Arc<HttpCache>,
    origin: Origin<'_>,
    head: &RequestHead,
    req: &Request,
    key: &Arc<str>,
    e: Arc<Entry>,
) -> Reply {
    let request_time = now_secs();
    let (resp, member) = match origin.fetch(head).await {
        Ok(r) => r,
        Err(l) => return Reply::Local(l),
    };
    if resp.status().as_u16() != 200 {
        return Reply::Member {
            resp,
            member,
            status: Status::Bypass,
            stored: false,
        };
    }
    let etag = resp.headers().get(http::header::ETAG).map(|v| v.as_bytes());
    let lm = resp
        .headers()
        .get(http::header::LAST_MODIFIED)
        .and_then(|v| policy::http_date(v.as_bytes()));
    let changed = match (etag, e.etag.as_deref()) {
        (Some(a), Some(b)) => !policy::weak_match(a, b),
        _ => lm.is_some() && e.last_modified.is_some() && lm != e.last_modified,
    };
    if changed {
        cache.store.remove(key);
        return Reply::Member {
            resp,
            member,
            status: Status::Bypass,
            stored: false,
        };
    }
    let (parts, mut body) = resp.into_parts();
    while let Some(Ok(_)) = body.frame().await {}
    let mut headers = e.headers.clone();
    policy::update_headers(&mut headers, &parts.headers);
    let now = now_secs();
    let fresh = Arc::new(Entry::new(
        e.status,
        headers,
        e.body.clone(),
        e.vary.clone(),
        request_time,
        now,
        age_header(&parts.headers),
    ));
    cache.store.replace(key, &e, fresh.clone());
    cache.stats.revalidated.fetch_add(1, Ordering::Relaxed);
    let age = fresh.age(now);
    stored_reply(req, fresh, age, Status::Revalidated)
}

/// Revalidates a stale entry in a task of its own while the stale copy is served
/// (stale-while-revalidate); one at a time per URL.
fn revalidate_in_background(
    cache: &Arc<HttpCache>,
    origin: Origin<'_>,
    head: &RequestHead,
    key: &Arc<str>,
    e: &Arc<Entry>,
) {
    let Route {
        svc,
        target: t,
        index: ti,
        rule,
    } = origin.route;
    let client = origin.client;
    let pending = {
        let mut map = cache.pending.lock();
        if map.contains_key(key) {
            return;
        }
        let p = Arc::new(Pending {
            done: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        });
        map.insert(key.clone(), p.clone());
        p
    };
    let leader = Leader {
        cache: cache.clone(),
        key: key.clone(),
        pending,
    };
    // The rule is found again by index in the task (it borrows from the service).
    let rule_index = rule.and_then(|r| {
        (0..svc.rules.len()).find(|&i| svc.rules.get(i).is_some_and(|x| std::ptr::eq(x, r)))
    });
    let Some(copy) = conditional_head(head, None, &svc.limits) else {
        return;
    };
    let (cache, svc, client, t, key, e) = (
        cache.clone(),
        svc.clone(),
        client.clone(),
        t.clone(),
        key.clone(),
        e.clone(),
    );
    tokio::spawn(async move {
        let _leader = leader;
        let rule = rule_index.and_then(|i| svc.rules.get(i));
        let req = Request::of(&copy);
        let route = Route {
            svc: &svc,
            target: &t,
            index: ti,
            rule,
        };
        let origin = Origin {
            route,
            client: &client,
        };
        let reply = revalidate(&cache, origin, &copy, &req, key, e, false).await;
        if let Reply::Member { resp, .. } = reply {
            // Reading the body to its end stores it.
            let _ = resp.into_body().collect().await;
        }
    });
}

/// A copy of the client's request for a member, with the cache's validators (from `e`) instead
/// of the client's conditionals.
fn conditional_head(
    head: &RequestHead,
    e: Option<&Entry>,
    limits: &crate::head::Limits,
) -> Option<RequestHead> {
    let mut h = HeaderMap::new();
    for f in &head.fields {
        let name = head.name(f);
        if f.hop
            || f.kind.is_hop_by_hop()
            || f.kind == FieldKind::Host
            || name.eq_ignore_ascii_case(b"if-none-match")
            || name.eq_ignore_ascii_case(b"if-modified-since")
        {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name),
            HeaderValue::from_bytes(head.value(f)),
        ) {
            h.append(n, v);
        }
    }
    if let Some(e) = e {
        if let Some(etag) = e
            .etag
            .as_ref()
            .and_then(|t| HeaderValue::from_bytes(t).ok())
        {
            h.insert(http::header::IF_NONE_MATCH, etag);
        }
        if let Some(lm) = e.headers.get(http::header::LAST_MODIFIED) {
            h.insert(http::header::IF_MODIFIED_SINCE, lm.clone());
        }
    }
    let mut pq = head.path().to_vec();
    if pq.is_empty() {
        pq.push(b'/');
    }
    if let Some(q) = head.query() {
        pq.push(b'?');
        pq.extend_from_slice(q);
    }
    RequestHead::from_h2(b"GET", &pq, head.authority(), &h, limits).ok()
}

/// Validates a stored response with a member (§4.3) and answers from the result.
async fn revalidate(
    cache: &Arc<HttpCache>,
    origin: Origin<'_>,
    head: &RequestHead,
    req: &Request,
    key: Arc<str>,
    e: Arc<Entry>,
    client_asked: bool,
) -> Reply {
    let request_time = now_secs();
    let cond = if e.has_validator() {
        conditional_head(head, Some(&e), &origin.route.svc.limits)
    } else {
        None
    };
    let fetched = match &cond {
        Some(h) => origin.fetch(h).await,
        None => origin.fetch(head).await,
    };
    let now = now_secs();
    let age = e.age(now);
    let stored = policy::Stored {
        cc: &e.cc,
        lifetime: e.lifetime,
        age,
    };
    let status = if client_asked {
        Status::Request
    } else {
        Status::StaleRefetched
    };
    match fetched {
        Err(l) => {
            // The member could not be reached (or failed before answering): a disconnected
            // cache may serve stale where the origin allows it (§4.2.4).
            if policy::stale_on_error(&req.cc, &stored)
                || (!client_asked && policy::stale_when_disconnected(&stored))
            {
                cache.stats.stale.fetch_add(1, Ordering::Relaxed);
                return stored_reply(req, e, age, Status::Stale);
            }
            if policy::never_stale(&e.cc) {
                return Reply::Local(Local::error(
                    504,
                    "the member could not validate the stored response",
                ));
            }
            Reply::Local(l)
        }
        Ok((resp, member)) => {
            let code = resp.status().as_u16();
            if code == 304 && cond.is_some() {
                let (parts, mut body) = resp.into_parts();
                while let Some(Ok(_)) = body.frame().await {}
                let mut headers = e.headers.clone();
                policy::update_headers(&mut headers, &parts.headers);
                let age_value = age_header(&parts.headers);
                let fresh = Arc::new(Entry::new(
                    e.status,
                    headers,
                    e.body.clone(),
                    e.vary.clone(),
                    request_time,
                    now,
                    age_value,
                ));
                cache.store.replace(&key, &e, fresh.clone());
                cache.stats.revalidated.fetch_add(1, Ordering::Relaxed);
                let age = fresh.age(now);
                return stored_reply(req, fresh, age, Status::Revalidated);
            }
            if code >= 500 {
                if policy::stale_on_error(&req.cc, &stored) {
                    cache.stats.stale.fetch_add(1, Ordering::Relaxed);
                    return stored_reply(req, e, age, Status::Stale);
                }
                if policy::never_stale(&e.cc) {
                    return Reply::Local(Local::error(
                        504,
                        "the member could not validate the stored response",
                    ));
                }
            }
            let fill = Filling {
                key,
                status,
                request_time,
                leader: None,
            };
            take_response(cache, req, head, (resp, member), fill)
        }
    }
}

fn age_header(h: &HeaderMap) -> u64 {
    policy::age_value(h.get_all(http::header::AGE).iter().map(|v| v.as_bytes()))
}

/// Decides whether a member's response is stored and wraps its body to store it as it streams.
fn take_response(
    cache: &Arc<HttpCache>,
    req: &Request,
    head: &RequestHead,
    (resp, member): (Response<DownBody>, SocketAddr),
    fill: Filling,
) -> Reply {
    let Filling {
        key,
        status,
        request_time,
        leader,
    } = fill;
    let code = resp.status().as_u16();
    let h = resp.headers();
    let cdn = policy::targeted(h.get_all("cdn-cache-control").iter().map(|v| v.as_bytes()));
    let has_expires = cdn.is_none() && h.contains_key(http::header::EXPIRES);
    let cc = cdn.unwrap_or_else(|| {
        Directives::parse(
            h.get_all(http::header::CACHE_CONTROL)
                .iter()
                .map(|v| v.as_bytes()),
        )
    });
    let vary = policy::vary_names(h.get_all(http::header::VARY).iter().map(|v| v.as_bytes()));
    let facts = policy::ResponseFacts {
        status: code,
        cc: &cc,
        has_expires,
        vary_star: vary.is_none(),
    };
    let too_big = h
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > cache.max_object());
    let ok = policy::storable(
        head.method == Method::Get,
        &req.cc,
        req.authorization,
        &facts,
    )
    .is_ok()
        && !too_big;
    if !ok {
        return Reply::Member {
            resp,
            member,
            status,
            stored: false,
        };
    }
    let vary = vary
        .unwrap_or_default()
        .into_iter()
        .map(|n| {
            let v = policy::vary_value(&n, head.values_named(n.as_bytes()));
            (n, v)
        })
        .collect();
    let (mut parts, inner) = resp.into_parts();
    let age_value = age_header(&parts.headers);
    // The response's age when it arrived (§4.2.3), told to the client as well.
    let initial_age = policy::corrected_initial_age(&policy::AgeInputs {
        age_value,
        date: parts
            .headers
            .get(http::header::DATE)
            .and_then(|v| policy::http_date(v.as_bytes())),
        request_time,
        response_time: now_secs(),
    });
    if initial_age > age_value {
        parts
            .headers
            .insert(http::header::AGE, HeaderValue::from(initial_age));
    }
    let fill = Fill {
        cache: cache.clone(),
        key,
        status: code,
        headers: parts.headers.clone(),
        vary,
        request_time,
        age_value,
        chunks: Vec::new(),
        len: 0,
        max: cache.max_object(),
        _leader: leader,
    };
    let body = DownBody::Cache(Box::new(CacheBody::Tee {
        inner,
        fill: Some(Box::new(fill)),
    }));
    Reply::Member {
        resp: Response::from_parts(parts, body),
        member,
        status,
        stored: true,
    }
}

/// A response being stored while it streams to the client.
pub struct Fill {
    cache: Arc<HttpCache>,
    key: Arc<str>,
    status: u16,
    headers: HeaderMap,
    vary: Vec<(String, Option<Vec<u8>>)>,
    request_time: i64,
    age_value: u64,
    chunks: Vec<Bytes>,
    len: u64,
    max: u64,
    _leader: Option<Leader>,
}

impl Fill {
    fn finish(self) {
        let declared = self
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n != self.len) {
            return;
        }
        let body = if self.chunks.len() > 1 && self.len <= COALESCE {
            let mut all = Vec::with_capacity(self.len as usize);
            for c in &self.chunks {
                all.extend_from_slice(c);
            }
            vec![Bytes::from(all)]
        } else {
            self.chunks
        };
        let entry = Entry::new(
            self.status,
            self.headers,
            body,
            self.vary,
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

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            CacheBody::Stored { chunks, next } => {
                let c = chunks.get(*next).cloned();
                *next += 1;
                Poll::Ready(c.map(|c| Ok(Frame::data(c))))
            }
            CacheBody::Tee { inner, fill } => match ready!(Pin::new(inner).poll_frame(cx)) {
                Some(Ok(f)) => {
                    if let (Some(d), Some(fl)) = (f.data_ref(), fill.as_mut()) {
                        if fl.len + d.len() as u64 > fl.max {
                            // Too large for the cache: streamed on, never stored in part.
                            *fill = None;
                        } else {
                            fl.len += d.len() as u64;
                            fl.chunks.push(d.clone());
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
        Reply::Stored {
            entry,
            age,
            status,
            not_modified,
        } => {
            let code = if not_modified { 304 } else { entry.status };
            let mut headers = if not_modified {
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
            let bodiless =
                not_modified || method == Method::Head || matches!(entry.status, 204 | 304);
            if !not_modified && entry.status != 204 {
                headers.insert(
                    http::header::CONTENT_LENGTH,
                    HeaderValue::from(entry.body_len),
                );
            }
            let body = if bodiless {
                DownBody::Full(None)
            } else if entry.body.len() == 1 {
                DownBody::Full(Some(entry.body[0].clone()))
            } else {
                DownBody::Cache(Box::new(CacheBody::Stored {
                    chunks: entry.body.clone(),
                    next: 0,
                }))
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

/// Writes a stored or member answer to an HTTP/1.x client. `out` is the connection's write
/// buffer.
pub(crate) async fn write_h1<W: AsyncWrite + Unpin>(
    io: &mut W,
    out: &mut Vec<u8>,
    head: &RequestHead,
    reply: Reply,
    idle: Duration,
) -> Written {
    out.clear();
    match reply {
        Reply::Stored {
            entry,
            age,
            status,
            not_modified,
        } => {
            let code = if not_modified { 304 } else { entry.status };
            crate::fields::write_status_line(out, code, b"");
            if not_modified {
                for n in NOT_MODIFIED_FIELDS {
                    for v in entry.headers.get_all(n) {
                        out.extend_from_slice(n.as_bytes());
                        out.extend_from_slice(b": ");
                        out.extend_from_slice(v.as_bytes());
                        out.extend_from_slice(b"\r\n");
                    }
                }
            } else {
                out.extend_from_slice(&entry.h1_fields);
            }
            out.extend_from_slice(b"age: ");
            out.extend_from_slice(itoa::Buffer::new().format(age).as_bytes());
            out.extend_from_slice(b"\r\ncache-status: ");
            out.extend_from_slice(status.header(false).as_bytes());
            out.extend_from_slice(b"\r\n");
            if !not_modified && entry.status != 204 {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(entry.body_len).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            connection_fields(out, head, false);
            out.extend_from_slice(b"\r\n");
            let with_body = !not_modified && head.method != Method::Head && entry.status != 204;
            let ok;
            let mut bytes = 0;
            if with_body {
                if entry.body_len as usize + out.len() <= 64 * 1024 {
                    for c in &entry.body {
                        out.extend_from_slice(c);
                    }
                    ok = write_idle(io, out, idle).await;
                } else {
                    let mut good = write_idle(io, out, idle).await;
                    for c in &entry.body {
                        if !good {
                            break;
                        }
                        good = write_idle(io, c, idle).await;
                    }
                    ok = good;
                }
                if ok {
                    bytes = entry.body_len;
                }
            } else {
                ok = write_idle(io, out, idle).await;
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
            let (parts, mut body) = resp.into_parts();
            let code = parts.status.as_u16();
            crate::fields::write_status_line(out, code, b"");
            let mut length = None;
            for (n, v) in &parts.headers {
                if n == http::header::CONTENT_LENGTH {
                    length = v.to_str().ok().and_then(|v| v.parse::<u64>().ok());
                }
                out.extend_from_slice(n.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(v.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"cache-status: ");
            out.extend_from_slice(status.header(stored).as_bytes());
            out.extend_from_slice(b"\r\n");
            let bodiless = head.method == Method::Head || code == 204 || code == 304;
            let chunked = !bodiless && length.is_none() && head.version != Version::Http10;
            let close = !bodiless && length.is_none() && !chunked;
            if chunked {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
            connection_fields(out, head, close);
            out.extend_from_slice(b"\r\n");
            let mut ok = true;
            let mut bytes = 0u64;
            if !bodiless {
                loop {
                    let frame = match tokio::time::timeout(idle, body.frame()).await {
                        Ok(Some(Ok(f))) => f,
                        Ok(None) => break,
                        Ok(Some(Err(_))) | Err(_) => {
                            ok = false;
                            break;
                        }
                    };
                    if let Ok(data) = frame.into_data() {
                        bytes += data.len() as u64;
                        if chunked {
                            crate::chunked::encode_chunk(out, &data);
                        } else {
                            out.extend_from_slice(&data);
                        }
                        if out.len() >= 32 * 1024 {
                            if !write_idle(io, out, idle).await {
                                ok = false;
                                break;
                            }
                            out.clear();
                        }
                    }
                }
                if ok && chunked {
                    out.extend_from_slice(crate::chunked::END);
                }
            } else {
                // Drain (nothing to read for a bodiless answer) so the member connection is
                // released.
                while let Ok(Some(Ok(_))) = tokio::time::timeout(idle, body.frame()).await {}
            }
            if ok && !out.is_empty() {
                ok = write_idle(io, out, idle).await;
            }
            Written {
                status: code,
                bytes,
                member: Some(member),
                keep: ok && !close && !head.close,
            }
        }
        Reply::Local(_) | Reply::Bypass => Written {
            status: 0,
            bytes: 0,
            member: None,
            keep: false,
        },
    }
}

async fn write_idle<W: AsyncWrite + Unpin>(io: &mut W, buf: &[u8], idle: Duration) -> bool {
    matches!(
        tokio::time::timeout(idle, io.write_all(buf)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_origin_targets() {
        assert_eq!(
            same_origin_target("http", "a.test", b"/x?y").as_deref(),
            Some("/x?y")
        );
        assert_eq!(
            same_origin_target("http", "a.test", b"http://A.test:80/z").as_deref(),
            Some("/z")
        );
        assert_eq!(
            same_origin_target("http", "a.test", b"http://b.test/z"),
            None
        );
        assert_eq!(
            same_origin_target("http", "a.test", b"https://a.test/z"),
            None
        );
        assert_eq!(same_origin_target("http", "a.test", b"//a.test/z"), None);
    }

    #[test]
    fn keys_split() {
        assert_eq!(split_key("http://a.test/x?y"), ("a.test", "/x?y"));
    }
}
