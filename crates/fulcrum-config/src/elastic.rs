//! A pool's `elastic` table (Fulcrum addition; the seed's "server elastic load"): members marked
//! `standby = true` take no traffic until the pool's utilisation crosses `join`, and leave again
//! once it has stayed below `leave` for `leave_after` (hysteresis). An optional `hook` command
//! gets every join and leave as one JSON object on its stdin, to start or stop servers.
//!
//! ```toml
//! [[pool]]
//! name = "web"
//! elastic = { on = "connections", join = 0.8, leave = 0.4, leave_after = "60s",
//!             hook = ["/usr/local/bin/scale", "web"] }
//! ```

use std::time::Duration;

use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::{read_table, OneOrMany};

string_enum!(
    /// What the pool's utilisation is measured from.
    ElasticOn {
        /// Active connections ÷ the sum of the serving members' `max_connections`.
        Connections = "connections",
        /// The serving members' mean response time ÷ `target`.
        ResponseTime = "response_time",
    }
);

#[derive(Debug, Clone, PartialEq)]
pub struct Elastic {
    pub on: ElasticOn,
    /// A standby member joins when the utilisation is at or above this (a fraction, 0.8 = 80 %).
    pub join: f64,
    /// The last member that joined leaves once the utilisation has stayed below this for
    /// `leave_after`; below `join`, so a pool does not flap around one value.
    pub leave: f64,
    /// How long the utilisation must stay at or above `join` before a member joins (default 0:
    /// at the next evaluation, every 200 ms); also the pause between two joins.
    pub join_after: Duration,
    /// How long the utilisation must stay below `leave` before a member leaves (default 60 s).
    pub leave_after: Duration,
    /// `response_time`: the response time that counts as 100 % utilisation.
    pub target: Option<Duration>,
    /// argv of a command run on every join and leave with the event as JSON on stdin.
    pub hook: Vec<String>,
    /// A hook still running after this is killed (default 30 s).
    pub hook_timeout: Duration,
}

impl FromNode for Elastic {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let on = t.opt(cx, "on").unwrap_or(ElasticOn::Connections);
            let join: f64 = t.opt(cx, "join").unwrap_or(0.8);
            let leave: f64 = t.opt(cx, "leave").unwrap_or(join / 2.0);
            let target: Option<Duration> = t.opt(cx, "target");
            let hook: Vec<String> = t
                .opt::<OneOrMany<String>>(cx, "hook")
                .map(|h| h.0)
                .unwrap_or_default();
            let e = Elastic {
                on,
                join,
                leave,
                join_after: t.opt(cx, "join_after").unwrap_or(Duration::ZERO),
                leave_after: t.opt(cx, "leave_after").unwrap_or(Duration::from_secs(60)),
                target,
                hook_timeout: t.opt(cx, "hook_timeout").unwrap_or(Duration::from_secs(30)),
                hook,
            };
            let mut bad = |key: &'static str, msg: String| {
                let n = t.node(key).unwrap_or_else(|| node.clone());
                cx.error(&n, msg);
            };
            if !(join.is_finite() && join > 0.0) {
                bad(
                    "join",
                    format!("must be a fraction above 0 (0.8 = 80 %), found {join}"),
                );
            }
            if !(leave.is_finite() && leave >= 0.0 && leave < join) {
                bad(
                    "leave",
                    format!("must be at least 0 and below `join` ({join}) so members do not flap, found {leave}"),
                );
            }
            match (on, target) {
                (ElasticOn::ResponseTime, None) => bad(
                    "on",
                    "`on = \"response_time\"` needs `target`, the response time that counts as 100 %, e.g. \"200ms\"".into(),
                ),
                (ElasticOn::ResponseTime, Some(d)) if d.is_zero() => {
                    bad("target", "must be above 0".into())
                }
                (ElasticOn::Connections, Some(_)) => bad(
                    "target",
                    "only with `on = \"response_time\"`; connections are measured against the members' `max_connections`".into(),
                ),
                _ => {}
            }
            if e.hook.first().is_some_and(|c| c.trim().is_empty()) {
                bad("hook", "the command must not be empty".into());
            }
            Some(e)
        })
    }
}

/// Checks an elastic pool against its members (called by the pool reader): there must be a
/// standby member to add, at least one member that is not standby, and with `on =
/// "connections"` every member needs the `max_connections` utilisation is measured against.
/// A standby member in a pool without `elastic` would never get traffic: an error too.
pub(crate) fn check_pool(
    elastic: Option<&Elastic>,
    members: &[crate::Member],
    pool_node: &Node<'_>,
    pool_path: &str,
    cx: &mut Cx<'_>,
) {
    let standby = members.iter().filter(|m| m.standby).count();
    let at = format!("{pool_path}.elastic");
    match elastic {
        None if standby > 0 => cx.error_at(
            pool_node.span.clone(),
            &format!("{pool_path}.member"),
            "`standby = true` members need the pool's `elastic` table (when they join)",
        ),
        None => {}
        Some(e) => {
            if standby == 0 {
                cx.error_at(
                    pool_node.span.clone(),
                    &at,
                    "an elastic pool needs at least one member with `standby = true`",
                );
            }
            if standby == members.len() && !members.is_empty() {
                cx.error_at(
                    pool_node.span.clone(),
                    &at,
                    "every member is `standby`: at least one must serve before the pool is loaded",
                );
            }
            if e.on == ElasticOn::Connections {
                if let Some(m) = members.iter().find(|m| m.max_connections == 0) {
                    cx.error_at(
                        pool_node.span.clone(),
                        &at,
                        format!(
                            "`on = \"connections\"` measures against `max_connections`; member {} has none",
                            m.address
                        ),
                    );
                }
            }
        }
    }
}
