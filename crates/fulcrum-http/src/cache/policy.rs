//! RFC 9111 rules as pure functions over parsed directives and times, so each section can be
//! tested on its own: which responses a shared cache may store (§3), how fresh a stored response
//! is (§4.2), whether a request may be answered with it (§4, §5.2.1), how a 304 updates it
//! (§3.2, §4.3.4), which client conditionals it satisfies (RFC 9110 §13.2.2), and Vary (§4.1).
//!
//! Times are whole seconds since the Unix epoch (HTTP dates have one-second resolution).

use http::{HeaderMap, HeaderName};

/// Largest delta-seconds value kept (RFC 9111 §1.2.2: 2^31).
pub const DELTA_MAX: u64 = 1 << 31;
/// Upper bound of a heuristic freshness lifetime.
pub const HEURISTIC_MAX: u64 = 24 * 3600;

/// Cache-Control directives of a request or a response (RFC 9111 §5.2). Unknown directives are
/// ignored. `max_stale = Some(None)` is `max-stale` without a value (any staleness).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub must_understand: bool,
    pub only_if_cached: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub max_stale: Option<Option<u64>>,
    pub min_fresh: Option<u64>,
    pub stale_if_error: Option<u64>,
    pub stale_while_revalidate: Option<u64>,
    /// The field names of `no-cache="a, b"` (§5.2.2.4), lower case: the response is stored
    /// and reused without these fields (a stored field the origin named may not be reused
    /// without revalidation; leaving it out is what the RFC allows for the rest of the
    /// response).
    pub no_cache_fields: Vec<String>,
    /// The field names of `private="a, b"` (§5.2.2.7), lower case: a shared cache may store
    /// the response, but not these fields.
    pub private_fields: Vec<String>,
    /// Any directive was present.
    pub present: bool,
}

/// The field names of a qualified `no-cache`/`private` argument: a quoted (or, leniently,
/// bare) comma-separated list of field names, lower-cased; `None` when the argument lists
/// no valid name (the directive then reads as the unqualified one).
fn field_names(arg: &[u8]) -> Option<Vec<String>> {
    let inner = arg
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
        .unwrap_or(arg);
    let mut names = Vec::new();
    for n in inner.split(|&b| b == b',') {
        let n = n.trim_ascii();
        if n.is_empty() {
            continue;
        }
        // A field name is a token (RFC 9110 §5.1).
        if !n
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
        {
            return None;
        }
        let n = String::from_utf8_lossy(n).to_ascii_lowercase();
        if !names.contains(&n) {
            names.push(n);
        }
    }
    (!names.is_empty()).then_some(names)
}

/// A delta-seconds argument (§1.2.2): its leading digits (so `3600.5` and `3600a` read as
/// 3600, as common caches do), capped at 2^31; a quoted form is accepted. Without a leading
/// digit (`a3600`, ` 3600`, `'3600'`) it is invalid (`None`).
fn delta(v: Option<&[u8]>) -> Option<u64> {
    let v = v?;
    let v = v
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
        .unwrap_or(v);
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let mut n: u64 = 0;
    for d in &v[..digits] {
        n = n.saturating_mul(10).saturating_add(u64::from(d - b'0'));
        if n > DELTA_MAX {
            return Some(DELTA_MAX);
        }
    }
    Some(n)
}

/// Splits a Cache-Control value at commas outside quoted strings into (name, argument).
fn directives(v: &[u8]) -> Vec<(&[u8], Option<&[u8]>)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    for (i, &b) in v
        .iter()
        .enumerate()
        .chain(std::iter::once((v.len(), &b',')))
    {
        if quoted {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = false;
            }
            if i < v.len() {
                continue;
            }
        }
        match b {
            b'"' if i < v.len() => quoted = true,
            b',' => {
                let item = v[start..i.min(v.len())].trim_ascii();
                start = i + 1;
                if item.is_empty() {
                    continue;
                }
                // No whitespace is allowed around `=` (RFC 9111 §5.2): `max-age = 5` is not
                // max-age.
                match item.iter().position(|&c| c == b'=') {
                    Some(eq) => out.push((&item[..eq], Some(&item[eq + 1..]))),
                    None => out.push((item, None)),
                }
            }
            _ => {}
        }
    }
    out
}

