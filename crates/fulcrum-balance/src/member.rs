//! A member: one real service (a server, a link, a site or a gateway) with its admin state,
//! health, weight, slow-start phase and live figures. Its identity (pool + address) is stable
//! across reloads, so all of this survives one.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_config::AdminState;
use serde::Serialize;

use crate::health::{Changed, CheckSpec, HealthMachine};

/// Effective weights carry 8 fractional bits so a slow-start ramp or an agent's percentage can
/// scale a weight of 1 smoothly.
pub const WEIGHT_SCALE: u32 = 256;

/// What an agent check (HAProxy's agent protocol) asked for, on top of the operator's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// No override (`ready`, or no agent).
    None,
    Drain,
    /// `maint`: no new traffic at all, like `disabled`.
    Maint,
}

/// Bytes a data plane counts before it adds them to a member's counters while a transfer is
/// under way (see `MemberStats::add_live`); the tcp data plane reports at the same size.
pub const LIVE_BATCH: u64 = 256 * 1024;

#[derive(Debug, Default)]
pub struct MemberStats {
    pub active_connections: AtomicU64,
    pub connections_total: AtomicU64,
    pub active_requests: AtomicU64,
    pub requests_total: AtomicU64,
    /// Requests that went over an already open member connection (HTTP connection reuse).
    pub connections_reused: AtomicU64,
    /// Open member connections waiting idle for reuse (HTTP), a gauge kept by the data plane.
    pub connections_idle: AtomicU64,
    /// Connection attempts that failed (refused, timed out, reset before use).
    pub connect_failures: AtomicU64,
    /// Bytes sent to the member / received from it.
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Response (or connect) time EWMA in microseconds, as f64 bits; 0 = no sample yet.
    response_us: AtomicU64,
    /// Traffic EWMA in bytes per second, as f64 bits, sampled by `Pool::refresh`.
    traffic_bps: AtomicU64,
    traffic_sample_bytes: AtomicU64,
    traffic_sample_ms: AtomicU64,
    /// Duration EWMA of passing active checks in microseconds, as f64 bits; 0 = no sample. Kept
    /// apart from `response_us`, which the data plane feeds, so checks do not skew it.
    check_us: AtomicU64,
}

impl MemberStats {
    /// Response time EWMA in microseconds (0 = no sample yet).
    pub fn response_time_us(&self) -> f64 {
        f64::from_bits(self.response_us.load(Ordering::Relaxed))
    }

    /// Folds one sample into the EWMA (gain 1/8, as TCP's SRTT). Concurrent updates may lose a
    /// sample, which an average over thousands of them does not notice.
    pub fn observe_response_time(&self, d: Duration) {
        let x = d.as_secs_f64() * 1e6;
        let old = self.response_time_us();
        let new = if old == 0.0 {
            x.max(1.0)
        } else {
            old + (x - old) / 8.0
        };
        self.response_us.store(new.to_bits(), Ordering::Relaxed);
    }

    /// How long passing active checks take, EWMA in microseconds (0 = no sample yet). GSLB reads
    /// it as the time from this instance to a site.
    pub fn check_time_us(&self) -> f64 {
        f64::from_bits(self.check_us.load(Ordering::Relaxed))
    }

    /// Folds the duration of one passing active check into its EWMA (gain 1/8).
    pub fn observe_check_time(&self, d: Duration) {
        let x = (d.as_secs_f64() * 1e6).max(1.0);
        let old = self.check_time_us();
        let new = if old == 0.0 { x } else { old + (x - old) / 8.0 };
        self.check_us.store(new.to_bits(), Ordering::Relaxed);
    }

    /// Traffic EWMA in bytes per second.
    pub fn traffic_bps(&self) -> f64 {
        f64::from_bits(self.traffic_bps.load(Ordering::Relaxed))
    }

    pub fn add_bytes(&self, sent: u64, received: u64) {
        if sent != 0 {
            self.bytes_sent.fetch_add(sent, Ordering::Relaxed);
        }
        if received != 0 {
            self.bytes_received.fetch_add(received, Ordering::Relaxed);
        }
    }

