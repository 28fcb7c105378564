//! Content switching: the `[[virtual_service.rule]]` list compiled once at load.
//!
//! Rules are checked in order and the first match wins, but a request does not walk the list.
//! The conditions that discriminate most (host, path, method) are indexed: exact hosts and
//! wildcard suffixes in hash maps, exact paths in a hash map, path prefixes in a byte trie, path
//! regexes in one multi-pattern automaton. Each index yields a bit set of the rules whose own
//! condition of that kind holds (rules without one are always in); their intersection is the
//! candidate set, and only candidates have their remaining conditions (headers, cookies, query,
//! user agent, source) checked, lowest index first. Hundreds of host or path rules cost a few
//! hash lookups and one pass over the path.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use fulcrum_config::{HeaderEdits, Rule, RuleAction};
use ipnet::IpNet;
use regex::bytes::Regex;
use regex_automata::{Input, MatchKind, PatternSet};

use crate::head::RequestHead;

/// A set of rule indices.
#[derive(Debug, Clone, Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(words: usize) -> Bits {
        Bits(vec![0; words])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
}

/// A header edit list, with names lower-cased and checked at load.
#[derive(Debug, Clone, Default)]
pub struct Edits {
    pub set: Vec<(http::HeaderName, http::HeaderValue)>,
    pub add: Vec<(http::HeaderName, http::HeaderValue)>,
    pub remove: Vec<http::HeaderName>,
}

impl Edits {
    fn compile(e: &HeaderEdits) -> Result<Edits, String> {
        let name = |n: &str| {
            http::HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| format!("{n:?} is not a header field name"))
        };
        let value = |v: &str| {
            http::HeaderValue::from_str(v)
                .map_err(|_| format!("{v:?} is not a valid header field value"))
        };
        Ok(Edits {
            set: e
                .set
                .0
                .iter()
                .map(|(n, v)| Ok((name(n)?, value(v)?)))
                .collect::<Result<_, String>>()?,
            add: e
                .add
                .0
                .iter()
                .map(|(n, v)| Ok((name(n)?, value(v)?)))
                .collect::<Result<_, String>>()?,
            remove: e
                .remove
                .iter()
                .map(|n| name(n))
                .collect::<Result<_, String>>()?,
        })
    }

    /// Whether a field of this (any-case) name is removed or replaced by the edits.
    pub fn drops(&self, field: &[u8]) -> bool {
        self.remove
            .iter()
            .chain(self.set.iter().map(|(n, _)| n))
            .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(field))
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// One piece of a redirect location template.
#[derive(Debug, Clone)]
enum Piece {
    Literal(Vec<u8>),
    Scheme,
    Host,
    Path,
    /// `$query` (a `?` the template wrote right before it is dropped: the expansion adds one).
    Query,
}

/// A redirect location with `$scheme`, `$host`, `$path` and `$query` substituted per request.
#[derive(Debug, Clone)]
pub struct Template(Vec<Piece>);

impl Template {
    pub fn parse(t: &str) -> Template {
        let mut pieces = Vec::new();
        let mut lit = Vec::new();
        let mut rest = t.as_bytes();
        while !rest.is_empty() {
            let var = [
                (&b"$scheme"[..], Piece::Scheme),
                (b"$host", Piece::Host),
                (b"$path", Piece::Path),
                (b"$query", Piece::Query),
            ]
            .into_iter()
            .find(|(name, _)| rest.starts_with(name));
            match var {
                Some((name, piece)) => {
                    if matches!(piece, Piece::Query) && lit.last() == Some(&b'?') {
                        lit.pop();
                    }
                    if !lit.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut lit)));
                    }
                    pieces.push(piece);
                    rest = &rest[name.len()..];
                }
                None => {
                    lit.push(rest[0]);
                    rest = &rest[1..];
                }
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Literal(lit));
        }
        Template(pieces)
    }

    /// The location for a request. `$query` expands to the query string without `?`; a `?` is
    /// written before it when it is not empty (whether or not the template has one there).
    pub fn expand(&self, scheme: &str, req: &RequestHead) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        for p in &self.0 {
            match p {
                Piece::Literal(l) => out.extend_from_slice(l),
                Piece::Scheme => out.extend_from_slice(scheme.as_bytes()),
                Piece::Host => out.extend_from_slice(req.host_name().unwrap_or_default()),
                Piece::Path => out.extend_from_slice(req.path()),
                Piece::Query => {
                    if let Some(q) = req.query().filter(|q| !q.is_empty()) {
                        out.push(b'?');
                        out.extend_from_slice(q);
                    }
                }
            }
        }
        out
    }
}