impl Directives {
    /// Parses every Cache-Control field value of a message. A numeric directive with an invalid
    /// argument counts as 0 (the response is stale: the conservative reading of §4.2.1); when a
    /// directive repeats, the first occurrence is used.
    pub fn parse<'a>(values: impl Iterator<Item = &'a [u8]>) -> Directives {
        let mut d = Directives::default();
        for v in values {
            for (name, arg) in directives(v) {
                d.present = true;
                let num = || delta(arg).unwrap_or(0);
                if name.eq_ignore_ascii_case(b"no-store") {
                    d.no_store = true;
                } else if name.eq_ignore_ascii_case(b"no-cache") {
                    // The field-name form (§5.2.2.4) names fields that may not be reused
                    // without revalidation: they are left out of the stored response. An
                    // argument that lists no valid name reads as the unqualified directive.
                    match arg.and_then(field_names) {
                        Some(names) => d.no_cache_fields.extend(names),
                        None => d.no_cache = true,
                    }
                } else if name.eq_ignore_ascii_case(b"private") {
                    match arg.and_then(field_names) {
                        Some(names) => d.private_fields.extend(names),
                        None => d.private = true,
                    }
                } else if name.eq_ignore_ascii_case(b"public") {
                    d.public = true;
                } else if name.eq_ignore_ascii_case(b"must-revalidate") {
                    d.must_revalidate = true;
                } else if name.eq_ignore_ascii_case(b"proxy-revalidate") {
                    d.proxy_revalidate = true;
                } else if name.eq_ignore_ascii_case(b"must-understand") {
                    d.must_understand = true;
                } else if name.eq_ignore_ascii_case(b"only-if-cached") {
                    d.only_if_cached = true;
                } else if name.eq_ignore_ascii_case(b"max-age") {
                    d.max_age.get_or_insert_with(num);
                } else if name.eq_ignore_ascii_case(b"s-maxage") {
                    d.s_maxage.get_or_insert_with(num);
                } else if name.eq_ignore_ascii_case(b"min-fresh") {
                    d.min_fresh.get_or_insert_with(num);
                } else if name.eq_ignore_ascii_case(b"stale-while-revalidate") {
                    d.stale_while_revalidate.get_or_insert_with(num);
                } else if name.eq_ignore_ascii_case(b"stale-if-error") {
                    d.stale_if_error.get_or_insert_with(num);
                } else if name.eq_ignore_ascii_case(b"max-stale") {
                    // An invalid argument reads as "no limit given": any staleness.
                    d.max_stale.get_or_insert(delta(arg));
                }
            }
        }
        d
    }
}

/// The directives of a `CDN-Cache-Control` field (RFC 9213), which a reverse-proxy cache
/// obeys instead of Cache-Control and Expires when present and valid. The field is a
/// structured dictionary: an item with an invalid key or a numeric directive whose value is
/// not an integer makes the whole field invalid (`None`: Cache-Control applies). Keys are
/// compared without case, as deployed caches do.
pub fn targeted<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<Directives> {
    let values: Vec<&[u8]> = values.collect();
    if values.is_empty() {
        return None;
    }
    for v in &values {
        for (name, arg) in directives(v) {
            let key_ok = name
                .first()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'*')
                && name
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'*'));
            if !key_ok {
                return None;
            }
            let numeric = [
                &b"max-age"[..],
                b"s-maxage",
                b"stale-if-error",
                b"stale-while-revalidate",
            ]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n));
            if numeric && !arg.is_some_and(|a| !a.is_empty() && a.iter().all(u8::is_ascii_digit)) {
                return None;
            }
        }
    }
    Some(Directives::parse(values.into_iter()))
}

/// Statuses a cache may store without explicit freshness: "heuristically cacheable" (RFC 9110
/// §15.1).
pub fn heuristically_cacheable(status: u16) -> bool {
    matches!(
        status,
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Statuses whose semantics this cache understands (for `must-understand`, §5.2.2.3).
fn understood(status: u16) -> bool {
    heuristically_cacheable(status)
        || matches!(status, 302 | 303 | 307 | 400 | 403 | 500 | 502 | 503 | 504)
}

/// What the storability decision looks at in a response.
#[derive(Debug, Clone, Copy)]
pub struct ResponseFacts<'a> {
    pub status: u16,
    pub cc: &'a Directives,
    /// An Expires field is present (valid or not).
    pub has_expires: bool,
    /// The Vary field lists `*`.
    pub vary_star: bool,
}

/// Why a response is not stored (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    Method,
    Status,
    NoStore,
    Private,
    Authorization,
    VaryStar,
    NoFreshness,
}

