//! A request's way through the service's cache (RFC 9111), the same for HTTP/1 and HTTP/2
//! clients:
//!
//! ```text
//!   GET/HEAD ─▶ key (scheme, host, target) ─▶ variant (Vary) ─▶ fresh? ─▶ answer (Age,
//!   Cache-Status; 304 to a matching conditional) │ stale ─▶ conditional GET to a member ─▶ 304:
//!   freshen + answer │ 200: replace │ error: stale-if-error / 504 for must-revalidate
//!   │ miss ─▶ one member fetch per key (others wait, bounded) ─▶ body streamed to the client
//!   and into the store together (abandoned past max_object)
//! ```
//!
//! Member fetches go through the `forward` module (HTTP/1.1 and HTTP/2 members alike, a streaming
//! body), so member choice, retries, health reporting and connection reuse are the ones every
//! other request gets.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Response};
use http_body::Body;
use http_body_util::BodyExt;

use crate::body::DownBody;
use crate::cache::policy::{self, Directives, Usable};
use crate::cache::{
    collapse_key, now_secs, primary_key, CacheBody, Entry, Fill, HttpCache, Leader, Pending, Reply,
    Request, Status, COLLAPSE_WAIT,
};
use crate::client::Client;
use crate::exchange::Route;
use crate::forward::Interim;
use crate::head::{FieldKind, Method, RequestHead};
use crate::local::Local;
use crate::wasm_filters;

fn find_variant(list: &[Arc<Entry>], head: &RequestHead) -> Option<Arc<Entry>> {
    list.iter()
        .find(|e| e.matches(&|name| policy::vary_value(name, head.values_named(name.as_bytes()))))
        .cloned()
}

/// Serves a GET or HEAD through the cache of `svc`. Interim responses of the member fetches
/// made for this client go to `interim` (never stored).
pub(crate) async fn serve(
    route: Route<'_>,
    client: &Client,
    head: &RequestHead,
    interim: Option<&Interim>,
) -> Reply {
    let svc = route.svc;
    let origin = Origin {
        route,
        client,
        interim,
    };
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
    // The Vary fields learned from another variant's fetch in progress.
    let mut learned: Option<Vec<String>> = None;
    loop {
        let now = now_secs();
        let variants = cache.store.get(&key);
        let found = variants.as_deref().and_then(|l| find_variant(l, head));
        if let Some(e) = found {
            return from_stored(&cache, origin, head, &req, key, e, now).await;
        }
        if req.cc.only_if_cached {
            cache.stats.misses.fetch_add(1, Ordering::Relaxed);
            return Reply::Local(Local::error(504, "only-if-cached: not in the cache"));
        }
        if head.method != Method::Get || req.range.is_some() {
            // A Range miss is forwarded with its Range (the member's 206 is not stored: a
            // part is not the response), so the client waits for its bytes only.
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
            // Misses collapse per variant: on the URL and the values of the fields its
            // stored responses vary on (or those a fetch in progress announced).
            let names = learned.clone().or_else(|| {
                variants
                    .as_deref()
                    .and_then(|l| l.first())
                    .map(|e| e.vary.iter().map(|(n, _)| n.clone()).collect())
            });
            let collapse: Arc<str> = match names.as_deref() {
                Some(n) if !n.is_empty() => Arc::from(collapse_key(&key, n, head)),
                _ => key.clone(),
            };
            let (pending, lead) = {
                let mut map = cache.pending.lock();
                match map.get(&collapse) {
                    Some(p) => (p.clone(), false),
                    None => {
                        let p = Pending::new();
                        map.insert(collapse.clone(), p.clone());
                        (p, true)
                    }
                }
            };
            if !lead {
                let elsewhere = wait_for_fetch(&pending, head).await;
                if elsewhere.is_some() && learned.is_none() {
                    // Another variant is being fetched: this one collapses on its own key.
                    learned = elsewhere;
                } else {
                    waited = true;
                }
                continue;
            }
            let leader = Leader {
                cache: cache.clone(),
                key: collapse,
                pending,
            };
            // A fetch that finished between the lookup above and taking the lead stored what
            // this request wants: answered from that.
            let stored = cache.store.get(&key);
            if stored
                .as_deref()
                .is_some_and(|l| find_variant(l, head).is_some())
            {
                drop(leader);
                continue;
            }
            Some(leader)
        };
        cache.stats.misses.fetch_add(1, Ordering::Relaxed);
        let request_time = now_secs();
        let fill = Filling {
            key,
            status,
            request_time,
            leader,
        };
        return match origin.fetch(head).await {
            Ok(fetched) => take_response(&cache, &req, head, fetched, fill),
            Err(l) => Reply::Local(l),
        };
    }
}

