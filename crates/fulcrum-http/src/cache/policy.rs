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
mod tests {
    use super::*;

    fn cc(v: &str) -> Directives {
        Directives::parse(std::iter::once(v.as_bytes()))
    }

    #[test]
    fn qualified_no_cache_and_private_name_fields_to_leave_out() {
        let d = cc("no-cache=\"A, b\", max-age=60, private=\"Set-Cookie\"");
        assert!(!d.no_cache && !d.private);
        assert_eq!(d.no_cache_fields, ["a", "b"]);
        assert_eq!(d.private_fields, ["set-cookie"]);
        assert_eq!(d.max_age, Some(60));
        let bare = cc("no-cache=x");
        assert_eq!(bare.no_cache_fields, ["x"]);
        // An argument naming nothing valid is the unqualified directive.
        assert!(cc("no-cache=\"\"").no_cache);
        assert!(cc("private=\"a b\"").private);
        assert!(cc("no-cache").no_cache && cc("no-cache").no_cache_fields.is_empty());
    }

    #[test]
    fn byte_ranges_against_a_length() {
        use ByteRange::*;
        let r = |v: &str, len| byte_range(v.as_bytes(), len);
        assert_eq!(r("bytes=0-1", 11), Part { first: 0, last: 1 });
        assert_eq!(r("bytes=1-", 11), Part { first: 1, last: 10 });
        assert_eq!(
            r("bytes=-1", 11),
            Part {
                first: 10,
                last: 10
            }
        );
        assert_eq!(r("bytes=-50", 11), Part { first: 0, last: 10 });
        assert_eq!(r("BYTES = 5-500", 11), Part { first: 5, last: 10 });
        assert_eq!(r("bytes=11-", 11), Unsatisfiable);
        assert_eq!(r("bytes=-0", 11), Unsatisfiable);
        assert_eq!(r("bytes=20-30, 40-", 11), Unsatisfiable);
        assert_eq!(r("bytes=0-", 0), Unsatisfiable);
        assert_eq!(r("bytes=0-1,3-4", 11), Parts(vec![(0, 1), (3, 4)]));
        assert_eq!(
            r("bytes=0-1, 20-30, -2", 11),
            Parts(vec![(0, 1), (9, 10)]),
            "the unsatisfiable range is left out"
        );
        assert_eq!(r("bytes=0-1, 40-50", 11), Part { first: 0, last: 1 });
        assert_eq!(r("bytes=3-4,0-1", 11), Whole, "not ascending: the whole");
        assert_eq!(r("bytes=0-5,5-6", 11), Whole, "overlapping: the whole");
        let many = (0..=MAX_RANGES)
            .map(|i| format!("{i}-{i}"))
            .collect::<Vec<_>>();
        assert_eq!(
            r(&format!("bytes={}", many.join(",")), 100),
            Whole,
            "too many"
        );
        assert_eq!(r("bytes=5-2", 11), Whole, "invalid: ignored");
        assert_eq!(r("items=0-1", 11), Whole);
        assert_eq!(r("bytes=a-b", 11), Whole);
        assert_eq!(r("bytes=99999999999999999999-", 11), Whole);
        assert_eq!(r("bytes", 11), Whole);
    }

    #[test]
    fn if_range_is_strong_or_an_exact_date() {
        let lm = http_date(b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert!(if_range_holds(b"\"a\"", Some(b"\"a\""), None));
        assert!(!if_range_holds(b"\"a\"", Some(b"\"b\""), None));
        assert!(!if_range_holds(b"W/\"a\"", Some(b"W/\"a\""), None));
        assert!(!if_range_holds(b"\"a\"", Some(b"W/\"a\""), None));
        assert!(if_range_holds(b"Sun, 06 Nov 1994 08:49:37 GMT", None, lm));
        assert!(!if_range_holds(b"Sun, 06 Nov 1994 08:49:38 GMT", None, lm));
        assert!(!if_range_holds(b"garbage", Some(b"\"a\""), lm));
    }

    fn facts(status: u16, d: &Directives) -> ResponseFacts<'_> {
        ResponseFacts {
            status,
            cc: d,
            has_expires: false,
            vary_star: false,
        }
    }

