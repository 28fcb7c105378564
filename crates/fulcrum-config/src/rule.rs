//! Rules of a virtual service (`[[virtual_service.rule]]`): the conditions a request (http,
//! https) or a new connection / flow (tcp, udp, message) must all match, exactly one action, and
//! for http the header edits and path rewrite that go with it.
//!
//! Both kinds are read by the same code (one syntax); `check_l4_rule` and the http section's
//! own checks then refuse the conditions and actions the protocol cannot use, each at its key.

use std::ops::RangeInclusive;

use ipnet::IpNet;

use crate::protocol::Protocol;
use crate::reader::{Cx, FromNode, Node, Shape, TableReader};
use crate::types::{read_table, KeyValues, OneOrMany};

/// The key of the rules, taken by the protocols that have rules (not ftp).
pub const RULE_KEYS: &[&str] = &["rule"];

/// One rule: conditions (all must match) and exactly one action. The http conditions and
/// modifiers apply to http / https services, `destination_port` and `time` to tcp, udp and
/// message services; `source` to both.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    pub name: Option<String>,
    pub host: Option<String>,
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    pub path_regex: Option<String>,
    pub method: Vec<String>,
    pub header: KeyValues<String>,
    pub cookie: KeyValues<String>,
    pub query: KeyValues<String>,
    pub user_agent: Option<String>,
    pub source: Vec<IpNet>,
    /// L4: the local port the client connected to is in one of these ranges.
    pub destination_port: Vec<RangeInclusive<u16>>,
    /// L4: the local time of day is in one of these ranges.
    pub time: Vec<TimeRange>,
    pub action: RuleAction,
    pub request_headers: Option<HeaderEdits>,
    pub response_headers: Option<HeaderEdits>,
    pub rewrite_path: Option<Rewrite>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RuleAction {
    Pool(String),
    Redirect {
        location: String,
        status: u16,
    },
    Respond {
        status: u16,
        body: String,
    },
    #[default]
    Drop,
}

impl FromNode for Rule {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let mut rule = Rule {
                name: t.opt(cx, "name"),
                host: t.opt(cx, "host"),
                path: t.opt(cx, "path"),
                path_prefix: t.opt(cx, "path_prefix"),
                path_regex: t.opt(cx, "path_regex"),
                method: t
                    .opt::<OneOrMany<String>>(cx, "method")
                    .map(|m| m.0)
                    .unwrap_or_default(),
                header: t.opt(cx, "header").unwrap_or_default(),
                cookie: t.opt(cx, "cookie").unwrap_or_default(),
                query: t.opt(cx, "query").unwrap_or_default(),
                user_agent: t.opt(cx, "user_agent"),
                source: t
                    .opt::<OneOrMany<IpNet>>(cx, "source")
                    .map(|m| m.0)
                    .unwrap_or_default(),
                destination_port: t
                    .opt::<OneOrMany<PortSpec>>(cx, "destination_port")
                    .map(|m| m.0.into_iter().map(|p| p.0).collect())
                    .unwrap_or_default(),
                time: t
                    .opt::<OneOrMany<TimeRange>>(cx, "time")
                    .map(|m| m.0)
                    .unwrap_or_default(),
                request_headers: t.opt(cx, "request_headers"),
                response_headers: t.opt(cx, "response_headers"),
                rewrite_path: t.opt(cx, "rewrite_path"),
                ..Rule::default()
            };
            let paths = [&rule.path, &rule.path_prefix, &rule.path_regex];
            if paths.iter().filter(|p| p.is_some()).count() > 1 {
                cx.error_at(
                    node.span.clone(),
                    t.path(),
                    "use only one of `path`, `path_prefix` and `path_regex` in a rule",
                );
            }
            rule.action = read_rule_action(t, cx, node)?;
            Some(rule)
        })
    }
}

