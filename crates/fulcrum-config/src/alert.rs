//! `[[alert]]` rules: which transitions raise an alert and where it goes.
//!
//! The contract names `name`, `on`, `webhook`, `syslog`, `smtp` and `repeat`; `hold` (flap damping)
//! and `cert_expiry` (the threshold of `cert_expiry` alerts) are Fulcrum additions, documented in
//! docs/configuration.md.

use std::net::SocketAddr;
use std::time::Duration;

use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::read_table;

string_enum!(
    /// What an alert rule watches.
    AlertEvent {
        /// A pool member's health went down.
        MemberDown = "member_down",
        /// A pool has fewer available members than its `min_active`.
        PoolBelowMin = "pool_below_min",
        /// A GSLB site went down.
        SiteDown = "site_down",
        /// A link (link load balancing) went down; raised once that plane reports links.
        LinkDown = "link_down",
        /// The HA role changed; raised once that plane reports its role.
        Failover = "failover",
        /// An https certificate's notAfter is within `cert_expiry`.
        CertExpiry = "cert_expiry",
        /// A standby member of an elastic pool joined; resolves when it leaves.
        ElasticJoined = "elastic_joined",
    }
);

/// Plain SMTP to a relay (the local MTA), which does TLS and onward delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Smtp {
    pub server: SocketAddr,
    pub from: String,
    pub to: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlertRule {
    pub name: String,
    pub on: Vec<AlertEvent>,
    /// `http://` or `https://` URL: the Alertmanager v2 API when the path ends in
    /// `/api/v2/alerts`, otherwise any receiver of the Alertmanager v4 webhook JSON.
    pub webhook: Option<String>,
    /// https webhooks: trust this PEM bundle instead of the Mozilla roots (Fulcrum addition).
    pub webhook_ca: Option<std::path::PathBuf>,
    /// https webhooks: check the receiver's certificate (default true; Fulcrum addition).
    pub webhook_verify: bool,
    /// RFC 5424 messages over UDP to this address.
    pub syslog: Option<SocketAddr>,
    pub smtp: Option<Smtp>,
    /// A still-firing alert is sent again this often; zero: never again.
    pub repeat: Duration,
    /// Flap damping: a condition fires once it has lasted `hold`, and resolves once it has been
    /// gone `hold`.
    pub hold: Duration,
    /// `cert_expiry` fires when a certificate expires within this.
    pub cert_expiry: Duration,
}

fn valid_address(s: &str) -> bool {
    let s = s.trim();
    let shaped = match s.rsplit_once('@') {
        Some((local, domain)) => {
            !local.is_empty() && (domain.contains('.') || domain == "localhost")
        }
        None => false,
    };
    // The address goes into SMTP commands and headers: no line breaks or angle brackets.
    shaped && !s.contains(['\r', '\n', '<', '>', ' '])
}

impl FromNode for Smtp {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let server = t.req(cx, "server");
            let from: Option<String> = t.req(cx, "from");
            let to: Option<Vec<String>> = t.req(cx, "to");
            if let Some(f) = &from {
                if !valid_address(f) {
                    if let Some(n) = t.node("from") {
                        cx.error(&n, format!("{f:?} is not a mail address (user@domain)"));
                    }
                    return None;
                }
            }
            if let Some(to) = &to {
                let bad: Vec<&String> = to.iter().filter(|a| !valid_address(a)).collect();
                if to.is_empty() || !bad.is_empty() {
                    if let Some(n) = t.node("to") {
                        cx.error(
                            &n,
                            format!(
                                "expected one or more mail addresses (user@domain), found {bad:?}"
                            ),
                        );
                    }
                    return None;
                }
            }
            Some(Smtp {
                server: server?,
                from: from?,
                to: to?,
            })
        })
    }
}

impl FromNode for AlertRule {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let on: Option<Vec<AlertEvent>> = t.req(cx, "on");
            let webhook: Option<String> = t.opt(cx, "webhook");
            if let Some(w) = &webhook {
                let ok = w
                    .strip_prefix("http://")
                    .or_else(|| w.strip_prefix("https://"))
                    .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'));
                if !ok {
                    if let Some(n) = t.node("webhook") {
                        cx.error(
                            &n,
                            format!("{w:?}: expected an http:// or https:// URL, e.g. \"http://127.0.0.1:9093/api/v2/alerts\""),
                        );
                    }
                    return None;
                }
            }
            let webhook_ca: Option<std::path::PathBuf> =
                t.opt::<String>(cx, "webhook_ca").map(Into::into);
            let webhook_verify: bool = t.opt(cx, "webhook_verify").unwrap_or(true);
            let https = webhook
                .as_deref()
                .is_some_and(|w| w.starts_with("https://"));
            for (key, set) in [
                ("webhook_ca", webhook_ca.is_some()),
                ("webhook_verify", !webhook_verify),
            ] {
                if set && !https {
                    if let Some(n) = t.node(key) {
                        cx.error(&n, "only with an https:// `webhook`");
                    }
                }
            }
            if let (Some(ca), Some(n)) = (&webhook_ca, t.node("webhook_ca")) {
                if let Err(e) = std::fs::metadata(ca) {
                    cx.error(&n, format!("{}: {e}", ca.display()));
                }
            }
            let syslog = t.opt(cx, "syslog");
            let smtp = t.opt(cx, "smtp");
            if webhook.is_none() && syslog.is_none() && smtp.is_none() {
                cx.error_at(
                    node.span.clone(),
                    &node.path,
                    "an alert needs somewhere to go: webhook, syslog or smtp",
                );
            }
            let repeat = t.opt(cx, "repeat").unwrap_or(Duration::from_secs(4 * 3600));
            let hold = t.opt(cx, "hold").unwrap_or(Duration::from_secs(5));
            let cert_expiry = t
                .opt(cx, "cert_expiry")
                .unwrap_or(Duration::from_secs(30 * 86400));
            let on = on?;
            if on.is_empty() {
                if let Some(n) = t.node("on") {
                    cx.error(
                        &n,
                        format!("expected one or more of: {}", AlertEvent::ALL.join(", ")),
                    );
                }
                return None;
            }
            Some(AlertRule {
                name: name?,
                on,
                webhook,
                webhook_ca,
                webhook_verify,
                syslog,
                smtp,
                repeat,
                hold,
                cert_expiry,
            })
        })
    }
}