    // §5.2: directive syntax.
    #[test]
    fn parses_directives_with_arguments_quotes_and_case() {
        let d = cc("Max-Age=60, s-maxage=\"30\", no-cache=\"a, b\", PUBLIC, max-stale");
        assert_eq!(d.max_age, Some(60));
        assert_eq!(d.s_maxage, Some(30));
        assert!(!d.no_cache && d.public, "the qualified form names fields");
        assert_eq!(d.no_cache_fields, ["a", "b"]);
        assert_eq!(d.max_stale, Some(None));
        let d = cc("max-stale=10, min-fresh=5, only-if-cached, no-store");
        assert_eq!(d.max_stale, Some(Some(10)));
        assert_eq!(d.min_fresh, Some(5));
        assert!(d.only_if_cached && d.no_store);
    }

    // §1.2.2 / §4.2.1: invalid and repeated delta-seconds.
    #[test]
    fn invalid_max_age_is_stale_first_occurrence_wins_big_values_capped() {
        assert_eq!(cc("max-age=abc").max_age, Some(0));
        assert_eq!(cc("max-age= 60").max_age, Some(0));
        assert_eq!(cc("max-age =60").max_age, None);
        assert_eq!(cc("max-age='60'").max_age, Some(0));
        assert_eq!(cc("max-age=60.5").max_age, Some(60));
        assert_eq!(cc("max-age=0060").max_age, Some(60));
        assert_eq!(cc("max-age=-1").max_age, Some(0));
        assert_eq!(cc("max-age=10, max-age=20").max_age, Some(10));
        assert_eq!(cc("max-age=99999999999999999999").max_age, Some(DELTA_MAX));
        assert!(!cc("").present);
    }

    // §3: storability.
    #[test]
    fn storable_by_status_and_directives() {
        let none = Directives::default();
        assert!(storable(true, &none, false, &facts(200, &none)).is_ok());
        assert!(storable(true, &none, false, &facts(404, &none)).is_ok());
        assert_eq!(
            storable(true, &none, false, &facts(302, &none)),
            Err(NotStored::NoFreshness)
        );
        let maxage = cc("max-age=10");
        assert!(storable(true, &none, false, &facts(302, &maxage)).is_ok());
        assert_eq!(
            storable(true, &none, false, &facts(206, &maxage)),
            Err(NotStored::Status)
        );
        assert_eq!(
            storable(false, &none, false, &facts(200, &maxage)),
            Err(NotStored::Method)
        );
        let f = ResponseFacts {
            has_expires: true,
            ..facts(500, &none)
        };
        assert!(storable(true, &none, false, &f).is_ok());
    }

    // §5.2.2.5, §5.2.1.5, §5.2.2.7: no-store and private.
    #[test]
    fn no_store_and_private_are_not_stored() {
        let none = Directives::default();
        assert_eq!(
            storable(true, &none, false, &facts(200, &cc("no-store, max-age=10"))),
            Err(NotStored::NoStore)
        );
        assert_eq!(
            storable(true, &cc("no-store"), false, &facts(200, &cc("max-age=10"))),
            Err(NotStored::NoStore)
        );
        assert_eq!(
            storable(true, &none, false, &facts(200, &cc("private, max-age=10"))),
            Err(NotStored::Private)
        );
        // The qualified form: stored, without the named fields.
        assert_eq!(
            storable(true, &none, false, &facts(200, &cc("private=\"x\""))),
            Ok(())
        );
    }

    // §5.2.2.3: must-understand overrides no-store for understood statuses.
    #[test]
    fn must_understand() {
        let none = Directives::default();
        let d = cc("must-understand, no-store, max-age=10");
        assert!(storable(true, &none, false, &facts(200, &d)).is_ok());
        assert_eq!(
            storable(true, &none, false, &facts(299, &d)),
            Err(NotStored::NoStore)
        );
    }