fn read_rule_action(
    t: &mut TableReader<'_>,
    cx: &mut Cx<'_>,
    node: &Node<'_>,
) -> Option<RuleAction> {
    let pool: Option<String> = t.opt(cx, "pool");
    let redirect: Option<String> = t.opt(cx, "redirect");
    let redirect_status: Option<u16> = t.opt(cx, "redirect_status");
    let respond: Option<u16> = t.opt(cx, "respond");
    let body: Option<String> = t.opt(cx, "body");
    let drop: Option<bool> = t.opt(cx, "drop");
    let count = [
        pool.is_some(),
        redirect.is_some(),
        respond.is_some(),
        drop == Some(true),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if count != 1 {
        cx.error_at(
            node.span.clone(),
            t.path(),
            format!(
                "a rule needs exactly one action (`pool`, `redirect`, `respond` or `drop = true`); found {count}"
            ),
        );
        return None;
    }
    if redirect_status.is_some() && redirect.is_none() {
        cx.error_at(
            node.span.clone(),
            t.path(),
            "`redirect_status` needs `redirect`",
        );
    }
    if body.is_some() && respond.is_none() {
        cx.error_at(node.span.clone(), t.path(), "`body` needs `respond`");
    }
    if let Some(p) = pool {
        return Some(RuleAction::Pool(p));
    }
    if let Some(location) = redirect {
        let status = redirect_status.unwrap_or(302);
        if ![301, 302, 303, 307, 308].contains(&status) {
            cx.error_at(
                node.span.clone(),
                &format!("{}.redirect_status", t.path()),
                format!("{status} is not a redirect status; expected 301, 302, 303, 307 or 308"),
            );
            return None;
        }
        return Some(RuleAction::Redirect { location, status });
    }
    if let Some(status) = respond {
        if !(200..=599).contains(&status) {
            cx.error_at(
                node.span.clone(),
                &format!("{}.respond", t.path()),
                format!("{status} is not an HTTP status from 200 to 599"),
            );
            return None;
        }
        return Some(RuleAction::Respond {
            status,
            body: body.unwrap_or_default(),
        });
    }
    Some(RuleAction::Drop)
}

#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    pub set: KeyValues<String>,
    pub add: KeyValues<String>,
    pub remove: Vec<String>,
}

impl FromNode for HeaderEdits {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(HeaderEdits {
                set: t.opt(cx, "set").unwrap_or_default(),
                add: t.opt(cx, "add").unwrap_or_default(),
                remove: t.opt(cx, "remove").unwrap_or_default(),
            })
        })
    }
}

#[derive(Debug, Clone)]
pub struct Rewrite {
    pub regex: String,
    pub replace: String,
}

impl FromNode for Rewrite {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let regex = t.req(cx, "regex");
            let replace = t.req(cx, "replace");
            Some(Rewrite {
                regex: regex?,
                replace: replace?,
            })
        })
    }
}

/// The conditions and actions only http / https rules take.
const HTTP_ONLY: &[&str] = &[
    "host",
    "path",
    "path_prefix",
    "path_regex",
    "method",
    "header",
    "cookie",
    "query",
    "user_agent",
    "redirect",
    "redirect_status",
    "respond",
    "body",
    "request_headers",
    "response_headers",
    "rewrite_path",
];

/// The conditions only tcp / udp / message rules take.
pub(crate) const L4_ONLY: &[&str] = &["destination_port", "time"];

/// Reads the `rule` list of a tcp, udp or message service and checks each rule. Rules are
/// run by the proxy: with in-kernel forwarding (nat / dr / tunnel) they are refused.
pub(crate) fn read_l4_rules(
    t: &mut TableReader<'_>,
    cx: &mut Cx<'_>,
    protocol: Protocol,
    forwarding: &crate::forwarding::ForwardingOptions,
) -> Vec<Rule> {
    let rules: Vec<Rule> = t.opt(cx, "rule").unwrap_or_default();
    let at = t.path().to_string();
    if !rules.is_empty() && forwarding.forwarding.in_kernel() {
        cx.error_path(
            &format!("{at}.rule"),
            format!(
                "rules are evaluated by the proxy when it accepts a connection or a flow; with forwarding = \"{}\" the kernel forwards the packets and no rule would run (use forwarding = \"proxy\", or one service per pool)",
                forwarding.forwarding
            ),
        );
    }
    for r in 0..rules.len() {
        check_l4_rule(&format!("{at}.rule[{r}]"), protocol, cx);
    }
    rules
}

/// Checks of a rule of a tcp, udp or message service (`at` is its key path): every HTTP
/// condition, action or modifier written is refused where it is written.
pub(crate) fn check_l4_rule(at: &str, protocol: Protocol, cx: &mut Cx<'_>) {
    for key in HTTP_ONLY {
        let path = format!("{at}.{key}");
        if cx.written(&path) {
            let what = match *key {
                "redirect" | "redirect_status" | "respond" | "body" => "answers an HTTP request",
                "request_headers" | "response_headers" | "rewrite_path" => "edits an HTTP request",
                _ => "matches HTTP requests",
            };
            cx.error_path(
                &path,
                format!(
                    "`{key}` {what}; rules of {protocol} services take the conditions `source`, `destination_port` and `time` and the actions `pool` and `drop = true`"
                ),
            );
        }
    }
}