    /// Hands the bytes of a transfer still under way to the counters once they make a batch of
    /// `LIVE_BATCH`, and zeroes them: `sent` / `received` are the bytes the caller has counted
    /// and not yet added, and it adds what is left when the transfer ends. So
    /// `weighted_least_traffic` and the traffic figures see a long download or a tunnel while it
    /// lasts, not when it closes, at the cost of one shared atomic add per batch rather than one
    /// per read.
    #[inline]
    pub fn add_live(&self, sent: &mut u64, received: &mut u64) {
        if *sent + *received >= LIVE_BATCH {
            self.add_bytes(std::mem::take(sent), std::mem::take(received));
        }
    }

    /// An accumulator for a transfer under way (a tunnel, a relayed stream): its bytes reach
    /// these counters in `LIVE_BATCH`es while it runs and the rest when it is dropped.
    pub fn live(&self) -> LiveBytes<'_> {
        LiveBytes {
            stats: self,
            sent: 0,
            received: 0,
        }
    }

    /// Updates the traffic EWMA from the byte counters; called periodically by the control plane.
    pub(crate) fn sample_traffic(&self, now_ms: u64) {
        // A refresh that read the clock before the last sample (two refreshes racing) has
        // nothing newer to add; letting it move the sample time back would stretch the next
        // interval and understate the rate.
        let last_ms = self.traffic_sample_ms.load(Ordering::Relaxed);
        if now_ms <= last_ms
            || self
                .traffic_sample_ms
                .compare_exchange(last_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let total =
            self.bytes_sent.load(Ordering::Relaxed) + self.bytes_received.load(Ordering::Relaxed);
        let last_bytes = self.traffic_sample_bytes.swap(total, Ordering::Relaxed);
        if last_ms == 0 {
            return;
        }
        let dt = (now_ms - last_ms) as f64 / 1000.0;
        let rate = total.saturating_sub(last_bytes) as f64 / dt;
        // Time-based gain: a 1 s sample moves the average by about 40%.
        let alpha = 1.0 - (-dt / 2.0).exp();
        let old = self.traffic_bps();
        self.traffic_bps
            .store((old + alpha * (rate - old)).to_bits(), Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub struct Member {
    pub address: SocketAddr,
    pub pool: Arc<str>,
    /// How the member is shown: its address, or a name for sites and links.
    pub label: Arc<str>,
    weight: AtomicU32,
    config_weight: AtomicU32,
    state: AtomicU8,
    config_state: AtomicU8,
    priority: AtomicI32,
    max_connections: AtomicU32,
    agent_state: AtomicU8,
    /// Percentage of the weight an agent reported (100 without an agent).
    agent_weight_pct: AtomicU32,
    /// The weight percentage each monitor reported (monitor, percentage, share); their
    /// weighted average is `agent_weight_pct`.
    weight_readings: std::sync::Mutex<Vec<(String, u32, u32)>>,
    /// Scaled effective weight (see `WEIGHT_SCALE`) the scheduler last used.
    effective_weight: AtomicU32,
    pub health: HealthMachine,
    recovery_ms: AtomicU64,
    warm_ms: AtomicU64,
    /// When the current slow start began (0 = none).
    ramp_start_ms: AtomicU64,
    /// An elastic pool's standby member: it takes new clients only while joined.
    standby: AtomicBool,
    /// When a standby member joined (0 = it has not; see `crate::elastic`).
    joined_ms: AtomicU64,
    pub stats: MemberStats,
}

fn state_to_u8(s: AdminState) -> u8 {
    match s {
        AdminState::Enabled => 0,
        AdminState::Drain => 1,
        AdminState::Disabled => 2,
    }
}

fn state_from_u8(v: u8) -> AdminState {
    match v {
        0 => AdminState::Enabled,
        1 => AdminState::Drain,
        _ => AdminState::Disabled,
    }
}

impl Member {
    pub fn new(pool: Arc<str>, cfg: &fulcrum_config::Member) -> Self {
        Self::new_labeled(pool, cfg, Arc::from(cfg.address.to_string()))
    }

    /// A member shown under `label` rather than its address (a site, a link).
    pub fn new_labeled(pool: Arc<str>, cfg: &fulcrum_config::Member, label: Arc<str>) -> Self {
        Member {
            address: cfg.address,
            label,
            pool,
            weight: AtomicU32::new(cfg.weight),
            config_weight: AtomicU32::new(cfg.weight),
            state: AtomicU8::new(state_to_u8(cfg.state)),
            config_state: AtomicU8::new(state_to_u8(cfg.state)),
            priority: AtomicI32::new(cfg.priority),
            max_connections: AtomicU32::new(cfg.max_connections),
            agent_state: AtomicU8::new(0),
            agent_weight_pct: AtomicU32::new(100),
            weight_readings: std::sync::Mutex::new(Vec::new()),
            effective_weight: AtomicU32::new(cfg.weight.saturating_mul(WEIGHT_SCALE)),
            health: HealthMachine::default(),
            recovery_ms: AtomicU64::new(0),
            warm_ms: AtomicU64::new(0),
            ramp_start_ms: AtomicU64::new(0),
            standby: AtomicBool::new(cfg.standby),
            joined_ms: AtomicU64::new(0),
            stats: MemberStats::default(),
        }
    }

    /// Applies a reloaded config. Weight and state set through the API stay until the config's
    /// own value for them changes: an operator's drain is not undone by an unrelated reload.
    pub fn reconfigure(&self, cfg: &fulcrum_config::Member) {
        if self.config_weight.swap(cfg.weight, Ordering::Relaxed) != cfg.weight {
            self.weight.store(cfg.weight, Ordering::Relaxed);
        }
        let s = state_to_u8(cfg.state);
        if self.config_state.swap(s, Ordering::Relaxed) != s {
            self.set_state(cfg.state);
        }
        self.priority.store(cfg.priority, Ordering::Relaxed);
        self.max_connections
            .store(cfg.max_connections, Ordering::Relaxed);
        // A member that joined keeps serving across a reload; one no longer standby is simply
        // a member.
        self.standby.store(cfg.standby, Ordering::Relaxed);
        if !cfg.standby {
            self.joined_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the member is an elastic pool's standby member (joined or not).
    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    /// Whether a standby member has joined (always false for other members).
    pub fn is_joined(&self) -> bool {
        self.joined_ms.load(Ordering::Relaxed) != 0
    }

    /// When the member joined (0 = not joined), so the last to join leaves first.
    pub(crate) fn joined_ms(&self) -> u64 {
        self.joined_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn set_joined(&self, at_ms: u64) {
        self.joined_ms.store(at_ms, Ordering::Relaxed);
    }

    /// A standby member that has not joined: out of the scheduling, like weight 0.
    #[inline]
    pub fn benched(&self) -> bool {
        self.standby.load(Ordering::Relaxed) && self.joined_ms.load(Ordering::Relaxed) == 0
    }

    pub fn set_slow_start(&self, recovery: Duration, warm: Duration) {
        self.recovery_ms
            .store(recovery.as_millis() as u64, Ordering::Relaxed);
        self.warm_ms
            .store(warm.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    pub fn set_weight(&self, w: u32) {
        self.weight.store(w, Ordering::Relaxed);
    }

    /// The weight the configuration file gives (the API may have set another).
    pub fn config_weight(&self) -> u32 {
        self.config_weight.load(Ordering::Relaxed)
    }

    /// The state the configuration file gives (the API may have set another).
    pub fn config_state(&self) -> AdminState {
        state_from_u8(self.config_state.load(Ordering::Relaxed))
    }

    pub fn priority(&self) -> i32 {
        self.priority.load(Ordering::Relaxed)
    }

    pub fn max_connections(&self) -> u32 {
        self.max_connections.load(Ordering::Relaxed)
    }

    /// The operator's state (config or API).
    pub fn state(&self) -> AdminState {
        state_from_u8(self.state.load(Ordering::Relaxed))
    }

    pub fn set_state(&self, s: AdminState) {
        let old = state_from_u8(self.state.swap(state_to_u8(s), Ordering::AcqRel));
        if old != s {
            tracing::info!(pool = %self.pool, member = %self.label, from = %old, to = %s, "member state changed");
            if s == AdminState::Enabled && self.health.is_up() {
                self.begin_slow_start();
            }
        }
    }

    pub fn agent_state(&self) -> AgentState {
        match self.agent_state.load(Ordering::Relaxed) {
            1 => AgentState::Drain,
            2 => AgentState::Maint,
            _ => AgentState::None,
        }
    }

    pub fn set_agent_state(&self, s: AgentState) {
        let v = match s {
            AgentState::None => 0,
            AgentState::Drain => 1,
            AgentState::Maint => 2,
        };
        let old = self.agent_state.swap(v, Ordering::AcqRel);
        if old != v {
            tracing::info!(pool = %self.pool, member = %self.label, agent_state = ?s, "agent changed member state");
            if s == AgentState::None && self.health.is_up() && self.state() == AdminState::Enabled {
                self.begin_slow_start();
            }
        }
    }

    pub fn agent_weight_pct(&self) -> u32 {
        self.agent_weight_pct.load(Ordering::Relaxed)
    }

    pub fn set_agent_weight_pct(&self, pct: u32) {
        self.agent_weight_pct
            .store(pct.min(100_000), Ordering::Relaxed);
    }

    /// One monitor's weight reading: the member's percentage becomes the readings' average,
    /// each counted `share` times.
    pub fn set_weight_reading(&self, monitor: &str, pct: u32, share: u32) {
        let Ok(mut readings) = self.weight_readings.lock() else {
            return;
        };
        match readings.iter_mut().find(|(m, _, _)| m == monitor) {
            Some(r) => (r.1, r.2) = (pct, share.max(1)),
            None => readings.push((monitor.to_string(), pct, share.max(1))),
        }
        self.set_agent_weight_pct(weighted_average(&readings));
    }

    /// Forgets the readings of monitors not in `keep` (a reload removed them, or took `max` off
    /// one): a reading nothing refreshes any more would hold the member's weight for ever.
    /// Returns whether the percentage changed.
    pub fn retain_weight_readings(&self, keep: &[&str]) -> bool {
        let Ok(mut readings) = self.weight_readings.lock() else {
            return false;
        };
        let before = readings.len();
        readings.retain(|(m, _, _)| keep.contains(&m.as_str()));
        if readings.len() == before {
            return false;
        }
        let old = self.agent_weight_pct();
        self.set_agent_weight_pct(if readings.is_empty() {
            100
        } else {
            weighted_average(&readings)
        });
        old != self.agent_weight_pct()
    }

    /// The monitors that reported weights are gone: back to 100 %.
    pub fn clear_weight_readings(&self) {
        if let Ok(mut readings) = self.weight_readings.lock() {
            readings.clear();
        }
        self.set_agent_weight_pct(100);
    }

    /// The state traffic decisions use: the stricter of the operator's and the agent's.
    pub fn effective_state(&self) -> AdminState {
        match (self.state(), self.agent_state()) {
            (AdminState::Disabled, _) | (_, AgentState::Maint) => AdminState::Disabled,
            (AdminState::Drain, _) | (_, AgentState::Drain) => AdminState::Drain,
            _ => AdminState::Enabled,
        }
    }

    pub fn effective_weight(&self) -> u32 {
        self.effective_weight.load(Ordering::Relaxed)
    }

    pub(crate) fn store_effective_weight(&self, w: u32) {
        self.effective_weight.store(w, Ordering::Relaxed);
    }

    fn below_max_connections(&self) -> bool {
        let max = self.max_connections();
        max == 0 || self.stats.active_connections.load(Ordering::Relaxed) < u64::from(max)
    }

    /// Whether a slow start holds the member in its no-traffic `recovery` phase at `now_ms`.
    fn recovering(&self, now_ms: u64) -> bool {
        let start = self.ramp_start_ms.load(Ordering::Relaxed);
        start != 0 && now_ms < start + self.recovery_ms.load(Ordering::Relaxed)
    }

    /// May take a new client (scheduling). `now_ms` is 0 when the pool has no slow start. A
    /// weight of 0, set by the operator or reported by an agent as 0%, takes no new clients.
    #[inline]
    pub fn accepts_new(&self, now_ms: u64) -> bool {
        self.health.is_up() && self.takes_clients_if_healthy(now_ms)
    }

    /// May take a new client in panic mode (no member of its pool is up): down by passive
    /// observation alone, and otherwise as `accepts_new` asks. A member a monitor says is
    /// down, or one the operator or an agent took out, never does.
    #[inline]
    pub fn accepts_in_panic(&self, now_ms: u64) -> bool {
        self.health.down_only_passively() && self.takes_clients_if_healthy(now_ms)
    }

    /// Everything but health that decides whether a member takes a new client: enabled, a
    /// weight above 0 (operator and agent), not benched, below its connection limit and not
    /// held back by slow start.
    #[inline]
    fn takes_clients_if_healthy(&self, now_ms: u64) -> bool {
        self.effective_state() == AdminState::Enabled
            && self.weight() > 0
            && self.agent_weight_pct() > 0
            && !self.benched()
            && self.below_max_connections()
            && (now_ms == 0 || !self.recovering(now_ms))
    }

    /// Whether the member counts as serving for panic mode: up, and neither disabled by the
    /// operator or an agent nor a standby out of the pool.
    pub(crate) fn serving(&self) -> bool {
        self.health.is_up() && self.effective_state() == AdminState::Enabled && !self.benched()
    }

    /// May take a client that persistence maps to it: drain and weight 0 still honour existing
    /// clients; disabled and down do not.
    #[inline]
    pub fn accepts_persistent(&self, now_ms: u64) -> bool {
        self.health.is_up()
            && self.effective_state() != AdminState::Disabled
            && self.below_max_connections()
            && (now_ms == 0 || !self.recovering(now_ms))
    }

    /// Starts a slow start now, if the pool has one and the member is up (a member that is
    /// down starts one when it comes up).
    pub fn begin_slow_start(&self) {
        if self.health.is_up()
            && self.recovery_ms.load(Ordering::Relaxed) + self.warm_ms.load(Ordering::Relaxed) > 0
        {
            self.ramp_start_ms
                .store(crate::clock::now_ms(), Ordering::Relaxed);
        }
    }

    /// Starts a slow start at a given clock reading (tests drive time by hand).
    #[doc(hidden)]
    pub fn begin_slow_start_at(&self, now_ms: u64) {
        self.ramp_start_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The slow-start factor at `now_ms` in 1/`WEIGHT_SCALE` units: 0 in recovery, a linear ramp
    /// during warm-up (never below one unit, so the member does get traffic), full afterwards.
    pub fn ramp(&self, now_ms: u64) -> u32 {
        let start = self.ramp_start_ms.load(Ordering::Relaxed);
        if start == 0 {
            return WEIGHT_SCALE;
        }
        let recovery = self.recovery_ms.load(Ordering::Relaxed);
        let warm = self.warm_ms.load(Ordering::Relaxed);
        let elapsed = now_ms.saturating_sub(start);
        if elapsed < recovery {
            return 0;
        }
        if warm == 0 || elapsed >= recovery + warm {
            // Done: later calls skip the arithmetic.
            let _ =
                self.ramp_start_ms
                    .compare_exchange(start, 0, Ordering::Relaxed, Ordering::Relaxed);
            return WEIGHT_SCALE;
        }
        let f = (elapsed - recovery) * u64::from(WEIGHT_SCALE) / warm;
        (f as u32).clamp(1, WEIGHT_SCALE)
    }

    /// Whether a slow start is running (recovery or warm-up).
    pub fn in_slow_start(&self) -> bool {
        self.ramp_start_ms.load(Ordering::Relaxed) != 0
    }

    /// The phase for the API: "recovery", "warm" or "none".
    pub fn slow_start_phase(&self, now_ms: u64) -> &'static str {
        match self.ramp(now_ms) {
            0 => "recovery",
            WEIGHT_SCALE => "none",
            _ => "warm",
        }
    }

    fn on_health_change(&self, changed: Changed) -> Changed {
        if let Some(up) = changed {
            let reason = self
                .health
                .last_transition()
                .map(|t| t.reason)
                .unwrap_or_default();
            if up {
                tracing::info!(pool = %self.pool, member = %self.label, %reason, "member is up");
                self.begin_slow_start();
            } else {
                tracing::warn!(pool = %self.pool, member = %self.label, %reason, "member is down");
            }
        }
        changed
    }

    /// Sets the member's monitors (start, reload); a change of state it causes is logged and
    /// starts slow start like any other.
    pub fn configure_checks(&self, checks: &[CheckSpec]) -> Changed {
        self.on_health_change(self.health.configure(checks))
    }

    /// Feeds the result of one active check by `monitor`.
    pub fn record_check(&self, monitor: &str, ok: bool, detail: &str) -> Changed {
        self.on_health_change(self.health.record_check(monitor, ok, detail))
    }

    /// A connection attempt to the member failed.
    pub fn record_connect_failure(&self, detail: &str) -> Changed {
        self.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
        self.on_health_change(self.health.record_passive_failure(detail))
    }

    /// An established exchange failed in a way that blames the member (reset, bad response).
    pub fn record_passive_failure(&self, detail: &str) -> Changed {
        self.on_health_change(self.health.record_passive_failure(detail))
    }

    /// A connection to the member was established after `connect_time`. This alone does not
    /// clear a run of passive failures: a member that accepts and then resets every connection
    /// must still be taken down, so only a completed exchange (`record_exchange_success`) does.
    pub fn record_connect_success(&self, connect_time: Duration) {
        self.stats.observe_response_time(connect_time);
    }

    /// The member served an exchange (it answered, or ended the connection cleanly).
    pub fn record_exchange_success(&self) {
        self.health.record_passive_success();
    }

    pub fn record_probe(&self, ok: bool, detail: &str) -> Changed {
        self.on_health_change(self.health.record_probe(ok, detail))
    }

    /// Counts a new connection to the member for as long as the guard lives.
    pub fn open_connection(self: &Arc<Self>) -> ConnectionGuard {
        self.stats
            .active_connections
            .fetch_add(1, Ordering::Relaxed);
        self.stats.connections_total.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self.clone())
    }

    /// Counts a member connection in use for as long as the guard lives, for data planes that
    /// keep member connections open between requests (HTTP reuse): `fresh` counts a newly opened
    /// connection in `connections_total`; otherwise it is a reuse. A connection idle in a reuse
    /// pool holds no guard, so `active_connections` (and `max_connections`, least connections)
    /// count connections carrying a request.
    pub fn use_connection(self: &Arc<Self>, fresh: bool) -> ConnectionGuard {
        self.stats
            .active_connections
            .fetch_add(1, Ordering::Relaxed);
        if fresh {
            self.stats.connections_total.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats
                .connections_reused
                .fetch_add(1, Ordering::Relaxed);
        }
        ConnectionGuard(self.clone())
    }

    /// Counts a request in flight on the member for as long as the guard lives.
    pub fn open_request(self: &Arc<Self>) -> RequestGuard {
        self.stats.active_requests.fetch_add(1, Ordering::Relaxed);
        self.stats.requests_total.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }
}

/// Keeps a member's active-connection count up while a connection lives.
#[derive(Debug)]
pub struct ConnectionGuard(Arc<Member>);

impl ConnectionGuard {
    pub fn member(&self) -> &Arc<Member> {
        &self.0
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0
            .stats
            .active_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keeps a member's active-request count up while a request is in flight.
#[derive(Debug)]
pub struct RequestGuard(Arc<Member>);

impl RequestGuard {
    pub fn member(&self) -> &Arc<Member> {
        &self.0
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.stats.active_requests.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes of one transfer not yet added to a member's counters (see `MemberStats::live`).
pub struct LiveBytes<'a> {
    stats: &'a MemberStats,
    sent: u64,
    received: u64,
}

impl LiveBytes<'_> {
    /// `sent` bytes to the member and `received` from it since the last call.
    #[inline]
    pub fn add(&mut self, sent: u64, received: u64) {
        self.sent += sent;
        self.received += received;
        self.stats.add_live(&mut self.sent, &mut self.received);
    }
}

impl Drop for LiveBytes<'_> {
    fn drop(&mut self) {
        if self.sent + self.received > 0 {
            self.stats.add_bytes(self.sent, self.received);
        }
    }
}

/// The readings' percentages, each counted `share` times.
fn weighted_average(readings: &[(String, u32, u32)]) -> u32 {
    let total: u64 = readings.iter().map(|r| u64::from(r.2)).sum();
    let sum: u64 = readings
        .iter()
        .map(|r| u64::from(r.1) * u64::from(r.2))
        .sum();
    u32::try_from(sum / total.max(1)).unwrap_or(u32::MAX)
}