    // §3.5: Authorization.
    #[test]
    fn authorization_needs_public_s_maxage_or_must_revalidate() {
        let none = Directives::default();
        assert_eq!(
            storable(true, &none, true, &facts(200, &cc("max-age=10"))),
            Err(NotStored::Authorization)
        );
        for ok in ["public", "s-maxage=10", "must-revalidate, max-age=10"] {
            assert!(
                storable(true, &none, true, &facts(200, &cc(ok))).is_ok(),
                "{ok}"
            );
        }
    }

    // §4.1: Vary: * never matches.
    #[test]
    fn vary_star_is_not_stored() {
        let none = Directives::default();
        let f = ResponseFacts {
            vary_star: true,
            ..facts(200, &none)
        };
        assert_eq!(storable(true, &none, false, &f), Err(NotStored::VaryStar));
        assert_eq!(vary_names([&b"Accept, *"[..]].into_iter()), None);
        assert_eq!(
            vary_names([&b"Accept-Encoding, X-Foo"[..], b"accept-encoding"].into_iter()),
            Some(vec!["accept-encoding".to_string(), "x-foo".to_string()])
        );
    }

    // §4.2.1: the precedence of freshness sources.
    #[test]
    fn freshness_precedence() {
        let t = Times {
            date: Some(1000),
            expires: Some(Some(1100)),
            last_modified: Some(0),
        };
        assert_eq!(
            freshness_lifetime(200, &cc("s-maxage=5, max-age=50"), &t, 1000),
            5
        );
        assert_eq!(freshness_lifetime(200, &cc("max-age=50"), &t, 1000), 50);
        assert_eq!(
            freshness_lifetime(200, &Directives::default(), &t, 1000),
            100
        );
        // Expires in the past or invalid: already stale.
        let past = Times {
            expires: Some(Some(900)),
            ..t
        };
        assert_eq!(
            freshness_lifetime(200, &Directives::default(), &past, 1000),
            0
        );
        let invalid = Times {
            expires: Some(None),
            ..t
        };
        assert_eq!(
            freshness_lifetime(200, &Directives::default(), &invalid, 1000),
            0
        );
        // Without Date, the response time stands in.
        let nodate = Times { date: None, ..t };
        assert_eq!(
            freshness_lifetime(200, &Directives::default(), &nodate, 1050),
            50
        );
    }

    // §4.2.2: heuristic freshness only where allowed.
    #[test]
    fn heuristic_freshness() {
        let t = Times {
            date: Some(10_000),
            expires: None,
            last_modified: Some(0),
        };
        let none = Directives::default();
        assert_eq!(freshness_lifetime(200, &none, &t, 10_000), 1000);
        assert_eq!(freshness_lifetime(302, &none, &t, 10_000), 0);
        assert_eq!(freshness_lifetime(302, &cc("public"), &t, 10_000), 1000);
        let old = Times {
            date: Some(100_000_000),
            ..t
        };
        assert_eq!(freshness_lifetime(200, &none, &old, 0), HEURISTIC_MAX);
        let no_lm = Times {
            last_modified: None,
            ..t
        };
        assert_eq!(freshness_lifetime(200, &none, &no_lm, 10_000), 0);
    }

    // §4.2.3: age calculation.
    #[test]
    fn age_calculation() {
        // Age from the member plus the request's round trip.
        let a = AgeInputs {
            age_value: 30,
            date: Some(1000),
            request_time: 998,
            response_time: 1000,
        };
        assert_eq!(corrected_initial_age(&a), 32);
        // A Date in the past makes the apparent age.
        let a = AgeInputs {
            age_value: 0,
            date: Some(900),
            request_time: 1000,
            response_time: 1000,
        };
        assert_eq!(corrected_initial_age(&a), 100);
        // Clock skew (Date in the future) does not make a negative age.
        let a = AgeInputs {
            age_value: 0,
            date: Some(2000),
            request_time: 1000,
            response_time: 1000,
        };
        assert_eq!(corrected_initial_age(&a), 0);
        assert_eq!(current_age(32, 1000, 1010), 42);
    }

