//! Per-virtual-service counters, shared by every data plane and kept across reloads by name.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct ServiceStats {
    pub connections_active: AtomicU64,
    pub connections_total: AtomicU64,
    pub requests_total: AtomicU64,
    /// Bytes from clients / to clients.
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Clients turned away: no member available, or the service's connection limit reached.
    pub no_member: AtomicU64,
    pub over_limit: AtomicU64,
    /// Clients whose every connection attempt to members failed.
    pub upstream_failures: AtomicU64,
    /// Connections (udp: datagrams) refused by the service's `allow` / `deny` lists.
    pub denied: AtomicU64,
    /// `protocol = "ftp"`: data connections relayed (passive and active).
    pub ftp_data_connections: AtomicU64,
    /// `protocol = "ftp"`: control lines refused or passed unchanged (too long, malformed
    /// 227 / 229 / PORT / EPRT, PORT to a foreign address) and data connections from a
    /// foreign address.
    pub ftp_refused: AtomicU64,
    /// `protocol = "rtsp"`: sessions members opened (SETUP replies with a new `Session`).
    pub rtsp_sessions: AtomicU64,
    /// `protocol = "rtsp"`: RTP / RTCP datagrams relayed (UDP transport), both ways.
    pub rtsp_datagrams: AtomicU64,
    /// `protocol = "rtsp"`: datagrams dropped: from a host other than the session's client or
    /// member, or not sent on.
    pub rtsp_datagrams_dropped: AtomicU64,
    /// `protocol = "rtsp"`: messages that could not be framed (clients answered `400`, then
    /// closed; members closed).
    pub rtsp_malformed: AtomicU64,
    /// tcp, udp and message services: the hits of each rule, in file order (empty without
    /// rules). Replaced at each reload; a rule keeps its counter when its label and action stay.
    pub rules: arc_swap::ArcSwap<Vec<std::sync::Arc<RuleHits>>>,
}

/// The hits of one rule of a service: connections (udp: new flows) the rule decided.
#[derive(Debug, Default)]
pub struct RuleHits {
    /// The rule's `name`, or `rule[i]` (its position) when it has none.
    pub label: String,
    /// What the rule does: `pool:<name>` or `drop`.
    pub action: String,
    pub hits: AtomicU64,
}

impl ServiceStats {
    /// Installs the counters of a service's rules (`(label, action)` in file order), keeping the
    /// counter of a rule whose label and action are unchanged since the last configuration.
    pub fn set_rules(&self, rules: Vec<(String, String)>) -> Vec<std::sync::Arc<RuleHits>> {
        let old = self.rules.load();
        let new: Vec<std::sync::Arc<RuleHits>> = rules
            .into_iter()
            .map(|(label, action)| {
                old.iter()
                    .find(|h| h.label == label && h.action == action)
                    .cloned()
                    .unwrap_or_else(|| {
                        std::sync::Arc::new(RuleHits {
                            label,
                            action,
                            hits: AtomicU64::new(0),
                        })
                    })
            })
            .collect();
        self.rules.store(std::sync::Arc::new(new.clone()));
        new
    }
}

impl ServiceStats {
    /// Counts an accepted client connection for as long as the guard lives.
    pub fn open(self: &std::sync::Arc<Self>) -> ServiceConnection {
        self.connections_active.fetch_add(1, Ordering::Relaxed);
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        ServiceConnection(self.clone())
    }

    /// A new client connection of a service that takes at most `max_connections` at once (0: no
    /// limit): counted while the guard lives, or refused and counted in `over_limit`.
    pub fn admit(self: &std::sync::Arc<Self>, max_connections: u32) -> Option<ServiceConnection> {
        let admitted = match max_connections {
            0 => Some(self.open()),
            max => self.open_within(u64::from(max)),
        };
        if admitted.is_none() {
            self.over_limit.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// As `open`, unless `limit` connections are active already: the check and the count are
    /// one atomic step, so workers opening at once cannot pass the limit together.
    pub fn open_within(self: &std::sync::Arc<Self>, limit: u64) -> Option<ServiceConnection> {
        self.connections_active
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        Some(ServiceConnection(self.clone()))
    }
}

#[derive(Debug)]
pub struct ServiceConnection(std::sync::Arc<ServiceStats>);

impl ServiceConnection {
    pub fn stats(&self) -> &ServiceStats {
        &self.0
    }
}

impl Drop for ServiceConnection {
    fn drop(&mut self) {
        self.0.connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}