/// RFC 9111 §3 (and §3.5 for Authorization) for a shared cache. `method_get`: the request
/// method is GET (the only one stored here); `authorization`: the request carried credentials.
pub fn storable(
    method_get: bool,
    req_cc: &Directives,
    authorization: bool,
    r: &ResponseFacts<'_>,
) -> Result<(), NotStored> {
    if !method_get {
        return Err(NotStored::Method);
    }
    // Final statuses only; 206 needs range-aware storage, 304 only updates entries.
    if r.status < 200 || r.status == 206 || r.status == 304 || r.status > 599 {
        return Err(NotStored::Status);
    }
    let cc = r.cc;
    // must-understand overrides no-store for understood statuses (§5.2.2.3).
    let no_store = if cc.must_understand {
        !understood(r.status)
    } else {
        cc.no_store
    };
    if no_store || req_cc.no_store {
        return Err(NotStored::NoStore);
    }
    if cc.private {
        return Err(NotStored::Private);
    }
    if authorization && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate) {
        return Err(NotStored::Authorization);
    }
    if r.vary_star {
        return Err(NotStored::VaryStar);
    }
    let explicit = cc.public || cc.max_age.is_some() || cc.s_maxage.is_some() || r.has_expires;
    if !explicit && !heuristically_cacheable(r.status) {
        return Err(NotStored::NoFreshness);
    }
    Ok(())
}

/// The times a stored response's freshness is computed from (§4.2.1, §4.2.2).
#[derive(Debug, Clone, Copy, Default)]
pub struct Times {
    /// Date field value, if valid.
    pub date: Option<i64>,
    /// Expires: `Some(None)` when present but invalid (already expired, §5.3).
    pub expires: Option<Option<i64>>,
    pub last_modified: Option<i64>,
}

/// Freshness lifetime in seconds for a shared cache (§4.2.1): s-maxage, then max-age, then
/// Expires − Date, then a heuristic (§4.2.2: 10% of the time since Last-Modified, capped, only
/// for heuristically cacheable statuses or `public`). `response_time` stands in for a missing
/// Date.
pub fn freshness_lifetime(status: u16, cc: &Directives, t: &Times, response_time: i64) -> u64 {
    if let Some(s) = cc.s_maxage {
        return s;
    }
    if let Some(m) = cc.max_age {
        return m;
    }
    let date = t.date.unwrap_or(response_time);
    match t.expires {
        Some(Some(e)) => return u64::try_from(e - date).unwrap_or(0),
        Some(None) => return 0,
        None => {}
    }
    if heuristically_cacheable(status) || cc.public {
        if let Some(lm) = t.last_modified {
            let since = u64::try_from(date - lm).unwrap_or(0);
            return (since / 10).min(HEURISTIC_MAX);
        }
    }
    0
}

/// The ages a stored response's current age is computed from (§4.2.3).
#[derive(Debug, Clone, Copy, Default)]
pub struct AgeInputs {
    /// Age field value from the member (0 if absent or invalid).
    pub age_value: u64,
    pub date: Option<i64>,
    pub request_time: i64,
    pub response_time: i64,
}

/// The corrected initial age (§4.2.3): the age the response had when it was received.
pub fn corrected_initial_age(a: &AgeInputs) -> u64 {
    let date = a.date.unwrap_or(a.response_time);
    let apparent_age = u64::try_from(a.response_time - date).unwrap_or(0);
    let response_delay = u64::try_from(a.response_time - a.request_time).unwrap_or(0);
    let corrected_age_value = a.age_value.saturating_add(response_delay);
    apparent_age.max(corrected_age_value)
}

/// current_age = corrected_initial_age + resident_time (§4.2.3).
pub fn current_age(initial_age: u64, response_time: i64, now: i64) -> u64 {
    initial_age.saturating_add(u64::try_from(now - response_time).unwrap_or(0))
}

