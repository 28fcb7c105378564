//! The VRRPv3 state machine of RFC 5798 §6.4, without I/O or a clock: the driver passes the
//! time in and carries out the actions that come back, so tests run it on a virtual clock.
//!
//! Beside the RFC it has keepalived's fault state (a node whose services cannot serve resigns
//! and does not take mastership) and its preempt delay, and a master that hears a lower
//! priority master answers at once (advert and gratuitous ARPs), so a healed split brain ends
//! within one round trip rather than one interval.

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

use crate::packet::Advert;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Init,
    Backup,
    Master,
    /// Tracked services have no healthy member: not master, and not becoming it.
    Fault,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Init => "init",
            State::Backup => "backup",
            State::Master => "master",
            State::Fault => "fault",
        }
    }
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send an advertisement with this priority (0: resigning).
    Send(u8),
    /// Became master: add the VIPs and send gratuitous ARPs.
    TakeVips,
    /// Still master but another node thought it was (a split brain healing): gratuitous ARPs
    /// again so the segment points at this node.
    Reannounce,
    /// No longer master: remove the VIPs.
    ReleaseVips,
}

#[derive(Debug, Clone)]
pub struct Params {
    pub vrid: u8,
    pub priority: u8,
    pub advert_interval: Duration,
    pub preempt: bool,
    pub preempt_delay: Duration,
    /// This node's primary address on the VRRP interface: breaks priority ties (RFC 5798 §6.4.3).
    pub local: IpAddr,
    /// Priority lost while unhealthy; `None`: go to the fault state instead.
    pub track_weight: Option<u8>,
}

/// A state change, for the API and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// Time of the change on the driver's clock.
    #[serde(skip)]
    pub at: Duration,
    pub from: State,
    pub to: State,
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct Machine {
    p: Params,
    state: State,
    healthy: bool,
    /// Taken out by the operator.
    maintenance: bool,
    /// The advert timer (master) or the master-down timer (backup).
    timer: Option<Duration>,
    /// The interval the current master advertises (learned in backup).
    master_interval: Duration,
    /// When this backup first heard a lower-priority master it would preempt (preempt delay).
    lower_master_since: Option<Duration>,
    /// The master last heard from, and its priority.
    pub master: Option<(IpAddr, u8)>,
    pub last_transition: Option<Transition>,
    pub transitions: u64,
}