/// What a matching rule does.
#[derive(Debug, Clone)]
pub enum Action {
    /// Forward to the service's target pool with this index.
    Pool(usize),
    Redirect {
        location: Template,
        status: u16,
    },
    Respond {
        status: u16,
        body: Bytes,
    },
    Drop,
}

/// A rule after compilation.
#[derive(Debug)]
pub struct CompiledRule {
    pub name: Option<Arc<str>>,
    header: Vec<(Vec<u8>, Regex)>,
    cookie: Vec<(Vec<u8>, Regex)>,
    query: Vec<(Vec<u8>, Regex)>,
    user_agent: Option<Regex>,
    source: Vec<IpNet>,
    pub action: Action,
    pub request_headers: Option<Edits>,
    pub response_headers: Option<Edits>,
    pub rewrite: Option<(Regex, Vec<u8>)>,
}

/// A byte trie of path prefixes; each node may carry the rules whose prefix ends there.
#[derive(Debug, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    rules: Option<Bits>,
}

impl Trie {
    fn insert(&mut self, prefix: &[u8], rule: usize, words: usize) {
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut at = 0usize;
        for &b in prefix {
            let next = match self.nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                Ok(i) => self.nodes[at].children[i].1 as usize,
                Err(i) => {
                    let id = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    self.nodes[at].children.insert(i, (b, id as u32));
                    id
                }
            };
            at = next;
        }
        self.nodes[at]
            .rules
            .get_or_insert_with(|| Bits::new(words))
            .set(rule);
    }

    fn collect(&self, path: &[u8], into: &mut [u64]) {
        let Some(mut node) = self.nodes.first() else {
            return;
        };
        let mut i = 0;
        loop {
            if let Some(b) = &node.rules {
                or(into, &b.0);
            }
            let Some(&c) = path.get(i) else { return };
            match node.children.binary_search_by_key(&c, |c| c.0) {
                Ok(k) => node = &self.nodes[node.children[k].1 as usize],
                Err(_) => return,
            }
            i += 1;
        }
    }
}

fn or(into: &mut [u64], from: &[u64]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a |= *b;
    }
}

fn and(into: &mut [u64], from: &[u64]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a &= *b;
    }
}

/// The compiled rule list of a virtual service.
#[derive(Debug, Default)]
pub struct RuleSet {
    rules: Vec<CompiledRule>,
    words: usize,
    host_exact: HashMap<Vec<u8>, Bits>,
    host_wild: HashMap<Vec<u8>, Bits>,
    host_any: Bits,
    path_exact: HashMap<Vec<u8>, Bits>,
    path_prefix: Trie,
    path_regex: Option<(regex_automata::meta::Regex, Vec<usize>)>,
    path_any: Bits,
    /// Whether any rule looks at the path (else normalising it is skipped).
    uses_path: bool,
    method: HashMap<Vec<u8>, Bits>,
    method_any: Bits,
}

thread_local! {
    static PATTERNS: RefCell<PatternSet> = RefCell::new(PatternSet::new(0));
}

fn bytes_regex(pattern: &str) -> Result<Regex, String> {
    regex::bytes::RegexBuilder::new(pattern)
        .size_limit(1 << 22)
        .build()
        .map_err(|e| format!("invalid regular expression {pattern:?}: {e}"))
}