/// How a stored response may be used for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usable {
    /// Fresh enough for this request: answer from the cache.
    Fresh,
    /// Stale, but the request accepts it (max-stale).
    StaleAllowed,
    /// Must be validated with the member before use (or may not be used at all).
    Validate,
}

/// What the use decision looks at in a stored response.
#[derive(Debug, Clone, Copy)]
pub struct Stored<'a> {
    pub cc: &'a Directives,
    pub lifetime: u64,
    pub age: u64,
}

/// May a stored response answer this request without contacting the member (§4, §4.2.4,
/// §5.2.1)? `req_no_cache`: request `no-cache`, or `Pragma: no-cache` without Cache-Control
/// (§5.4).
pub fn usable(req: &Directives, req_no_cache: bool, s: &Stored<'_>) -> Usable {
    if req_no_cache || s.cc.no_cache {
        return Usable::Validate;
    }
    if let Some(max_age) = req.max_age {
        // Ages are whole seconds (truncated): `max-age=0` asks for a response of no age at
        // all, which only the member can give.
        if s.age > max_age || max_age == 0 {
            return Usable::Validate;
        }
    }
    let fresh = s.lifetime > s.age;
    if fresh {
        if let Some(min_fresh) = req.min_fresh {
            if s.lifetime - s.age < min_fresh {
                return Usable::Validate;
            }
        }
        return Usable::Fresh;
    }
    // Stale. Served only when the request explicitly allows it and the origin did not forbid
    // it (must-revalidate; proxy-revalidate and s-maxage for shared caches, §5.2.2.2/8/10).
    if never_stale(s.cc) {
        return Usable::Validate;
    }
    match req.max_stale {
        Some(None) => Usable::StaleAllowed,
        Some(Some(limit)) if s.age - s.lifetime <= limit => Usable::StaleAllowed,
        _ => Usable::Validate,
    }
}

/// A stale copy of this response may never be served (shared cache).
pub fn never_stale(cc: &Directives) -> bool {
    cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some()
}

/// May a stale stored response be served when the member fails (error status or unreachable)?
/// Only where `stale-if-error` (RFC 5861) in the request or the response allows it.
pub fn stale_on_error(req: &Directives, s: &Stored<'_>) -> bool {
    if never_stale(s.cc) || s.cc.no_cache {
        return false;
    }
    let staleness = s.age.saturating_sub(s.lifetime);
    req.stale_if_error
        .or(s.cc.stale_if_error)
        .is_some_and(|limit| staleness <= limit)
}

/// May a stale stored response be served while it is revalidated in the background
/// (`stale-while-revalidate`, RFC 5861 §3)? Not when the request asks for a validated or
/// fresher answer.
pub fn stale_while_revalidate(req: &Directives, req_no_cache: bool, s: &Stored<'_>) -> bool {
    if req_no_cache || req.max_age.is_some() || req.min_fresh.is_some() {
        return false;
    }
    if never_stale(s.cc) || s.cc.no_cache || s.lifetime > s.age {
        return false;
    }
    s.cc.stale_while_revalidate
        .is_some_and(|window| s.age - s.lifetime <= window)
}

/// May a stale stored response be served when the member cannot be reached at all (§4.2.4:
/// a disconnected cache)? Not where the origin forbids stale use.
pub fn stale_when_disconnected(s: &Stored<'_>) -> bool {
    !never_stale(s.cc) && !s.cc.no_cache
}

/// Fields a cache never stores or copies from a 304 (§3.1, §3.2): hop-by-hop and framing
/// fields, and the Age it recomputes. Names are lower case.
pub fn excluded_from_storage(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "trailer"
            | "content-length"
            | "age"
    )
}

/// Updates stored header fields from a 304 or HEAD response (§3.2): every field in `update`
/// replaces the stored ones of the same name, except those excluded from storage and
/// Content-Length (the stored body does not change).
pub fn update_headers(stored: &mut HeaderMap, update: &HeaderMap) {
    let mut seen: Vec<&HeaderName> = Vec::new();
    for name in update.keys() {
        if excluded_from_storage(name.as_str()) || seen.contains(&name) {
            continue;
        }
        seen.push(name);
        stored.remove(name);
        for v in update.get_all(name) {
            stored.append(name.clone(), v.clone());
        }
    }
}

