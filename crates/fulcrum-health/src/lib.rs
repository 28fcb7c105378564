//! Fulcrum's active health monitors, run on tokio.
//!
//! [`HealthService`] runs one task per (pool, member, monitor): every `interval` (±10% jitter)
//! it probes the member's ip at the monitor's port (or the member's), bounded by `timeout`, and
//! feeds the result to the member's rise/fall state machine in `fulcrum-balance`, which passive
//! observation by the data planes feeds too. It also probes, with exponential back-off, members
//! that passive observation took down in pools without monitors.
//!
//! Monitor kinds: tcp, http, https, send_expect, agent (HAProxy's agent-check), dns, radius
//! (Status-Server or Access-Request), smtp, pop3, imap, ftp (greeting, a command or a login)
//! and icmp (echo over a raw or ping socket, IPv4 and IPv6). Members of pools served only over
//! UDP are probed back with datagrams rather than TCP connects.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod check;
mod passive;
mod probe;
mod service;
mod task;
mod text;

#[cfg(test)]
mod testutil;

use fulcrum_balance::CheckSpec;
use fulcrum_config::Monitor;

#[doc(hidden)]
pub use check::fuzzing;
pub use check::{
    parse_agent_reply, parse_snmp_response, parse_v3_response, AgentReply, Engine, LocalKeys,
    SnmpValue, UsmUser, V3Reply, Via,
};
pub use passive::StatusObserver;
pub use service::HealthService;

/// The state-machine view of a pool's monitors, for `fulcrum_balance::Pool::new`; monitors the
/// pool names that do not exist are left out (validation reports them).
pub fn check_specs(pool: &fulcrum_config::Pool, monitors: &[Monitor]) -> Vec<CheckSpec> {
    let mut seen = std::collections::HashSet::new();
    pool.monitors
        .iter()
        .filter(|name| seen.insert(name.as_str()))
        .filter_map(|name| monitors.iter().find(|m| m.name == **name))
        .map(|m| CheckSpec {
            monitor: m.name.clone(),
            rise: m.rise,
            fall: m.fall,
        })
        .collect()
}

/// What one probe of a link monitor's target found.
#[derive(Debug, Clone)]
pub struct ThroughResult {
    /// The target answered as the monitor expects.
    pub ok: bool,
    /// What was seen ("connected", "timeout after 1s", …).
    pub detail: String,
    /// How long the probe took (the round trip, for an answer).
    pub rtt: std::time::Duration,
}

/// Probes `target` with `monitor`'s check (tcp, icmp, dns, http, …) out of the link `via`
/// describes, bounded by the monitor's timeout: link monitors reuse the server monitors' checks.
pub async fn probe_through(
    monitor: &Monitor,
    target: std::net::SocketAddr,
    via: Via,
) -> ThroughResult {
    let check = check::Check::new(monitor);
    let mut probe = check::Probe::new(target, None, monitor.timeout);
    probe.via = Some(via);
    let start = tokio::time::Instant::now();
    let verdict = check.run(&probe).await;
    let rtt = start.elapsed();
    match verdict {
        check::Verdict::Health { ok, detail } => ThroughResult { ok, detail, rtt },
        check::Verdict::Agent { detail, .. } => ThroughResult {
            ok: true,
            detail,
            rtt,
        },
        check::Verdict::Nothing { why } => ThroughResult {
            ok: false,
            detail: why,
            rtt,
        },
    }
}