    fn stored(d: &Directives, lifetime: u64, age: u64) -> Stored<'_> {
        Stored {
            cc: d,
            lifetime,
            age,
        }
    }

    // §4.2 / §5.2.1: request directives.
    #[test]
    fn request_directives() {
        let none = Directives::default();
        let s = stored(&none, 100, 10);
        assert_eq!(usable(&none, false, &s), Usable::Fresh);
        assert_eq!(usable(&none, true, &s), Usable::Validate);
        assert_eq!(usable(&cc("no-cache"), true, &s), Usable::Validate);
        assert_eq!(usable(&cc("max-age=5"), false, &s), Usable::Validate);
        assert_eq!(usable(&cc("max-age=10"), false, &s), Usable::Fresh);
        assert_eq!(
            usable(&cc("max-age=0"), false, &stored(&none, 100, 0)),
            Usable::Validate
        );
        assert_eq!(usable(&cc("min-fresh=95"), false, &s), Usable::Validate);
        assert_eq!(usable(&cc("min-fresh=90"), false, &s), Usable::Fresh);
        let stale = stored(&none, 10, 15);
        assert_eq!(usable(&none, false, &stale), Usable::Validate);
        assert_eq!(
            usable(&cc("max-stale"), false, &stale),
            Usable::StaleAllowed
        );
        assert_eq!(
            usable(&cc("max-stale=5"), false, &stale),
            Usable::StaleAllowed
        );
        assert_eq!(usable(&cc("max-stale=4"), false, &stale), Usable::Validate);
    }

    // §5.2.2: response directives that restrict reuse.
    #[test]
    fn response_directives() {
        let none = Directives::default();
        let nc = cc("no-cache, max-age=100");
        assert_eq!(usable(&none, false, &stored(&nc, 100, 1)), Usable::Validate);
        // The qualified form: reused while fresh, without the named fields (`Entry::new`).
        let ncf = cc("no-cache=\"set-cookie\", max-age=100");
        assert_eq!(usable(&none, false, &stored(&ncf, 100, 1)), Usable::Fresh);
        for d in ["must-revalidate", "proxy-revalidate", "s-maxage=1"] {
            let d = cc(d);
            assert_eq!(
                usable(&cc("max-stale"), false, &stored(&d, 1, 5)),
                Usable::Validate
            );
            assert!(!stale_on_error(
                &cc("stale-if-error=100"),
                &stored(&d, 1, 5)
            ));
        }
        assert!(stale_on_error(
            &none,
            &stored(&cc("stale-if-error=10"), 1, 5)
        ));
        assert!(!stale_on_error(
            &none,
            &stored(&cc("stale-if-error=1"), 1, 5)
        ));
        assert!(!stale_on_error(&none, &stored(&none, 1, 5)));
        assert!(stale_when_disconnected(&stored(&none, 1, 5)));
        assert!(!stale_when_disconnected(&stored(
            &cc("must-revalidate"),
            1,
            5
        )));
        assert!(!stale_when_disconnected(&stored(&cc("no-cache"), 1, 5)));
    }

    // RFC 5861 §3: stale-while-revalidate.
    #[test]
    fn stale_while_revalidate_window() {
        let none = Directives::default();
        let swr = cc("max-age=1, stale-while-revalidate=10");
        assert!(stale_while_revalidate(&none, false, &stored(&swr, 1, 5)));
        assert!(!stale_while_revalidate(&none, false, &stored(&swr, 1, 12)));
        assert!(!stale_while_revalidate(&none, true, &stored(&swr, 1, 5)));
        assert!(!stale_while_revalidate(
            &cc("max-age=2"),
            false,
            &stored(&swr, 1, 5)
        ));
        let mr = cc("max-age=1, stale-while-revalidate=10, must-revalidate");
        assert!(!stale_while_revalidate(&none, false, &stored(&mr, 1, 5)));
    }

    // §3.2 / §4.3.4: 304 header update.
    #[test]
    fn header_update_replaces_fields_but_not_content_length() {
        let mut stored = HeaderMap::new();
        stored.insert("etag", "\"a\"".parse().unwrap());
        stored.insert("x-old", "1".parse().unwrap());
        stored.insert("content-length", "10".parse().unwrap());
        stored.append("x-multi", "a".parse().unwrap());
        stored.append("x-multi", "b".parse().unwrap());
        let mut upd = HeaderMap::new();
        upd.insert("x-old", "2".parse().unwrap());
        upd.insert("x-new", "3".parse().unwrap());
        upd.insert("content-length", "0".parse().unwrap());
        upd.append("x-multi", "c".parse().unwrap());
        update_headers(&mut stored, &upd);
        assert_eq!(stored["x-old"], "2");
        assert_eq!(stored["x-new"], "3");
        assert_eq!(stored["content-length"], "10");
        assert_eq!(stored["etag"], "\"a\"");
        assert_eq!(stored.get_all("x-multi").iter().count(), 1);
    }

    // RFC 9110 §13.1.2, §13.2.2, §8.8.3.2: conditional requests.
    #[test]
    fn conditionals() {
        assert!(weak_match(b"W/\"a\"", b"\"a\""));
        assert!(!weak_match(b"\"a\"", b"\"b\""));
        assert_eq!(
            etag_list(b"\"a,b\", W/\"c\""),
            vec![&b"\"a,b\""[..], b"W/\"c\""]
        );
        let etag = Some(&b"\"x\""[..]);
        assert!(not_modified(&[b"\"y\", W/\"x\""], None, etag, None, None));
        assert!(not_modified(&[b"*"], None, etag, None, None));
        assert!(!not_modified(&[b"\"y\""], Some(100), etag, Some(50), None));
        assert!(not_modified(&[], Some(100), None, Some(100), None));
        assert!(!not_modified(&[], Some(100), None, Some(101), None));
        assert!(not_modified(&[], Some(100), None, None, Some(90)));
        assert!(!not_modified(&[], None, etag, Some(1), None));
    }

    // §4.1: Vary normalisation.
    #[test]
    fn vary_values_normalised() {
        let a = vary_value("accept-encoding", [&b"gzip,  BR"[..]].into_iter());
        let b = vary_value("accept-encoding", [&b"gzip"[..], b"br"].into_iter());
        assert_eq!(a, b);
        assert_eq!(vary_value("x-foo", std::iter::empty()), None);
        assert_ne!(
            vary_value("x-foo", [&b"A"[..]].into_iter()),
            vary_value("x-foo", [&b"a"[..]].into_iter())
        );
    }

    // RFC 9213: CDN-Cache-Control.
    #[test]
    fn targeted_directives() {
        let t = |v: &str| targeted(std::iter::once(v.as_bytes()));
        assert_eq!(t("max-age=60").unwrap().max_age, Some(60));
        assert!(t("no-store").unwrap().no_store);
        assert_eq!(t("foobar, MaX-aGe=60").unwrap().max_age, Some(60));
        assert!(t("max-age=60, &&&&&").is_none());
        assert!(t("max-age=\"60\"").is_none());
        assert!(targeted(std::iter::empty()).is_none());
    }

    #[test]
    fn dates() {
        assert_eq!(http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
        assert_eq!(
            http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784111777)
        );
        assert_eq!(http_date(b"Sun Nov  6 08:49:37 1994"), Some(784111777));
        assert_eq!(http_date(b"0"), None);
        assert_eq!(http_date(b"SUN, 06 NOV 1994 08:49:37 gmt"), Some(784111777));
        assert_eq!(http_date(b"Mon Aug  8 02:01:18 2050"), Some(2543536878));
        assert_eq!(http_date(b"Thu Aug  8 02:01:18 2050"), Some(2543536878));
    }

    // §5.1: Age.
    #[test]
    fn age_values() {
        let age = |v: &[&str]| age_value(v.iter().map(|s| s.as_bytes()));
        assert_eq!(age(&["7200"]), 7200);
        assert_eq!(age(&["7200, 0"]), 7200);
        assert_eq!(age(&["0", "7200"]), 0);
        assert_eq!(age(&["7200;foo=bar"]), 7200);
        assert_eq!(age(&["7200.0"]), 0);
        assert_eq!(age(&["-7200"]), 0);
        assert_eq!(age(&["abc"]), 0);
        assert_eq!(age(&["99999999999"]), DELTA_MAX);
        assert_eq!(age(&[]), 0);
    }
}