/// Weak comparison of entity tags (RFC 9110 §8.8.3.2): `W/` prefixes are ignored.
pub fn weak_match(a: &[u8], b: &[u8]) -> bool {
    let strip = |t: &[u8]| -> Vec<u8> {
        let t = t.trim_ascii();
        t.strip_prefix(b"W/").unwrap_or(t).to_vec()
    };
    let (a, b) = (strip(a), strip(b));
    !a.is_empty() && a == b
}

/// Splits an If-None-Match value into entity tags (commas may appear inside quoted tags).
pub fn etag_list(v: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, &b) in v.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                let t = v[start..i].trim_ascii();
                if !t.is_empty() {
                    out.push(t);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    let t = v[start..].trim_ascii();
    if !t.is_empty() {
        out.push(t);
    }
    out
}

/// A client's conditional GET evaluated against a stored response (RFC 9110 §13.2.2 steps 3
/// and 4): `true` when the answer is 304. If-None-Match takes precedence; If-Modified-Since is
/// evaluated only without it, against Last-Modified (or Date when there is none).
pub fn not_modified(
    if_none_match: &[&[u8]],
    if_modified_since: Option<i64>,
    etag: Option<&[u8]>,
    last_modified: Option<i64>,
    date: Option<i64>,
) -> bool {
    if !if_none_match.is_empty() {
        return if_none_match.iter().any(|v| {
            etag_list(v)
                .into_iter()
                .any(|t| t == b"*" || etag.is_some_and(|e| weak_match(t, e)))
        });
    }
    match (if_modified_since, last_modified.or(date)) {
        (Some(ims), Some(lm)) => lm <= ims,
        _ => false,
    }
}

/// What a stored response of `len` bytes answers a `Range` request with (RFC 9110 §14.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByteRange {
    /// The whole response (200): no valid Range, or one a server may ignore (RFC 9110 §14.2:
    /// more than `MAX_RANGES`, or ranges not in ascending order or overlapping — the shape of the
    /// small-overlapping-ranges attacks on Apache's multipart answers).
    Whole,
    /// Bytes `first..=last` (206).
    Part { first: u64, last: u64 },
    /// Several satisfiable ranges, ascending and apart (206, `multipart/byteranges`); the
    /// unsatisfiable ones of the field are left out.
    Parts(Vec<(u64, u64)>),
    /// No satisfiable range (416 with `Content-Range: bytes */len`).
    Unsatisfiable,
}

/// The most ranges answered as `multipart/byteranges`; more and the whole response goes
/// (nginx's `max_ranges` is unlimited by default; Apache settled on a limit after CVE-2011-3192).
pub const MAX_RANGES: usize = 16;

/// Evaluates a `Range` field value against a representation of `len` bytes. Syntax errors
/// (another unit, `5-2`, garbage) make the field ignored, as §14.2 asks.
pub fn byte_range(value: &[u8], len: u64) -> ByteRange {
    let value = value.trim_ascii();
    let Some(eq) = value.iter().position(|&b| b == b'=') else {
        return ByteRange::Whole;
    };
    if !value[..eq].trim_ascii().eq_ignore_ascii_case(b"bytes") {
        return ByteRange::Whole;
    }
    let number = |v: &[u8]| -> Option<u64> {
        if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(v).ok()?.parse().ok()
    };
    let mut specs = Vec::new();
    for spec in value[eq + 1..].split(|&b| b == b',') {
        let spec = spec.trim_ascii();
        if spec.is_empty() {
            continue;
        }
        let Some(dash) = spec.iter().position(|&b| b == b'-') else {
            return ByteRange::Whole;
        };
        let (a, b) = (spec[..dash].trim_ascii(), spec[dash + 1..].trim_ascii());
        let r = if a.is_empty() {
            // suffix-range: the last b bytes.
            let Some(n) = number(b) else {
                return ByteRange::Whole;
            };
            (n > 0 && len > 0).then(|| (len.saturating_sub(n), len - 1))
        } else {
            let Some(first) = number(a) else {
                return ByteRange::Whole;
            };
            let last = if b.is_empty() {
                None
            } else {
                match number(b) {
                    Some(l) if l >= first => Some(l),
                    _ => return ByteRange::Whole,
                }
            };
            (first < len).then(|| (first, last.map_or(len - 1, |l| l.min(len - 1))))
        };
        specs.push(r);
    }
    if specs.len() > MAX_RANGES {
        return ByteRange::Whole;
    }
    let satisfiable: Vec<(u64, u64)> = specs.iter().flatten().copied().collect();
    match satisfiable.as_slice() {
        [] if specs.is_empty() => ByteRange::Whole,
        [] => ByteRange::Unsatisfiable,
        [(first, last)] => ByteRange::Part {
            first: *first,
            last: *last,
        },
        parts if parts.windows(2).all(|w| w[1].0 > w[0].1) => ByteRange::Parts(satisfiable),
        _ => ByteRange::Whole,
    }
}

