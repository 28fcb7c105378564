//! `ha.sync` of the connection tables: the program reports every new flow (`flow_events`); a
//! thread drains them and names them for the peer as `Flow`s (by service name and member
//! address: the peer numbers its VIPs and reals its own way), and the peer's flows are written
//! into this node's tables. The transport is the binary's (the HA stream): flows leave through
//! a `FlowSink` and arrive through `FlowSync::apply`.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::neighbours::{interface_name, local_interface};
use crate::tables::State;
use crate::{
    addr_words, port_raw, Conn, FlowEvent, FlowEvents, FlowKey, Global, NatEntry, VipKey,
    CONN_F_SYNCED, MODE_MASK, MODE_NAT,
};

/// A flow as the peers know it: by names and addresses, not by this node's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// The virtual service.
    pub vs: String,
    pub client: SocketAddr,
    /// The VIP and port the client sent to.
    pub vip: SocketAddr,
    /// IP protocol: 6 (TCP) or 17 (UDP).
    pub proto: u8,
    /// The member the flow goes to (a pool member's address).
    pub member: SocketAddr,
    /// nat: where replies to the client go (absent for dr / tunnel).
    pub hop: Option<Hop>,
    /// How long the flow has been idle on the sender (ms): 0 for a new flow.
    pub idle_ms: u64,
}

/// The way back to the client of a nat flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The client's (or its router's) MAC address.
    pub mac: [u8; 6],
    /// The interface the flow came in on (by name: a pair names its interfaces alike).
    pub interface: String,
}

/// Where a new flow goes: the HA plane's bounded queue (false: it was full).
pub type FlowSink = Box<dyn Fn(Flow) -> bool + Send + Sync>;

/// What the drain thread needs to name a flow event: this node's numbers to names.
#[derive(Default)]
struct Names {
    /// Real index -> member address.
    reals: HashMap<u32, SocketAddr>,
    /// VIP index -> (service name, nat).
    vips: HashMap<u32, (String, bool)>,
}

#[derive(Default)]
struct FlowCounters {
    /// New flows (and refreshes of active ones) queued for the peers.
    sent: AtomicU64,
    /// Flows not queued: the queue was full (the kernel's own losses are `sync_events_lost`).
    lost: AtomicU64,
    /// Flows received from a peer.
    received: AtomicU64,
    /// Received flows written into this node's tables.
    applied: AtomicU64,
    /// Received flows of a service, member or interface this node does not have.
    dropped: AtomicU64,
}

/// `ha.sync` of the connection tables: new flows out to the HA stream, the peer's in.
pub struct FlowSync {
    state: Arc<Mutex<Option<State>>>,
    sink: OnceLock<FlowSink>,
    names: RwLock<Names>,
    counters: FlowCounters,
    /// Lags (ms) of the last batches that carried flows.
    lags: Mutex<VecDeque<f64>>,
}

/// How often the flows active since the last time are sent again, so that the peer's entries
/// of long flows do not expire while the flow lives here (IPVS's sync daemon resends a
/// connection every `sync_refresh_period` for the same reason): a third of the shortest
/// timeout, within these bounds.
const REFRESH_MIN: Duration = Duration::from_secs(5);
const REFRESH_MAX: Duration = Duration::from_secs(300);
/// Events taken from the ring buffer per wakeup.
const DRAIN_MAX: usize = 4096;

/// The period of `drain_flow_events`' refresh for services whose shortest idle timeout is
/// `shortest` (none: no service yet).
pub fn refresh_period(shortest: Option<Duration>) -> Duration {
    shortest
        .unwrap_or(REFRESH_MAX)
        .div_f64(3.0)
        .clamp(REFRESH_MIN, REFRESH_MAX)
}

fn ip_of(words: [u32; 4], family: u8) -> IpAddr {
    let b = |w: u32| w.to_ne_bytes();
    if family == 4 {
        IpAddr::from(b(words[0]))
    } else {
        let mut o = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&b(*w));
        }
        IpAddr::from(o)
    }
}

fn port_of(raw: u16) -> u16 {
    u16::from_be_bytes(raw.to_ne_bytes())
}

/// (client, VIP) of a client -> VIP flow key.
fn flow_addrs(k: &FlowKey) -> (SocketAddr, SocketAddr) {
    (
        SocketAddr::new(ip_of(k.src, k.family), port_of(k.sport)),
        SocketAddr::new(ip_of(k.dst, k.family), port_of(k.dport)),
    )
}