/// Checks of a rule of an http / https service: the L4 conditions are refused.
pub(crate) fn check_http_rule(at: &str, protocol: Protocol, cx: &mut Cx<'_>) {
    for key in L4_ONLY {
        let path = format!("{at}.{key}");
        if cx.written(&path) {
            cx.error_path(
                &path,
                format!(
                    "`{key}` is a condition of tcp / udp / message rules (chosen once per connection); rules of {protocol} services match requests: `host`, `path`, `method`, `header`, `cookie`, `query`, `user_agent`, `source`"
                ),
            );
        }
    }
}

/// A port or a range of ports: `443`, `"443"` or `"8000-8099"`.
pub(crate) struct PortSpec(pub(crate) RangeInclusive<u16>);

impl FromNode for PortSpec {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        let range = match node.shape() {
            Shape::Int(i) => match u16::try_from(i) {
                Ok(p) if p > 0 => Ok(p..=p),
                _ => Err(format!("{i} is not a port 1..=65535")),
            },
            Shape::Str(text) if !text.contains('-') => match text.trim().parse::<u16>() {
                Ok(p) if p > 0 => Ok(p..=p),
                _ => Err(format!("{text:?} is not a port 1..=65535")),
            },
            Shape::Str(text) => crate::types::parse_port_range(text)
                .map_err(|why| format!("{text:?} is not a port range: {why}")),
            _ => Err(format!(
                "expected a port (443) or a range as a string (\"8000-8099\"), found {}",
                node.type_name()
            )),
        };
        match range {
            Ok(r) => Some(PortSpec(r)),
            Err(why) => {
                cx.error(node, why);
                None
            }
        }
    }
}

/// A range of the day, `"08:00-18:00"`, in minutes since local midnight: from `start`
/// included to `end` excluded. `end` < `start` crosses midnight (`"22:00-06:00"`); `"24:00"`
/// is allowed as an end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub start: u16,
    pub end: u16,
}

impl TimeRange {
    /// Whether `minute` (0..1440, since local midnight) is in the range.
    pub fn contains(&self, minute: u16) -> bool {
        if self.start < self.end {
            self.start <= minute && minute < self.end
        } else {
            minute >= self.start || minute < self.end
        }
    }

    pub fn parse(text: &str) -> Result<TimeRange, String> {
        let (a, b) = text
            .split_once('-')
            .ok_or_else(|| "expected \"HH:MM-HH:MM\", e.g. \"08:00-18:00\"".to_string())?;
        let start = parse_clock(a, false)?;
        let end = parse_clock(b, true)?;
        if start == end {
            return Err(format!(
                "the range starts and ends at {}: it is empty; leave `time` out for a rule that holds all day",
                a.trim()
            ));
        }
        Ok(TimeRange { start, end })
    }
}

/// `"HH:MM"` as minutes since midnight; `"24:00"` only as the end of a range.
fn parse_clock(text: &str, end: bool) -> Result<u16, String> {
    let t = text.trim();
    let bad = || format!("{t:?} is not a time of day \"HH:MM\" (00:00 to 23:59)");
    let (h, m) = t.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: u16 = h.parse().map_err(|_| bad())?;
    let m: u16 = m.parse().map_err(|_| bad())?;
    if m > 59 || h > 24 || (h == 24 && (m != 0 || !end)) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

impl FromNode for TimeRange {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        let Shape::Str(text) = node.shape() else {
            cx.error(
                node,
                format!(
                    "expected a time range as a string \"HH:MM-HH:MM\", found {}",
                    node.type_name()
                ),
            );
            return None;
        };
        match TimeRange::parse(text) {
            Ok(r) => Some(r),
            Err(why) => {
                cx.error(node, format!("{text:?} is not a time range: {why}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TimeRange;

    #[test]
    fn time_ranges() {
        let day = TimeRange::parse("08:00-18:00").unwrap();
        assert_eq!((day.start, day.end), (480, 1080));
        assert!(day.contains(480) && day.contains(1079));
        assert!(!day.contains(1080) && !day.contains(479));
        let night = TimeRange::parse("22:00-06:00").unwrap();
        assert!(night.contains(1320) && night.contains(0) && night.contains(359));
        assert!(!night.contains(360) && !night.contains(1319));
        let evening = TimeRange::parse("18:00-24:00").unwrap();
        assert!(evening.contains(1439) && !evening.contains(0));
        let all = TimeRange::parse("00:00-24:00").unwrap();
        assert!(all.contains(0) && all.contains(1439));
        for bad in [
            "08:00",
            "8:00-18:00",
            "08:00-18:60",
            "25:00-26:00",
            "24:00-06:00",
            "10:00-10:00",
            "24:30-01:00",
            "ab:cd-ef:gh",
            "-",
        ] {
            assert!(TimeRange::parse(bad).is_err(), "{bad}");
        }
    }
}