/// Whether an `If-Range` value lets the Range apply to a stored response (RFC 9110 §13.1.5):
/// an entity tag must match the stored one by strong comparison (a weak tag never does); a
/// date must equal the stored Last-Modified exactly.
pub fn if_range_holds(value: &[u8], etag: Option<&[u8]>, last_modified: Option<i64>) -> bool {
    let v = value.trim_ascii();
    if v.starts_with(b"\"") || v.starts_with(b"W/") {
        return !v.starts_with(b"W/") && etag.is_some_and(|e| e.trim_ascii() == v);
    }
    match (http_date(v), last_modified) {
        (Some(d), Some(lm)) => d == lm,
        _ => false,
    }
}

/// Normalises a request's values of one field for Vary matching (§4.1): list members are
/// trimmed and joined with "," so whitespace and field-line splitting do not matter; the
/// content-negotiation fields, whose tokens are case-insensitive, are lower-cased.
pub fn vary_value<'a>(name: &str, values: impl Iterator<Item = &'a [u8]>) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let fold = matches!(
        name,
        "accept-encoding" | "accept-language" | "accept-charset" | "accept"
    );
    for v in values {
        let o = out.get_or_insert_with(Vec::new);
        for item in v.split(|&b| b == b',') {
            let item = item.trim_ascii();
            if item.is_empty() {
                continue;
            }
            if !o.is_empty() {
                o.push(b',');
            }
            for &b in item {
                if b == b' ' || b == b'\t' {
                    continue;
                }
                o.push(if fold { b.to_ascii_lowercase() } else { b });
            }
        }
    }
    out
}

/// The field names a Vary value lists, lower case; `None` for `*` (never matches).
pub fn vary_names<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for v in values {
        for item in v.split(|&b| b == b',') {
            let item = item.trim_ascii();
            if item.is_empty() {
                continue;
            }
            if item == b"*" {
                return None;
            }
            let n = String::from_utf8_lossy(item).to_ascii_lowercase();
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    Some(names)
}

/// Parses an HTTP date (IMF-fixdate, RFC 850 and asctime forms, RFC 9110 §5.6.7) to seconds.
/// Names of days, months and the zone are matched without case, as most caches do.
pub fn http_date(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let t = match httpdate::parse_http_date(s) {
        Ok(t) => t,
        Err(_) => {
            let mut fixed = String::with_capacity(s.len());
            let mut word_start = true;
            for c in s.chars() {
                if c.is_ascii_alphabetic() {
                    fixed.push(if word_start {
                        c.to_ascii_uppercase()
                    } else {
                        c.to_ascii_lowercase()
                    });
                    word_start = false;
                } else {
                    fixed.push(c);
                    word_start = true;
                }
            }
            let fixed = fixed.replace("Gmt", "GMT");
            match httpdate::parse_http_date(&fixed) {
                Ok(t) => t,
                // A weekday that does not fit the date is not worth refusing the date for.
                Err(_) => {
                    let rest = fixed.trim_start_matches(|c: char| c.is_ascii_alphabetic());
                    ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
                        .iter()
                        .find_map(|d| httpdate::parse_http_date(&format!("{d}{rest}")).ok())?
                }
            }
        }
    };
    let secs = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok()
}

/// The Age field's value (§5.1): the first member of the first line, if it is all digits
/// (capped at 2^31); anything else counts as absent.
pub fn age_value<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> u64 {
    let Some(v) = values.next() else {
        return 0;
    };
    let first = v
        .split(|&b| b == b',')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let first = first
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if first.is_empty() || !first.iter().all(u8::is_ascii_digit) {
        return 0;
    }
    delta(Some(first)).unwrap_or(0)
}

#[cfg(test)]
mod tests;