/// A stored variant answers: fresh, stale where that is allowed, or after revalidation with
/// the member (in the background under stale-while-revalidate).
async fn from_stored(
    cache: &Arc<HttpCache>,
    origin: Origin<'_>,
    head: &RequestHead,
    req: &Request,
    key: Arc<str>,
    e: Arc<Entry>,
    now: i64,
) -> Reply {
    let age = e.age(now);
    let stored = policy::Stored {
        cc: &e.cc,
        lifetime: e.lifetime,
        age,
    };
    match policy::usable(&req.cc, req.no_cache, &stored) {
        Usable::Fresh => {
            cache.stats.hits.fetch_add(1, Ordering::Relaxed);
            stored_reply(req, e, age, Status::Hit)
        }
        Usable::StaleAllowed => {
            cache.stats.stale.fetch_add(1, Ordering::Relaxed);
            stored_reply(req, e, age, Status::Stale)
        }
        Usable::Validate => {
            if policy::stale_while_revalidate(&req.cc, req.no_cache, &stored)
                && head.method == Method::Get
            {
                cache.stats.stale.fetch_add(1, Ordering::Relaxed);
                revalidate_in_background(cache, origin, head, &key, &e);
                return stored_reply(req, e, age, Status::Stale);
            }
            if req.cc.only_if_cached {
                return Reply::Local(Local::error(504, "only-if-cached: not fresh"));
            }
            if head.method != Method::Get {
                return head_update(cache, origin, head, req, &key, e).await;
            }
            if req.range.is_some() && !e.has_validator() {
                // Nothing to validate with: the Range goes to the member as it is.
                return Reply::Bypass;
            }
            let bypass = req.no_cache || req.cc.max_age.is_some() || req.cc.min_fresh.is_some();
            revalidate(cache, origin, head, req, key, e, bypass).await
        }
    }
}

/// Waits, up to `COLLAPSE_WAIT`, for the fetch in progress that `pending` stands for. `Some`:
/// that fetch turned out to be of another variant, which varies on these fields.
async fn wait_for_fetch(pending: &Pending, head: &RequestHead) -> Option<Vec<String>> {
    let other = |v: &Vec<(String, Option<Vec<u8>>)>| {
        !v.iter()
            .all(|(n, val)| policy::vary_value(n, head.values_named(n.as_bytes())) == *val)
    };
    let deadline = tokio::time::Instant::now() + COLLAPSE_WAIT;
    let mut elsewhere = None;
    loop {
        let notified = pending.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if pending.done.load(Ordering::Acquire) {
            break;
        }
        if let Some(v) = pending.variant.get().filter(|v| other(v)) {
            elsewhere = Some(v.iter().map(|(n, _)| n.clone()).collect());
            break;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            break;
        }
    }
    elsewhere
}

/// A request's way to a member when the cache asks one: its route and client.
#[derive(Clone, Copy)]
struct Origin<'a> {
    route: Route<'a>,
    client: &'a Client,
    /// The client's interim responses (HTTP/1.1 clients waiting for this answer).
    interim: Option<&'a Interim>,
}

impl Origin<'_> {
    /// The member's response to `head` (which may be the cache's own conditional request).
    async fn fetch(&self, head: &RequestHead) -> Result<(Response<DownBody>, SocketAddr), Local> {
        crate::forward::fetch(self.route, self.client, head, self.interim).await
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
    let not_modified = req.not_modified(&entry);
    Reply::Stored(crate::cache::Stored {
        part: if not_modified {
            policy::ByteRange::Whole
        } else {
            req.part(&entry)
        },
        not_modified,
        entry,
        age,
        status,
    })
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
    let now = now_secs();
    let fresh = freshen(cache, key, &e, resp, request_time, now).await;
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
        member,
    } = origin.route;
    let client = origin.client;
    let pending = {
        let mut map = cache.pending.lock();
        if map.contains_key(key) {
            return;
        }
        let p = Pending::new();
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
        let mut route = Route::new(&svc, &t, ti, rule);
        route.member = member;
        // Nobody waits for this answer: no interim responses.
        let origin = Origin {
            route,
            client: &client,
            interim: None,
        };
        let reply = revalidate(&cache, origin, &copy, &req, key, e, false).await;
        if let Reply::Member { resp, .. } = reply {
            // Reading the body to its end stores it.
            let _ = resp.into_body().collect().await;
        }
    });
}