/// Milliseconds of wall-clock time, the clock of the peer's `sent_ms`.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl FlowSync {
    /// The flow sync of the program that `state` holds once loaded.
    pub fn new(state: Arc<Mutex<Option<State>>>) -> FlowSync {
        FlowSync {
            state,
            sink: OnceLock::new(),
            names: RwLock::new(Names::default()),
            counters: FlowCounters::default(),
            lags: Mutex::new(VecDeque::new()),
        }
    }

    /// Turns the stream of new flows on (ha.sync has started): each goes to `sink`.
    pub fn set_sink(&self, sink: FlowSink) {
        let _ = self.sink.set(sink);
    }

    /// After the services and reals of `st` changed: the names the drain thread gives events.
    pub fn set_names(&self, st: &State) {
        *self.names.write() = Names {
            reals: st.reals.iter().map(|(a, r)| (r.index, *a)).collect(),
            vips: st
                .services
                .iter()
                .map(|s| (s.index, (s.name.clone(), s.flags & MODE_MASK == MODE_NAT)))
                .collect(),
        };
    }

    fn send(&self, f: Flow) {
        let Some(sink) = self.sink.get() else { return };
        if sink(f) {
            self.counters.sent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The drain thread's naming of an event: `None` when its VIP or real is gone (a reload).
    /// `ifnames` caches interface names (if_indextoname costs a socket and an ioctl).
    fn entry(&self, ev: &FlowEvent, ifnames: &mut HashMap<u32, String>) -> Option<Flow> {
        let names = self.names.read();
        let (vs, nat) = names.vips.get(&ev.vip_index)?;
        let member = *names.reals.get(&ev.real)?;
        let (client, vip) = flow_addrs(&ev.key);
        let hop = if *nat {
            let interface = match ifnames.get(&ev.ifindex) {
                Some(n) => n.clone(),
                None => {
                    let n = interface_name(ev.ifindex)?;
                    ifnames.insert(ev.ifindex, n.clone());
                    n
                }
            };
            Some(Hop {
                mac: ev.client_mac,
                interface,
            })
        } else {
            None
        };
        Some(Flow {
            vs: vs.clone(),
            client,
            vip,
            proto: ev.key.proto,
            member,
            hop,
            idle_ms: 0,
        })
    }

    /// Every live flow of this node, with its age, for a peer that (re)connects; with
    /// `active_within`, the periodic refresh: only flows that had a packet *here* that
    /// recently (not the peer's flows this node holds for it, which would echo back and
    /// forth and never expire).
    pub fn dump(&self, active_within: Option<Duration>) -> Vec<Flow> {
        let guard = self.state.lock();
        let Some(st) = guard.as_ref() else {
            return Vec::new();
        };
        let (Ok(now), Ok(conns)) = (st.dp.now(), st.dp.connections()) else {
            return Vec::new();
        };
        let hz = st.dp.hz();
        let ticks = |d: Duration| (d.as_millis() as u64).saturating_mul(hz) / 1000;
        let by_index: HashMap<u32, SocketAddr> =
            st.reals.iter().map(|(a, r)| (r.index, *a)).collect();
        let mut ifnames: HashMap<u32, Option<String>> = HashMap::new();
        let mut out = Vec::new();
        for (k, c) in conns {
            let idle = if k.proto == 17 {
                st.timeouts.1
            } else {
                st.timeouts.0
            };
            let age = now.saturating_sub(c.last);
            if age >= ticks(idle) || active_within.is_some_and(|w| age > ticks(w)) {
                continue;
            }
            if active_within.is_some() && c.flags & CONN_F_SYNCED != 0 {
                continue;
            }
            let vk = VipKey {
                addr: k.dst,
                port: k.dport,
                proto: k.proto,
                family: k.family,
            };
            let Some(svc) = vip_candidates(vk)
                .iter()
                .find_map(|c| st.services.iter().find(|s| s.keys.contains(c)))
            else {
                continue;
            };
            let Some(member) = by_index.get(&c.real).copied() else {
                continue;
            };
            let (client, vip) = flow_addrs(&k);
            let hop = if svc.flags & MODE_MASK == MODE_NAT {
                let nat_port = st.reals.get(&member).map_or(0, |r| r.nat_port);
                let rk = reply_key(member, nat_port, client, vip, k.proto);
                let Some(ne) = st.dp.nat_entry(&rk).ok().flatten() else {
                    continue;
                };
                let name = ifnames
                    .entry(ne.ifindex)
                    .or_insert_with(|| interface_name(ne.ifindex))
                    .clone();
                let Some(interface) = name else { continue };
                Some(Hop {
                    mac: ne.client_mac,
                    interface,
                })
            } else {
                None
            };
            out.push(Flow {
                vs: svc.name.clone(),
                client,
                vip,
                proto: k.proto,
                member,
                hop,
                idle_ms: age.saturating_mul(1000) / hz.max(1),
            });
        }
        out
    }

    /// Writes a peer's flows into this node's tables: the connection entry on every CPU with
    /// this node's real index for the member's address, and for nat the reply entry through
    /// this node's interface of the same name. Flows of a service, VIP, member or interface
    /// this node does not have are dropped and counted.
    pub fn apply(&self, flows: &[Flow], sent_ms: u64) {
        if flows.is_empty() {
            return;
        }
        let c = &self.counters;
        c.received.fetch_add(flows.len() as u64, Ordering::Relaxed);
        let mut guard = self.state.lock();
        let Some(st) = guard.as_mut() else {
            c.dropped.fetch_add(flows.len() as u64, Ordering::Relaxed);
            return;
        };
        let Ok(now) = st.dp.now() else {
            c.dropped.fetch_add(flows.len() as u64, Ordering::Relaxed);
            return;
        };
        let hz = st.dp.hz();
        let mut interfaces: HashMap<&str, Option<(u32, [u8; 6])>> = HashMap::new();
        let (mut applied, mut dropped) = (0u64, 0u64);
        for f in flows {
            // The sender's age of the flow, so the entry expires here when it would there.
            let last = now.saturating_sub(f.idle_ms.saturating_mul(hz) / 1000);
            let written = (|| {
                let vk = VipKey::new(f.vip.ip(), f.vip.port(), f.proto);
                let svc = st.services.iter().find(|s| {
                    s.name == f.vs && vip_candidates(vk).iter().any(|c| s.keys.contains(c))
                })?;
                if !svc.pool.members().iter().any(|m| m.address == f.member) {
                    return None;
                }
                let real = st.reals.get(&f.member)?;
                let nat = if svc.flags & MODE_MASK == MODE_NAT {
                    let hop = f.hop.as_ref()?;
                    let (ifindex, local_mac) = (*interfaces
                        .entry(hop.interface.as_str())
                        .or_insert_with(|| local_interface(&hop.interface)))?;
                    let (vip_addr, _) = addr_words(f.vip.ip());
                    let entry = NatEntry {
                        vip_addr,
                        vip_port: port_raw(f.vip.port()),
                        client_mac: hop.mac,
                        local_mac,
                        ifindex,
                        vip_index: svc.index,
                        last,
                        ..NatEntry::default()
                    };
                    Some((
                        reply_key(f.member, real.nat_port, f.client, f.vip, f.proto),
                        entry,
                    ))
                } else {
                    None
                };
                let key = FlowKey::new(
                    f.client.ip(),
                    f.client.port(),
                    f.vip.ip(),
                    f.vip.port(),
                    f.proto,
                );
                let conn = Conn {
                    real: real.index,
                    flags: CONN_F_SYNCED,
                    last,
                    ..Conn::default()
                };
                st.dp.set_conn(key, conn).ok()?;
                if let Some((rk, entry)) = nat {
                    st.dp.set_nat_entry(rk, entry).ok()?;
                }
                Some(())
            })();
            match written {
                Some(()) => applied += 1,
                None => dropped += 1,
            }
        }
        c.applied.fetch_add(applied, Ordering::Relaxed);
        c.dropped.fetch_add(dropped, Ordering::Relaxed);
        if dropped > 0 {
            tracing::debug!(
                dropped,
                "HA sync: flows of services or members this node does not have were dropped"
            );
        }
        let lag = wall_ms().saturating_sub(sent_ms) as f64;
        let mut lags = self.lags.lock();
        if lags.len() == 256 {
            lags.pop_front();
        }
        lags.push_back(lag);
    }

    /// Counters for `sync.flows` of `GET /api/v1/ha` and the metrics.
    pub fn counts(&self) -> [(&'static str, u64); 5] {
        let c = &self.counters;
        let kernel_lost = self
            .state
            .lock()
            .as_ref()
            .and_then(|st| st.dp.global(Global::SyncLost).ok())
            .unwrap_or(0);
        [
            ("sent", c.sent.load(Ordering::Relaxed)),
            ("lost", c.lost.load(Ordering::Relaxed) + kernel_lost),
            ("received", c.received.load(Ordering::Relaxed)),
            ("applied", c.applied.load(Ordering::Relaxed)),
            ("dropped", c.dropped.load(Ordering::Relaxed)),
        ]
    }

    /// The last flow batch's lag and the largest of the last 256 (ms).
    pub fn lags(&self) -> (Option<f64>, Option<f64>) {
        let lags = self.lags.lock();
        (lags.back().copied(), lags.iter().copied().reduce(f64::max))
    }

    /// The last flow batch's lag (ms).
    pub fn lag_ms(&self) -> Option<f64> {
        self.lags.lock().back().copied()
    }
}

/// The key of a nat flow's replies: member -> client.
fn reply_key(
    member: SocketAddr,
    nat_port: u16,
    client: SocketAddr,
    vip: SocketAddr,
    proto: u8,
) -> FlowKey {
    let sport = if nat_port != 0 { nat_port } else { vip.port() };
    FlowKey::new(member.ip(), sport, client.ip(), client.port(), proto)
}

/// Drains the program's flow events into the HA stream until the program is unloaded, and
/// resends the recently active flows every `refresh` (`refresh_period`). `alive` is the
/// loaded program's (`State::new`).
pub fn drain_flow_events(
    mut events: FlowEvents,
    flows: Arc<FlowSync>,
    alive: Weak<()>,
    refresh: Duration,
) {
    let mut last_refresh = Instant::now();
    // Interface names by index, forgotten at every refresh (an interface may be renamed).
    let mut ifnames = HashMap::new();
    while alive.upgrade().is_some() {
        let got = events.read(Duration::from_millis(200), DRAIN_MAX);
        if flows.sink.get().is_none() {
            continue;
        }
        for ev in &got {
            match flows.entry(ev, &mut ifnames) {
                Some(e) => flows.send(e),
                None => {
                    flows.counters.lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if last_refresh.elapsed() >= refresh {
            // Flows with a packet since the last refresh (and a margin for the walk itself).
            let active = flows.dump(Some(refresh + refresh / 4));
            let n = active.len();
            for e in active {
                flows.send(e);
            }
            tracing::debug!(flows = n, "HA sync: active flows sent again");
            last_refresh = Instant::now();
            ifnames.clear();
        }
    }
}

/// The VIP keys a flow to `vk` may belong to, in the program's lookup order: the exact port,
/// the protocol's port 0 (every port), the address's ip VIP (every protocol).
fn vip_candidates(vk: VipKey) -> [VipKey; 3] {
    [
        vk,
        VipKey { port: 0, ..vk },
        VipKey {
            port: 0,
            proto: crate::VIP_PROTO_ANY,
            ..vk
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_keys_name_their_addresses_for_the_peer() {
        for (client, vip, member) in [
            ("198.18.0.2:40000", "198.18.10.1:80", "198.18.1.21:8080"),
            (
                "[2001:db8::2]:40000",
                "[2001:db8:10::1]:53",
                "[2001:db8:1::11]:53",
            ),
        ] {
            let (c, v, m): (SocketAddr, SocketAddr, SocketAddr) = (
                client.parse().expect("addr"),
                vip.parse().expect("addr"),
                member.parse().expect("addr"),
            );
            let k = FlowKey::new(c.ip(), c.port(), v.ip(), v.port(), 6);
            assert_eq!(flow_addrs(&k), (c, v));
            // The nat reply: member (its own port, or the VIP's) -> client.
            assert_eq!(
                reply_key(m, m.port(), c, v, 6),
                FlowKey::new(m.ip(), m.port(), c.ip(), c.port(), 6)
            );
            assert_eq!(
                reply_key(m, 0, c, v, 17),
                FlowKey::new(m.ip(), v.port(), c.ip(), c.port(), 17)
            );
        }
    }
}