impl RuleSet {
    /// Compiles `rules`; `pool_index` maps a pool name to the service's target index.
    pub fn compile(
        rules: &[Rule],
        pool_index: &dyn Fn(&str) -> Option<usize>,
    ) -> Result<RuleSet, String> {
        let n = rules.len();
        let words = n.div_ceil(64).max(1);
        let mut set = RuleSet {
            words,
            host_any: Bits::new(words),
            path_any: Bits::new(words),
            method_any: Bits::new(words),
            ..RuleSet::default()
        };
        let mut regexes: Vec<String> = Vec::new();
        let mut regex_rules = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let at = |what: &str| {
                format!(
                    "rule {}{}: {what}",
                    i,
                    r.name
                        .as_deref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                )
            };
            match &r.host {
                None => set.host_any.set(i),
                Some(h) => {
                    let h = h.to_ascii_lowercase();
                    let h = h.strip_suffix('.').unwrap_or(&h);
                    match h.strip_prefix('*') {
                        Some(suffix) => set
                            .host_wild
                            .entry(suffix.as_bytes().to_vec())
                            .or_insert_with(|| Bits::new(words))
                            .set(i),
                        None => set
                            .host_exact
                            .entry(h.as_bytes().to_vec())
                            .or_insert_with(|| Bits::new(words))
                            .set(i),
                    }
                }
            }
            if let Some(p) = &r.path {
                set.uses_path = true;
                set.path_exact
                    .entry(p.as_bytes().to_vec())
                    .or_insert_with(|| Bits::new(words))
                    .set(i);
            } else if let Some(p) = &r.path_prefix {
                set.uses_path = true;
                set.path_prefix.insert(p.as_bytes(), i, words);
            } else if let Some(p) = &r.path_regex {
                set.uses_path = true;
                regexes.push(p.clone());
                regex_rules.push(i);
            } else {
                set.path_any.set(i);
            }
            if r.method.is_empty() {
                set.method_any.set(i);
            } else {
                for m in &r.method {
                    set.method
                        .entry(m.as_bytes().to_vec())
                        .or_insert_with(|| Bits::new(words))
                        .set(i);
                }
            }
            let regex_map = |m: &fulcrum_config::KeyValues<String>, lower: bool| {
                m.0.iter()
                    .map(|(k, v)| {
                        let k = if lower {
                            k.to_ascii_lowercase()
                        } else {
                            k.clone()
                        };
                        Ok((k.into_bytes(), bytes_regex(v).map_err(|e| at(&e))?))
                    })
                    .collect::<Result<Vec<_>, String>>()
            };
            let action = match &r.action {
                RuleAction::Pool(p) => {
                    Action::Pool(pool_index(p).ok_or_else(|| at(&format!("no pool named {p:?}")))?)
                }
                RuleAction::Redirect { location, status } => Action::Redirect {
                    location: Template::parse(location),
                    status: *status,
                },
                RuleAction::Respond { status, body } => Action::Respond {
                    status: *status,
                    body: Bytes::from(body.clone()),
                },
                RuleAction::Drop => Action::Drop,
            };
            set.rules.push(CompiledRule {
                name: r.name.as_deref().map(Arc::from),
                header: regex_map(&r.header, true)?,
                cookie: regex_map(&r.cookie, false)?,
                query: regex_map(&r.query, false)?,
                user_agent: r
                    .user_agent
                    .as_deref()
                    .map(bytes_regex)
                    .transpose()
                    .map_err(|e| at(&e))?,
                source: r.source.clone(),
                action,
                request_headers: r
                    .request_headers
                    .as_ref()
                    .map(Edits::compile)
                    .transpose()
                    .map_err(|e| at(&e))?
                    .filter(|e| !e.is_empty()),
                response_headers: r
                    .response_headers
                    .as_ref()
                    .map(Edits::compile)
                    .transpose()
                    .map_err(|e| at(&e))?
                    .filter(|e| !e.is_empty()),
                rewrite: match &r.rewrite_path {
                    Some(rw) => Some((
                        bytes_regex(&rw.regex).map_err(|e| at(&e))?,
                        rw.replace.as_bytes().to_vec(),
                    )),
                    None => None,
                },
            });
        }
        if !regexes.is_empty() {
            let re = regex_automata::meta::Regex::builder()
                .configure(regex_automata::meta::Regex::config().match_kind(MatchKind::All))
                .build_many(&regexes)
                .map_err(|e| format!("path_regex: {e}"))?;
            set.path_regex = Some((re, regex_rules));
        }
        Ok(set)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn get(&self, i: usize) -> Option<&CompiledRule> {
        self.rules.get(i)
    }