/// A copy of the client's request for a member, with the cache's validators (from `e`) instead
/// of the client's conditionals, and without Range (the stored response is validated whole;
/// the client's range is cut from it).
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
            || name.eq_ignore_ascii_case(b"range")
            || name.eq_ignore_ascii_case(b"if-range")
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
            let stale = policy::stale_on_error(&req.cc, &stored)
                || (!client_asked && policy::stale_when_disconnected(&stored));
            unvalidated(cache, req, e, age, stale).unwrap_or(Reply::Local(l))
        }
        Ok((resp, member)) => {
            let code = resp.status().as_u16();
            if code == 304 && cond.is_some() {
                let fresh = freshen(cache, &key, &e, resp, request_time, now).await;
                cache.stats.revalidated.fetch_add(1, Ordering::Relaxed);
                let age = fresh.age(now);
                return stored_reply(req, fresh, age, Status::Revalidated);
            }
            if code >= 500 {
                let stale = policy::stale_on_error(&req.cc, &stored);
                if let Some(r) = unvalidated(cache, req, e, age, stale) {
                    return r;
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

/// The stored response `e` updated with the fields of a member's 304 (or a HEAD's 200 with the
/// same validators), fresh again from `request_time` (RFC 9111 §4.3.4), and stored in its
/// place. The member's (empty) body is read to its end.
async fn freshen(
    cache: &HttpCache,
    key: &str,
    e: &Arc<Entry>,
    resp: Response<DownBody>,
    request_time: i64,
    now: i64,
) -> Arc<Entry> {
    let (parts, mut body) = resp.into_parts();
    while let Some(Ok(_)) = body.frame().await {}
    let mut headers = e.headers.clone();
    policy::update_headers(&mut headers, &parts.headers);
    let fresh = Arc::new(Entry::new(
        e.status,
        headers,
        e.body.clone(),
        e.vary.clone(),
        request_time,
        now,
        age_header(&parts.headers),
    ));
    cache.store.replace(key, e, fresh.clone());
    fresh
}

/// A stored response the member could not validate (unreachable, or a 5xx): served stale
/// when `stale` allows it, 504 when it must never be served stale, else `None` (the member's
/// answer stands).
fn unvalidated(
    cache: &HttpCache,
    req: &Request,
    e: Arc<Entry>,
    age: u64,
    stale: bool,
) -> Option<Reply> {
    if stale {
        cache.stats.stale.fetch_add(1, Ordering::Relaxed);
        return Some(stored_reply(req, e, age, Status::Stale));
    }
    policy::never_stale(&e.cc).then(|| {
        Reply::Local(Local::error(
            504,
            "the member could not validate the stored response",
        ))
    })
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
    let vary: Vec<(String, Option<Vec<u8>>)> = vary
        .unwrap_or_default()
        .into_iter()
        .map(|n| {
            let v = policy::vary_value(&n, head.values_named(n.as_bytes()));
            (n, v)
        })
        .collect();
    if let Some(l) = &leader {
        l.pending.publish(vary.clone());
    }
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
    let body = DownBody::filtered(CacheBody::Tee {
        inner,
        fill: Some(Box::new(fill)),
    });
    Reply::Member {
        resp: Response::from_parts(parts, body),
        member,
        status,
        stored: true,
    }
}

/// Runs the response callbacks of the request's filters over an answer of the cache (stored,
/// or a member's being stored): filters are the service's outermost layer, so they see cache
/// hits as they see members' answers. The answer comes back made whole (`Reply::Ready`), its
/// body through the body filters; `Err`: answer this instead.
pub(crate) async fn filtered(
    mut stream: Box<fulcrum_wasm::Stream>,
    reply: crate::cache::Reply,
    method: crate::head::Method,
    pool: &Arc<str>,
) -> Result<crate::cache::Reply, Local> {
    use crate::cache::Reply;
    let wanted = stream.wants_response_headers() || stream.wants_response_transform();
    if !wanted || !matches!(reply, Reply::Stored(_) | Reply::Member { .. }) {
        return Ok(reply);
    }
    let Some((resp, member)) = crate::cache::h2_response(reply, method) else {
        return Err(Local::error(502, ""));
    };
    stream.set_upstream(Some(pool.clone()), member);
    let (mut parts, body) = resp.into_parts();
    if stream.wants_response_headers() {
        let bodiless = body.is_end_stream();
        let mut lent = fulcrum_wasm::HeadPairs::lend(wasm_filters::LentMap {
            status: parts.status,
            headers: std::mem::take(&mut parts.headers),
        });
        let verdict = stream.response_headers(&mut lent, bodiless).await;
        let (back, pairs) = lent
            .take_back::<wasm_filters::LentMap>()
            .ok_or_else(|| wasm_filters::failed("the response head was not handed back"))?;
        parts.headers = back.headers;
        match verdict {
            fulcrum_wasm::Verdict::Continue => {}
            fulcrum_wasm::Verdict::Local(l) => return Err(wasm_filters::local_of(l)),
            fulcrum_wasm::Verdict::Fail(why) => return Err(wasm_filters::failed(&why)),
        }
        if let Some(pairs) = pairs.filter(|_| stream.head_changed()) {
            let (status, headers) = wasm_filters::map_of(&pairs).ok_or_else(|| {
                tracing::warn!("a filter left an invalid response head");
                Local::error(500, "a filter left an invalid head")
            })?;
            parts.status = status.unwrap_or(parts.status);
            parts.headers = headers;
        }
    }
    // A bodiless answer (HEAD, 304) has nothing for the body filters, whatever its length says.
    let body = if stream.wants_response_transform() && !body.is_end_stream() {
        let length = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let f = wasm_filters::FilterBody::new(stream).held_to(length);
        crate::body::DownBody::filtered(crate::transform::TransformBody::new(
            body,
            crate::transform::Transform::Filter(f),
        ))
    } else {
        body
    };
    Ok(Reply::Ready {
        resp: http::Response::from_parts(parts, body),
        member,
    })
}
