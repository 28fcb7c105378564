//! Checks of one `[[persistence]]` profile once its keys are read: the keys of each type, the
//! cookie name and the signing secrets. Which services may use a profile is checked by
//! `validate`.

use crate::error::did_you_mean;
use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::{read_table, OneOrMany};
use std::time::Duration;

/// Checks of the profile at `base` (such as `persistence[0]`).
pub(crate) fn check(base: &str, p: &Persistence, cx: &mut Cx<'_>) {
    let at = base;
    match p.kind {
        PersistenceKind::Header if p.header.is_none() => cx.error_path(
            at,
            "type header needs `header`: the request header to route by",
        ),
        PersistenceKind::Radius if p.attribute.is_none() => {
            cx.error_path(at, "type radius needs `attribute`, e.g. \"User-Name\"")
        }
        _ => {}
    }
    if let Some(a) = p.attribute.as_deref() {
        if p.kind == PersistenceKind::Radius && radius_attribute(a).is_none() {
            let names: Vec<&str> = RADIUS_ATTRIBUTES.iter().map(|(n, _)| *n).collect();
            let hint = did_you_mean(a, names.iter().copied())
                .map(|m| format!(" (did you mean {m:?}?)"))
                .unwrap_or_default();
            cx.error_path(
                &format!("{at}.attribute"),
                format!(
                    "unknown RADIUS attribute {a:?}{hint}; expected one of {} or a type number from 1 to 255",
                    names.join(", ")
                ),
            );
        }
    }
    if p.kind != PersistenceKind::Radius && cx.written(&format!("{at}.malformed")) {
        cx.error_path(
            &format!("{at}.malformed"),
            format!(
                "`malformed` applies to type radius; this profile is {}",
                p.kind
            ),
        );
    }
    if p.cookie.is_empty()
        || !p
            .cookie
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b))
    {
        cx.error_path(
            &format!("{at}.cookie"),
            format!("{:?} is not a valid cookie name", p.cookie),
        );
    }
    let cookie_kind = matches!(
        p.kind,
        PersistenceKind::CookieInsert | PersistenceKind::CookieRewrite
    );
    if p.secret.is_some() && !cookie_kind {
        cx.error_path(
            &format!("{at}.secret"),
            format!(
                "`secret` signs cookie_insert and cookie_rewrite cookies; this profile is {}",
                p.kind
            ),
        );
    }
    if p.secret
        .iter()
        .chain(&p.previous_secrets)
        .any(|s| s.len() < 16)
    {
        cx.error_path(
            &format!("{at}.secret"),
            "too short: use at least 16 characters (e.g. `openssl rand -hex 32`)",
        );
    }
    if p.same_site.is_some() && p.kind != PersistenceKind::CookieInsert {
        cx.error_path(
            &format!("{at}.same_site"),
            format!(
                "`same_site` applies to cookie_insert; this profile is {}",
                p.kind
            ),
        );
    }
    if p.max_entries == 0 {
        cx.error_path(&format!("{at}.max_entries"), "must be at least 1");
    }
}

string_enum!(PersistenceKind {
    SourceIp = "source_ip",
    CookieInsert = "cookie_insert",
    CookiePassive = "cookie_passive",
    CookieRewrite = "cookie_rewrite",
    Header = "header",
    Radius = "radius",
    RtspSession = "rtsp_session",
});

#[derive(Debug, Clone)]
pub struct Persistence {
    pub name: String,
    pub kind: PersistenceKind,
    /// Idle expiry of table entries; for cookie_insert the cookie's lifetime (None: session cookie).
    pub timeout: Option<Duration>,
    pub cookie: String,
    pub header: Option<String>,
    pub attribute: Option<String>,
    pub source_mask: u8,
    pub source_mask_v6: u8,
    /// Bound on the entries of a persistence table; the least recently used go first.
    pub max_entries: u64,
    /// cookie_insert / cookie_rewrite: the key that signs the member id in the cookie. Without
    /// it the process uses the secret file beside `admin.token_file` (generated once, kept
    /// across restarts).
    pub secret: Option<String>,
    /// Older keys whose cookies are still accepted (and re-issued with `secret`): the rest of
    /// `secret` when it is an array, newest first (rotation).
    pub previous_secrets: Vec<String>,
    /// cookie_insert: the cookie's `SameSite` attribute (none written when unset).
    pub same_site: Option<crate::http::SameSite>,
    /// radius: what happens to a datagram that is not a well-formed RADIUS packet.
    pub malformed: Malformed,
}

string_enum!(
    /// What a radius-persistent udp service does with a datagram that is not a well-formed
    /// RADIUS packet (or lacks the attribute): schedule it like any datagram, or drop it.
    Malformed {
        Schedule = "schedule",
        Drop = "drop",
    }
);

/// RADIUS attribute names Fulcrum knows (RFC 2865, 2866, 2869, 3162), with their type numbers.
pub const RADIUS_ATTRIBUTES: &[(&str, u8)] = &[
    ("User-Name", 1),
    ("NAS-IP-Address", 4),
    ("NAS-Port", 5),
    ("Framed-IP-Address", 8),
    ("Class", 25),
    ("Called-Station-Id", 30),
    ("Calling-Station-Id", 31),
    ("NAS-Identifier", 32),
    ("Acct-Session-Id", 44),
    ("Acct-Multi-Session-Id", 50),
    ("NAS-Port-Id", 87),
    ("Framed-Interface-Id", 96),
    ("Framed-IPv6-Prefix", 97),
];

/// The type number of a RADIUS attribute given by name (case-insensitive, as in the table above)
/// or as a number from 1 to 255.
pub fn radius_attribute(name: &str) -> Option<u8> {
    if let Ok(n) = name.parse::<u8>() {
        return (n != 0).then_some(n);
    }
    RADIUS_ATTRIBUTES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t)| *t)
}

impl Persistence {
    /// Idle expiry of the entries of a persistence table.
    pub fn table_timeout(&self) -> Duration {
        self.timeout.unwrap_or(Duration::from_secs(30 * 60))
    }
}

impl FromNode for Persistence {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let kind = t.req(cx, "type");
            let source_mask = t.opt(cx, "source_mask").unwrap_or(32);
            let source_mask_v6 = t.opt(cx, "source_mask_v6").unwrap_or(128);
            if source_mask > 32 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.source_mask", t.path()),
                    format!("{source_mask} is not an IPv4 prefix length (0 to 32)"),
                );
            }
            if source_mask_v6 > 128 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.source_mask_v6", t.path()),
                    format!("{source_mask_v6} is not an IPv6 prefix length (0 to 128)"),
                );
            }
            let secrets: Option<OneOrMany<String>> = t.opt(cx, "secret");
            let value = Persistence {
                timeout: t.opt(cx, "timeout"),
                cookie: t.opt(cx, "cookie").unwrap_or_else(|| "FULCRUM".to_string()),
                header: t.opt(cx, "header"),
                attribute: t.opt(cx, "attribute"),
                source_mask,
                source_mask_v6,
                max_entries: t.opt(cx, "max_entries").unwrap_or(1_000_000),
                malformed: t.opt(cx, "malformed").unwrap_or(Malformed::Schedule),
                secret: secrets.as_ref().and_then(|s| s.0.first().cloned()),
                previous_secrets: secrets
                    .map(|s| s.0.into_iter().skip(1).collect())
                    .unwrap_or_default(),
                same_site: t.opt(cx, "same_site"),
                name: name?,
                kind: kind?,
            };
            crate::persistence::check(t.path(), &value, cx);
            Some(value)
        })
    }
}