    /// The first rule that matches the request, by index.
    pub fn find(&self, req: &RequestHead, client: IpAddr) -> Option<usize> {
        if self.rules.is_empty() {
            return None;
        }
        let mut stack = [0u64; 8];
        let mut heap;
        let cand: &mut [u64] = if self.words <= stack.len() {
            &mut stack[..self.words]
        } else {
            heap = vec![0u64; self.words];
            &mut heap
        };

        cand.copy_from_slice(&self.host_any.0);
        if let Some(host) = req.host_name() {
            let mut lower = [0u8; 256];
            let n = host.len().min(lower.len());
            for (d, s) in lower.iter_mut().zip(&host[..n]) {
                *d = s.to_ascii_lowercase();
            }
            let host = &lower[..n];
            if let Some(b) = self.host_exact.get(host) {
                or(cand, &b.0);
            }
            if !self.host_wild.is_empty() {
                for (i, _) in host.iter().enumerate().filter(|(_, c)| **c == b'.') {
                    if let Some(b) = self.host_wild.get(&host[i..]) {
                        or(cand, &b.0);
                    }
                }
            }
        }

        if self.uses_path {
            let mut paths = [0u64; 8];
            let mut heap_paths;
            let pbits: &mut [u64] = if self.words <= paths.len() {
                &mut paths[..self.words]
            } else {
                heap_paths = vec![0u64; self.words];
                &mut heap_paths
            };
            pbits.copy_from_slice(&self.path_any.0);
            let path = normalize_path(req.path());
            if let Some(b) = self.path_exact.get(path.as_ref()) {
                or(pbits, &b.0);
            }
            self.path_prefix.collect(&path, pbits);
            if let Some((re, map)) = &self.path_regex {
                PATTERNS.with(|ps| {
                    let mut ps = ps.borrow_mut();
                    if ps.capacity() < re.pattern_len() {
                        *ps = PatternSet::new(re.pattern_len());
                    }
                    ps.clear();
                    re.which_overlapping_matches(&Input::new(path.as_ref()), &mut ps);
                    for p in ps.iter() {
                        if let Some(&r) = map.get(p.as_usize()) {
                            pbits[r / 64] |= 1 << (r % 64);
                        }
                    }
                });
            }
            and(cand, pbits);
        }

        if !self.method.is_empty() {
            let mut m = [0u64; 8];
            let mut heap_m;
            let mbits: &mut [u64] = if self.words <= m.len() {
                &mut m[..self.words]
            } else {
                heap_m = vec![0u64; self.words];
                &mut heap_m
            };
            mbits.copy_from_slice(&self.method_any.0);
            if let Some(b) = self.method.get(req.method_bytes()) {
                or(mbits, &b.0);
            }
            and(cand, mbits);
        }

        for (w, word) in cand.iter().enumerate() {
            let mut bits = *word;
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self
                    .rules
                    .get(i)
                    .is_some_and(|r| r.rest_matches(req, client))
                {
                    return Some(i);
                }
            }
        }
        None
    }
}

