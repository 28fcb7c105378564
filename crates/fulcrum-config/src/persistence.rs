//! Checks of one `[[persistence]]` profile once its keys are read: the keys of each type, the
//! cookie name and the signing secrets. Which services may use a profile is checked by
//! `validate`.

use crate::error::did_you_mean;
use crate::reader::Cx;
use crate::schema::{radius_attribute, Persistence, PersistenceKind, RADIUS_ATTRIBUTES};

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