impl Machine {
    pub fn new(p: Params) -> Machine {
        let master_interval = p.advert_interval;
        Machine {
            p,
            state: State::Init,
            healthy: true,
            maintenance: false,
            timer: None,
            master_interval,
            lower_master_since: None,
            master: None,
            last_transition: None,
            transitions: 0,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn params(&self) -> &Params {
        &self.p
    }

    /// The priority advertised now: the configured one, less `track_weight` while unhealthy.
    pub fn priority(&self) -> u8 {
        match (self.healthy, self.p.track_weight) {
            (false, Some(w)) if self.p.priority != 255 => self.p.priority.saturating_sub(w).max(1),
            _ => self.p.priority,
        }
    }

    /// When `on_timer` must be called next.
    pub fn deadline(&self) -> Option<Duration> {
        self.timer
    }

    /// The interval the master advertises (this node's own while it is master).
    pub fn master_interval(&self) -> Duration {
        self.master_interval
    }

    /// Skew_Time: lower priorities wait longer, so the best backup takes over first.
    fn skew(&self) -> Duration {
        self.master_interval * (256 - u32::from(self.priority())) / 256
    }

    /// Master_Down_Interval = 3 × Master_Adver_Interval + Skew_Time.
    pub fn master_down_interval(&self) -> Duration {
        self.master_interval * 3 + self.skew()
    }

    fn go(&mut self, now: Duration, to: State, reason: &'static str) {
        if self.state != to {
            self.last_transition = Some(Transition {
                at: now,
                from: self.state,
                to,
                reason,
            });
            self.transitions += 1;
            self.state = to;
        }
        self.lower_master_since = None;
    }

    fn become_master(&mut self, now: Duration, reason: &'static str, out: &mut Vec<Action>) {
        self.go(now, State::Master, reason);
        self.master = None;
        self.master_interval = self.p.advert_interval;
        out.push(Action::Send(self.priority()));
        out.push(Action::TakeVips);
        self.timer = Some(now + self.p.advert_interval);
    }

    fn become_backup(&mut self, now: Duration, reason: &'static str, out: &mut Vec<Action>) {
        if self.state == State::Master {
            out.push(Action::ReleaseVips);
        }
        self.go(now, State::Backup, reason);
        self.timer = Some(now + self.master_down_interval());
    }

    /// New parameters from a reload (the VRID and local address stay). A master advertises
    /// at once with its new priority and interval, so a backup that now outranks it (and
    /// preempts) takes over, or one that no longer does stays back; a backup's next decision
    /// (preemption, its master-down interval) uses them.
    pub fn set_params(&mut self, now: Duration, p: Params) -> Vec<Action> {
        self.p = Params {
            vrid: self.p.vrid,
            local: self.p.local,
            ..p
        };
        let mut out = Vec::new();
        if self.state == State::Master {
            self.master_interval = self.p.advert_interval;
            out.push(Action::Send(self.priority()));
            self.timer = Some(now + self.p.advert_interval);
        }
        out
    }

    /// Startup (RFC 5798 §6.4.1).
    pub fn start(&mut self, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        if self.wants_fault() {
            let reason = if self.maintenance {
                "maintenance"
            } else {
                "tracked services unhealthy"
            };
            self.go(now, State::Fault, reason);
            self.timer = None;
        } else if self.p.priority == 255 {
            self.become_master(now, "address owner (priority 255)", &mut out);
        } else {
            self.master_interval = self.p.advert_interval;
            self.become_backup(now, "start", &mut out);
        }
        out
    }

    /// The timer passed: a master advertises, a backup whose master went silent takes over.
    pub fn on_timer(&mut self, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        match (self.state, self.timer) {
            (State::Master, Some(t)) if now >= t => {
                out.push(Action::Send(self.priority()));
                // From the planned time, not `now`, so a late wakeup does not stretch the
                // interval for every later advert; but never schedule into the past.
                let next = t + self.p.advert_interval;
                self.timer = Some(if next > now {
                    next
                } else {
                    now + self.p.advert_interval
                });
            }
            (State::Backup, Some(t)) if now >= t => {
                self.become_master(now, "master down timer expired", &mut out);
            }
            _ => {}
        }
        out
    }

    /// An advertisement for this VRID from `src` (already checked: TTL, checksum, version).
    pub fn on_advert(&mut self, now: Duration, src: IpAddr, adv: &Advert) -> Vec<Action> {
        let mut out = Vec::new();
        if adv.vrid != self.p.vrid {
            return out;
        }
        let interval =
            Duration::from_millis(u64::from(adv.interval_cs) * 10).max(crate::packet::MIN_INTERVAL);
        let local = self.priority();
        match self.state {
            State::Init => {}
            State::Fault => {
                if adv.priority != 0 {
                    self.master = Some((src, adv.priority));
                }
            }
            State::Backup => {
                if adv.priority == 0 {
                    // The master resigned: take over after the skew only.
                    self.master = None;
                    self.timer = Some(now + self.skew());
                    return out;
                }
                let lower = adv.priority < local;
                if !lower {
                    self.lower_master_since = None;
                }
                let waiting = lower
                    && self.p.preempt
                    && !self.p.preempt_delay.is_zero()
                    && now < *self.lower_master_since.get_or_insert(now) + self.p.preempt_delay;
                if !self.p.preempt || !lower || waiting {
                    self.master = Some((src, adv.priority));
                    self.master_interval = interval;
                    self.timer = Some(now + self.master_down_interval());
                }
                // Otherwise: a lower-priority master this node preempts; let the timer run out.
            }
            State::Master => {
                if adv.priority == 0 {
                    // Another node resigns (it was master too): confirm at once.
                    out.push(Action::Send(local));
                    self.timer = Some(now + self.p.advert_interval);
                } else if adv.priority > local || (adv.priority == local && src > self.p.local) {
                    self.master = Some((src, adv.priority));
                    self.master_interval = interval;
                    self.become_backup(now, "higher priority master", &mut out);
                } else {
                    // A lower priority master (a split brain healing, or a node starting up):
                    // announce now so it steps down and the segment follows this node.
                    out.push(Action::Send(local));
                    out.push(Action::Reannounce);
                    self.timer = Some(now + self.p.advert_interval);
                }
            }
        }
        out
    }

    /// Whether the node must stay out: in maintenance, or unhealthy without `track_weight`.
    fn wants_fault(&self) -> bool {
        self.maintenance || (!self.healthy && self.p.track_weight.is_none())
    }

    /// Moves into or out of the fault state as `wants_fault` says.
    fn reconcile(&mut self, now: Duration, out: &mut Vec<Action>) {
        let reason = if self.maintenance {
            "maintenance"
        } else {
            "tracked services unhealthy"
        };
        match (self.wants_fault(), self.state) {
            (true, State::Master) => {
                out.push(Action::Send(0));
                out.push(Action::ReleaseVips);
                self.go(now, State::Fault, reason);
                self.timer = None;
            }
            (true, State::Backup) => {
                self.go(now, State::Fault, reason);
                self.timer = None;
            }
            (false, State::Fault) => {
                self.master_interval = self.p.advert_interval;
                let why = if self
                    .last_transition
                    .is_some_and(|t| t.reason == "maintenance")
                {
                    "maintenance ended"
                } else {
                    "tracked services healthy again"
                };
                self.become_backup(now, why, out);
            }
            _ => {}
        }
    }

    /// Fulcrum's own view of its services changed.
    pub fn set_healthy(&mut self, now: Duration, healthy: bool) -> Vec<Action> {
        let mut out = Vec::new();
        if healthy == self.healthy {
            return out;
        }
        self.healthy = healthy;
        if self.p.track_weight.is_some() && self.state == State::Master {
            // Advertise the new priority now, so a better backup preempts without delay.
            out.push(Action::Send(self.priority()));
            self.timer = Some(now + self.p.advert_interval);
        }
        if self.state != State::Init {
            self.reconcile(now, &mut out);
        }
        out
    }

    /// The operator takes the node out (F5's "force to standby"): a master resigns at once and
    /// the node takes no mastership until maintenance ends.
    pub fn set_maintenance(&mut self, now: Duration, on: bool) -> Vec<Action> {
        let mut out = Vec::new();
        if on == self.maintenance {
            return out;
        }
        self.maintenance = on;
        if self.state != State::Init {
            self.reconcile(now, &mut out);
        }
        out
    }

    pub fn maintenance(&self) -> bool {
        self.maintenance
    }

    /// Leaving: a master resigns with priority 0 so the backup takes over after its skew only.
    pub fn shutdown(&mut self, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        if self.state == State::Master {
            out.push(Action::Send(0));
            out.push(Action::ReleaseVips);
        }
        self.go(now, State::Init, "shutdown");
        self.timer = None;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn params(priority: u8, local: [u8; 4]) -> Params {
        Params {
            vrid: 51,
            priority,
            advert_interval: 100 * MS,
            preempt: true,
            preempt_delay: Duration::ZERO,
            local: IpAddr::from(local),
            track_weight: None,
        }
    }

    fn advert(priority: u8) -> Advert {
        Advert {
            version: 3,
            vrid: 51,
            priority,
            interval_cs: 10,
            addresses: vec![IpAddr::from([198, 18, 0, 100])],
        }
    }

    const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));

    /// Runs the timers of `m` from `from` to `to` in 1 ms steps; returns every action with its time.
    fn run(m: &mut Machine, from: Duration, to: Duration) -> Vec<(Duration, Action)> {
        let mut out = Vec::new();
        let mut t = from;
        while t <= to {
            out.extend(m.on_timer(t).into_iter().map(|a| (t, a)));
            t += MS;
        }
        out
    }

    #[test]
    fn backup_takes_over_after_three_intervals_and_skew() {
        let mut m = Machine::new(params(100, [198, 18, 0, 1]));
        assert!(m.start(Duration::ZERO).is_empty());
        assert_eq!(m.state(), State::Backup);
        // 3 × 100 ms + (256 − 100) × 100 ms / 256 = 360.9 ms.
        assert_eq!(m.master_down_interval(), Duration::from_nanos(360_937_500));
        let acts = run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(acts[0], (361 * MS, Action::Send(100)));
        assert_eq!(acts[1], (361 * MS, Action::TakeVips));
        assert_eq!(m.state(), State::Master);
        // Then one advert per interval.
        let sends: Vec<_> = acts
            .iter()
            .filter(|(_, a)| *a == Action::Send(100))
            .collect();
        assert_eq!(sends.len(), 1);
        let more = run(&mut m, 401 * MS, 1000 * MS);
        assert_eq!(more.len(), 6, "{more:?}");
        assert_eq!(more[0].0, 461 * MS);
    }

    #[test]
    fn new_params_reach_a_master_at_once() {
        let mut m = Machine::new(params(100, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(m.state(), State::Master);
        let mut p = params(50, [203, 0, 113, 9]);
        p.advert_interval = 200 * MS;
        p.vrid = 99;
        assert_eq!(m.set_params(400 * MS, p), [Action::Send(50)]);
        // The VRID and local address stay; the interval is the new one.
        assert_eq!(m.params().vrid, params(100, [198, 18, 0, 1]).vrid);
        assert_eq!(m.params().local, IpAddr::from([198, 18, 0, 1]));
        assert_eq!(m.master_interval(), 200 * MS);
        assert_eq!(m.deadline(), Some(600 * MS));
        // A backup only changes what it decides next.
        let mut b = Machine::new(params(100, [198, 18, 0, 1]));
        b.start(Duration::ZERO);
        assert!(b.set_params(MS, params(200, [198, 18, 0, 1])).is_empty());
        assert_eq!(b.priority(), 200);
    }

    #[test]
    fn adverts_from_a_better_master_hold_the_backup() {
        let mut m = Machine::new(params(100, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        for i in 0..50u64 {
            let now = Duration::from_millis(i * 100);
            assert!(m.on_advert(now, PEER, &advert(150)).is_empty());
            assert!(m.on_timer(now + 99 * MS).is_empty());
        }
        assert_eq!(m.state(), State::Backup);
        assert_eq!(m.master, Some((PEER, 150)));
        // Silence: three intervals and skew after the last advert, the backup is master.
        let last = Duration::from_millis(4900);
        let acts = run(&mut m, last, last + 400 * MS);
        assert_eq!(acts[0].0, last + 361 * MS);
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn a_resigning_master_is_replaced_after_the_skew_only() {
        let mut m = Machine::new(params(100, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        m.on_advert(Duration::ZERO, PEER, &advert(150));
        m.on_advert(50 * MS, PEER, &advert(0));
        let acts = run(&mut m, 50 * MS, 200 * MS);
        // Skew: (256 − 100) × 100 ms / 256 = 60.9 ms.
        assert_eq!(acts[0], (111 * MS, Action::Send(100)));
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn preemption_and_its_delay() {
        // A higher-priority node hears a lower-priority master: it lets the master-down timer
        // expire and takes over.
        let mut m = Machine::new(params(200, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        for i in 0..10u64 {
            let now = Duration::from_millis(i * 100);
            m.on_advert(now, PEER, &advert(100));
            run(&mut m, now, now + 99 * MS);
        }
        assert_eq!(m.state(), State::Master);

        // Without preemption it stays backup.
        let mut p = params(200, [198, 18, 0, 1]);
        p.preempt = false;
        let mut m = Machine::new(p);
        m.start(Duration::ZERO);
        for i in 0..100u64 {
            let now = Duration::from_millis(i * 100);
            m.on_advert(now, PEER, &advert(100));
            m.on_timer(now + 50 * MS);
        }
        assert_eq!(m.state(), State::Backup);

        // With a 2 s preempt delay it takes over between 2 s and 2 s + master down after the
        // first advert of the lower master.
        let mut p = params(200, [198, 18, 0, 1]);
        p.preempt_delay = Duration::from_secs(2);
        let mut m = Machine::new(p);
        m.start(Duration::ZERO);
        let mut took = None;
        for i in 0..40u64 {
            let now = Duration::from_millis(i * 100);
            m.on_advert(now, PEER, &advert(100));
            for step in 0..100u32 {
                if !m.on_timer(now + step * MS).is_empty() && took.is_none() {
                    took = Some(now + step * MS);
                }
            }
        }
        let took = took.expect("preempted");
        assert!(took >= Duration::from_secs(2), "{took:?}");
        assert!(took <= Duration::from_millis(2400), "{took:?}");
    }

    #[test]
    fn master_yields_to_higher_priority_and_to_higher_address_on_a_tie() {
        let mut m = Machine::new(params(255, [198, 18, 0, 1]));
        let acts = m.start(Duration::ZERO);
        assert_eq!(acts, vec![Action::Send(255), Action::TakeVips]);
        let mut m = Machine::new(params(100, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(m.state(), State::Master);
        // Same priority, lower address: the master answers and stays.
        let low = IpAddr::from([198, 18, 0, 0]);
        assert_eq!(
            m.on_advert(500 * MS, low, &advert(100)),
            vec![Action::Send(100), Action::Reannounce]
        );
        // Same priority, higher address: it yields.
        assert_eq!(
            m.on_advert(510 * MS, PEER, &advert(100)),
            vec![Action::ReleaseVips]
        );
        assert_eq!(m.state(), State::Backup);
        assert_eq!(
            m.last_transition.map(|t| (t.from, t.to)),
            Some((State::Master, State::Backup))
        );
    }

    #[test]
    fn split_brain_heals_to_one_master() {
        // Two masters that could not hear each other; once they do, exactly one remains.
        let a_ip = IpAddr::from([198, 18, 0, 1]);
        let b_ip = IpAddr::from([198, 18, 0, 2]);
        let mut a = Machine::new(params(150, [198, 18, 0, 1]));
        let mut b = Machine::new(params(100, [198, 18, 0, 2]));
        a.start(Duration::ZERO);
        b.start(Duration::ZERO);
        run(&mut a, Duration::ZERO, 400 * MS);
        run(&mut b, Duration::ZERO, 400 * MS);
        assert_eq!((a.state(), b.state()), (State::Master, State::Master));
        // Deliver every advert both ways from now on.
        let mut t = 401 * MS;
        while t < 2000 * MS {
            for act in a.on_timer(t) {
                if let Action::Send(p) = act {
                    b.on_advert(t, a_ip, &advert(p));
                }
            }
            for act in b.on_timer(t) {
                if let Action::Send(p) = act {
                    for back in a.on_advert(t, b_ip, &advert(p)) {
                        if let Action::Send(p) = back {
                            b.on_advert(t, a_ip, &advert(p));
                        }
                    }
                }
            }
            t += MS;
        }
        assert_eq!((a.state(), b.state()), (State::Master, State::Backup));
    }

    #[test]
    fn fault_resigns_and_recovery_returns_to_backup() {
        let mut m = Machine::new(params(150, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(m.state(), State::Master);
        assert_eq!(
            m.set_healthy(500 * MS, false),
            vec![Action::Send(0), Action::ReleaseVips]
        );
        assert_eq!(m.state(), State::Fault);
        assert!(run(&mut m, 500 * MS, 5000 * MS).is_empty(), "no takeover");
        assert!(m.set_healthy(5000 * MS, true).is_empty());
        assert_eq!(m.state(), State::Backup);
        run(&mut m, 5000 * MS, 5500 * MS);
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn maintenance_resigns_and_holds_until_it_ends() {
        let mut p = params(150, [198, 18, 0, 1]);
        p.track_weight = Some(10);
        let mut m = Machine::new(p);
        m.start(Duration::ZERO);
        run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(
            m.set_maintenance(500 * MS, true),
            vec![Action::Send(0), Action::ReleaseVips]
        );
        assert_eq!(m.state(), State::Fault);
        assert_eq!(m.last_transition.map(|t| t.reason), Some("maintenance"));
        // Health coming and going does not end it.
        assert!(m.set_healthy(600 * MS, false).is_empty());
        assert!(m.set_healthy(700 * MS, true).is_empty());
        assert!(run(&mut m, 700 * MS, 3000 * MS).is_empty());
        assert!(m.set_maintenance(3000 * MS, false).is_empty());
        assert_eq!(m.state(), State::Backup);
        assert_eq!(
            m.last_transition.map(|t| t.reason),
            Some("maintenance ended")
        );
        // Started in maintenance: straight to fault.
        let mut m = Machine::new(params(255, [198, 18, 0, 1]));
        m.set_maintenance(Duration::ZERO, true);
        assert!(m.start(Duration::ZERO).is_empty());
        assert_eq!(m.state(), State::Fault);
    }

    #[test]
    fn track_weight_lowers_the_priority_instead() {
        let mut p = params(150, [198, 18, 0, 1]);
        p.track_weight = Some(100);
        let mut m = Machine::new(p);
        m.start(Duration::ZERO);
        run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(m.set_healthy(500 * MS, false), vec![Action::Send(50)]);
        assert_eq!(m.priority(), 50);
        // A priority-100 backup now preempts it; the master yields when it hears it.
        assert_eq!(
            m.on_advert(600 * MS, PEER, &advert(100)),
            vec![Action::ReleaseVips]
        );
    }

    #[test]
    fn shutdown_resigns_only_as_master() {
        let mut m = Machine::new(params(150, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        assert!(m.shutdown(10 * MS).is_empty());
        let mut m = Machine::new(params(150, [198, 18, 0, 1]));
        m.start(Duration::ZERO);
        run(&mut m, Duration::ZERO, 400 * MS);
        assert_eq!(
            m.shutdown(500 * MS),
            vec![Action::Send(0), Action::ReleaseVips]
        );
        assert_eq!(m.deadline(), None);
    }

    #[test]
    fn ten_millisecond_adverts() {
        let mut p = params(100, [198, 18, 0, 1]);
        p.advert_interval = 10 * MS;
        let mut m = Machine::new(p);
        m.start(Duration::ZERO);
        // 30 ms + 6.09 ms.
        let acts = run(&mut m, Duration::ZERO, 100 * MS);
        assert_eq!(acts[0], (37 * MS, Action::Send(100)));
        assert_eq!(
            acts.iter()
                .filter(|(_, a)| matches!(a, Action::Send(_)))
                .count(),
            7
        );
    }
}