impl CompiledRule {
    /// The conditions no index covers.
    fn rest_matches(&self, req: &RequestHead, client: IpAddr) -> bool {
        if !self.source.is_empty() {
            let ip = match client {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
                v4 => v4,
            };
            if !self.source.iter().any(|n| n.contains(&ip)) {
                return false;
            }
        }
        if let Some(re) = &self.user_agent {
            if !req
                .first_value_named(b"user-agent")
                .is_some_and(|ua| re.is_match(ua))
            {
                return false;
            }
        }
        for (name, re) in &self.header {
            if !req.values_named(name).any(|v| re.is_match(v)) {
                return false;
            }
        }
        for (name, re) in &self.cookie {
            if !req.cookie(name).is_some_and(|v| re.is_match(v)) {
                return false;
            }
        }
        for (name, re) in &self.query {
            let value = req.query().and_then(|q| query_param(q, name));
            if !value.is_some_and(|v| re.is_match(&v)) {
                return false;
            }
        }
        true
    }

    /// The path to forward after `rewrite_path`, if this rule rewrites.
    pub fn rewritten_path(&self, req: &RequestHead) -> Option<Vec<u8>> {
        let (re, replace) = self.rewrite.as_ref()?;
        let path = normalize_path(req.path());
        Some(re.replace(&path, &replace[..]).into_owned())
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Percent-decodes a query component (`+` is a space).
fn decode_component(s: &[u8]) -> Cow<'_, [u8]> {
    if !s.iter().any(|b| *b == b'%' || *b == b'+') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                s.get(i + 1).and_then(|b| hex(*b)),
                s.get(i + 2).and_then(|b| hex(*b)),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

/// The first value of query parameter `name`, percent-decoded.
pub fn query_param<'a>(query: &'a [u8], name: &[u8]) -> Option<Cow<'a, [u8]>> {
    query.split(|b| *b == b'&').find_map(|pair| {
        let (k, v) = match memchr::memchr(b'=', pair) {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        (decode_component(k).as_ref() == name).then(|| decode_component(v))
    })
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The path rules match against: percent-encoded unreserved characters decoded (`%61` → `a`),
/// repeated slashes merged and dot segments resolved, so that `/%61dmin/`, `//admin/` and
/// `/x/../admin/` cannot slip past a rule on `/admin/` to a member that normalises them. Other
/// percent-encodings (`%2F`) stay as they are. Most paths need nothing and are borrowed.
pub fn normalize_path(path: &[u8]) -> Cow<'_, [u8]> {
    let needs = path
        .windows(2)
        .any(|w| w[0] == b'%' || w == b"//" || (w[0] == b'/' && w[1] == b'.'))
        || path.last() == Some(&b'%');
    if !needs {
        return Cow::Borrowed(path);
    }
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'%' {
            if let (Some(h), Some(l)) = (
                path.get(i + 1).and_then(|b| hex(*b)),
                path.get(i + 2).and_then(|b| hex(*b)),
            ) {
                let c = h * 16 + l;
                if unreserved(c) {
                    decoded.push(c);
                } else {
                    decoded.extend_from_slice(&[
                        b'%',
                        path[i + 1].to_ascii_uppercase(),
                        path[i + 2].to_ascii_uppercase(),
                    ]);
                }
                i += 3;
                continue;
            }
        }
        decoded.push(b);
        i += 1;
    }
    // Resolve segments (RFC 3986 §5.2.4), merging empty ones.
    let mut segments: Vec<&[u8]> = Vec::new();
    let trailing = decoded.ends_with(b"/") || decoded.ends_with(b"/.") || decoded.ends_with(b"/..");
    for seg in decoded.split(|b| *b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = Vec::with_capacity(decoded.len());
    for s in &segments {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if trailing || out.is_empty() {
        out.push(b'/');
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::{Limits, Parse};
    use fulcrum_config::KeyValues;

    fn req(raw: &str) -> RequestHead {
        let mut h = RequestHead::with_buffer(raw.as_bytes().to_vec());
        assert_eq!(h.parse(&Limits::default()).unwrap(), Parse::Complete);
        h
    }

    fn rule(f: impl FnOnce(&mut Rule)) -> Rule {
        let mut r = Rule {
            action: RuleAction::Pool("p".into()),
            ..Rule::default()
        };
        f(&mut r);
        r
    }

    fn set(rules: Vec<Rule>) -> RuleSet {
        RuleSet::compile(&rules, &|_| Some(0)).unwrap()
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn first_match_wins_over_indexes() {
        let s = set(vec![
            rule(|r| r.host = Some("api.example.com".into())),
            rule(|r| r.host = Some("*.example.com".into())),
            rule(|r| r.path_prefix = Some("/static/".into())),
            rule(|r| r.path = Some("/exact".into())),
            rule(|r| r.path_regex = Some("^/img/.*\\.png$".into())),
            rule(|r| r.method = vec!["DELETE".into()]),
            rule(|r| {
                r.header = KeyValues(vec![("X-Env".into(), "^canary$".into())]);
            }),
            rule(|r| r.cookie = KeyValues(vec![("beta".into(), "^1$".into())])),
            rule(|r| r.query = KeyValues(vec![("v".into(), "^2$".into())])),
            rule(|r| r.user_agent = Some("(?i)mobile".into())),
            rule(|r| r.source = vec!["10.0.0.0/8".parse().unwrap()]),
        ]);
        let find = |raw: &str| s.find(&req(raw), LOCAL);
        assert_eq!(
            find("GET / HTTP/1.1\r\nHost: API.example.com.\r\n\r\n"),
            Some(0)
        );
        assert_eq!(
            find("GET / HTTP/1.1\r\nHost: a.b.example.com:80\r\n\r\n"),
            Some(1)
        );
        assert_eq!(find("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"), None);
        assert_eq!(find("GET /static/x HTTP/1.1\r\nHost: z\r\n\r\n"), Some(2));
        assert_eq!(find("GET /static HTTP/1.1\r\nHost: z\r\n\r\n"), None);
        assert_eq!(find("GET /exact?q HTTP/1.1\r\nHost: z\r\n\r\n"), Some(3));
        assert_eq!(find("GET /exact/ HTTP/1.1\r\nHost: z\r\n\r\n"), None);
        assert_eq!(
            find("GET /img/a/b.png HTTP/1.1\r\nHost: z\r\n\r\n"),
            Some(4)
        );
        assert_eq!(find("DELETE /x HTTP/1.1\r\nHost: z\r\n\r\n"), Some(5));
        assert_eq!(
            find("GET / HTTP/1.1\r\nHost: z\r\nx-env: canary\r\n\r\n"),
            Some(6)
        );
        assert_eq!(
            find("GET / HTTP/1.1\r\nHost: z\r\nCookie: a=0; beta=1\r\n\r\n"),
            Some(7)
        );
        assert_eq!(find("GET /?a=1&v=%32 HTTP/1.1\r\nHost: z\r\n\r\n"), Some(8));
        assert_eq!(
            find("GET / HTTP/1.1\r\nHost: z\r\nUser-Agent: X Mobile Y\r\n\r\n"),
            Some(9)
        );
        assert_eq!(
            s.find(
                &req("GET / HTTP/1.1\r\nHost: z\r\n\r\n"),
                "10.1.2.3".parse().unwrap()
            ),
            Some(10)
        );
        assert_eq!(
            s.find(
                &req("GET / HTTP/1.1\r\nHost: z\r\n\r\n"),
                "::ffff:10.1.2.3".parse().unwrap()
            ),
            Some(10)
        );
        assert_eq!(find("GET / HTTP/1.1\r\nHost: z\r\n\r\n"), None);
    }

    #[test]
    fn all_conditions_of_a_rule_must_hold() {
        let s = set(vec![rule(|r| {
            r.host = Some("a.com".into());
            r.path_prefix = Some("/v1/".into());
            r.method = vec!["GET".into()];
        })]);
        assert_eq!(
            s.find(&req("GET /v1/x HTTP/1.1\r\nHost: a.com\r\n\r\n"), LOCAL),
            Some(0)
        );
        assert_eq!(
            s.find(&req("POST /v1/x HTTP/1.1\r\nHost: a.com\r\n\r\n"), LOCAL),
            None
        );
        assert_eq!(
            s.find(&req("GET /v2/x HTTP/1.1\r\nHost: a.com\r\n\r\n"), LOCAL),
            None
        );
        assert_eq!(
            s.find(&req("GET /v1/x HTTP/1.1\r\nHost: b.com\r\n\r\n"), LOCAL),
            None
        );
    }

    #[test]
    fn hundreds_of_rules() {
        let mut rules: Vec<Rule> = (0..300)
            .map(|i| match i % 3 {
                0 => rule(|r| r.host = Some(format!("h{i}.example.com"))),
                1 => rule(|r| r.path_prefix = Some(format!("/p{i}/"))),
                _ => rule(|r| r.path_regex = Some(format!("^/r{i}/[0-9]+$"))),
            })
            .collect();
        rules.push(rule(|r| r.path_prefix = Some("/".into())));
        let s = set(rules);
        assert_eq!(
            s.find(&req("GET /r299/42 HTTP/1.1\r\nHost: x\r\n\r\n"), LOCAL),
            Some(299)
        );
        assert_eq!(
            s.find(&req("GET /p298/ HTTP/1.1\r\nHost: x\r\n\r\n"), LOCAL),
            Some(298)
        );
        assert_eq!(
            s.find(
                &req("GET /z HTTP/1.1\r\nHost: h297.example.com\r\n\r\n"),
                LOCAL
            ),
            Some(297)
        );
        assert_eq!(
            s.find(&req("GET /z HTTP/1.1\r\nHost: x\r\n\r\n"), LOCAL),
            Some(300)
        );
    }

    #[test]
    fn normalised_paths() {
        for (raw, want) in [
            ("/a/b", "/a/b"),
            ("/%61dmin/", "/admin/"),
            ("//admin//x", "/admin/x"),
            ("/x/../admin/", "/admin/"),
            ("/x/%2e%2e/admin", "/admin"),
            ("/a%2fb", "/a%2Fb"),
            ("/..", "/"),
            ("/a/.", "/a/"),
            ("/%", "/%"),
        ] {
            assert_eq!(
                normalize_path(raw.as_bytes()).as_ref(),
                want.as_bytes(),
                "{raw}"
            );
        }
    }

    #[test]
    fn templates() {
        let r = req("GET /a/b?x=1 HTTP/1.1\r\nHost: www.example.com:8080\r\n\r\n");
        let e = |t: &str| String::from_utf8(Template::parse(t).expand("http", &r)).unwrap();
        assert_eq!(
            e("https://$host$path$query"),
            "https://www.example.com/a/b?x=1"
        );
        assert_eq!(
            e("https://$host$path?$query"),
            "https://www.example.com/a/b?x=1"
        );
        assert_eq!(e("$scheme://new.example$path"), "http://new.example/a/b");
        let r = req("GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(
            String::from_utf8(Template::parse("https://$host$path?$query").expand("http", &r))
                .unwrap(),
            "https://h/a"
        );
    }

    #[test]
    fn rewrites() {
        let s = set(vec![rule(|r| {
            r.rewrite_path = Some(fulcrum_config::Rewrite {
                regex: "^/v1/(.*)$".into(),
                replace: "/$1".into(),
            })
        })]);
        let r = req("GET /v1/users?x HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(s.get(0).unwrap().rewritten_path(&r).unwrap(), b"/users");
    }
}
