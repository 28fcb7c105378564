//! Checks of the `[gslb]` table, its sites and its names once they are read. References
//! (regions, monitors, the local site, the names' sites, services' `gslb_redirect`) and the
//! exchange's listening address are checked by `validate`.

use crate::reader::Cx;
use crate::schema::{Gslb, GslbName, Site};

/// Checks of `[gslb]`'s own keys (at `base`, "gslb").
pub(crate) fn check(base: &str, g: &Gslb, cx: &mut Cx<'_>) {
    for (j, k) in g.keys.iter().enumerate() {
        if k.len() < 16 {
            cx.error_path(
                &format!("{base}.key[{j}]"),
                "a key must be at least 16 characters long",
            );
        }
    }
    if g.interval.is_zero() {
        cx.error_path(&format!("{base}.interval"), "must be longer than 0s");
    }
    if g.stale_after <= g.interval {
        cx.error_path(
            &format!("{base}.stale_after"),
            format!(
                "{} must be longer than the report interval ({})",
                humantime::format_duration(g.stale_after),
                humantime::format_duration(g.interval)
            ),
        );
    }
    if g.local_site.is_none() && g.listen.is_some() {
        cx.error_path(
            &format!("{base}.listen"),
            "the site state exchange needs gslb.local_site: the site this instance runs at",
        );
    }
}

/// Checks of the site at `base` (such as `gslb.site[0]`).
pub(crate) fn check_site(base: &str, s: &Site, cx: &mut Cx<'_>) {
    if s.addresses.is_empty() {
        cx.error_path(
            &format!("{base}.addresses"),
            "at least one address is required",
        );
    }
    if let Some(h) = &s.redirect_host {
        if let Err(why) = check_redirect_host(h) {
            cx.error_path(&format!("{base}.redirect_host"), why);
        }
    }
    if s.weight > crate::MAX_WEIGHT {
        cx.error_path(
            &format!("{base}.weight"),
            format!(
                "{} is too large; expected 0 to {}",
                s.weight,
                crate::MAX_WEIGHT
            ),
        );
    }
}

/// Checks of the name at `base` (such as `gslb.name[0]`).
pub(crate) fn check_name(base: &str, n: &GslbName, cx: &mut Cx<'_>) {
    if !n.fqdn.ends_with('.') {
        cx.error_path(
            &format!("{base}.fqdn"),
            format!("{:?} must be fully qualified, ending in a dot", n.fqdn),
        );
    }
    if n.answers == 0 {
        cx.error_path(&format!("{base}.answers"), "must be at least 1");
    }
    if n.sites.is_empty() {
        cx.error_path(&format!("{base}.sites"), "at least one site is required");
    }
}

/// Checks a `redirect_host`: a DNS host name (letters, digits, `-`, dots; labels of 1–63
/// characters) optionally followed by `:port`. It becomes the authority of a `Location` header,
/// so nothing else may pass.
fn check_redirect_host(h: &str) -> Result<(), String> {
    let expected = "expected a host name with an optional port, like \"eu.app.example.com\" or \"eu.app.example.com:8443\"";
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (h, None),
    };
    if let Some(p) = port {
        if p.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{h:?}: bad port {p:?}; {expected}"));
        }
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!("{h:?} is not a host name; {expected}"));
    }
    Ok(())
}
