//! The back-off probe: members that passive observation took down in a pool without monitors
//! have nothing else that could bring them back, so they are probed with TCP connects, less
//! often the longer they stay unreachable.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use fulcrum_balance::{Member, Pool};
use tokio::time::MissedTickBehavior;

use crate::check::{connect, Probe};
use crate::task::Task;

/// How often the supervisor looks for members to probe, and the back-off of each probe.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbeTiming {
    pub scan: Duration,
    pub first: Duration,
    pub max: Duration,
}

impl Default for ProbeTiming {
    fn default() -> Self {
        ProbeTiming {
            scan: Duration::from_secs(1),
            first: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl ProbeTiming {
    /// The wait before probe number `n` (0-based): first, 2×first, 4×first … capped at max.
    pub fn delay(&self, n: u32) -> Duration {
        self.first
            .checked_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max)
    }
}

type Key = (Arc<str>, SocketAddr);

/// Watches every member of the applied pools; runs one probe loop per member that needs one.
pub(crate) async fn supervise(pools: Arc<ArcSwap<Vec<Arc<Pool>>>>, timing: ProbeTiming) {
    let mut probes: HashMap<Key, (Arc<Member>, Task)> = HashMap::new();
    let mut scan = tokio::time::interval(timing.scan);
    scan.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        scan.tick().await;
        let pools = pools.load();
        let mut wanted: HashSet<Key> = HashSet::new();
        for pool in pools.iter() {
            for member in pool.members() {
                if !member.health.needs_probe() {
                    continue;
                }
                let key = (pool.name.clone(), member.address);
                wanted.insert(key.clone());
                let running = probes
                    .get(&key)
                    .is_some_and(|(m, t)| Arc::ptr_eq(m, member) && !t.is_finished());
                if !running {
                    tracing::debug!(pool = %pool.name, member = %member.label, "probing a passively downed member");
                    let task = Task::spawn(probe_member(
                        member.clone(),
                        pool.connect_timeout,
                        timing,
                        pool.is_datagram(),
                        pool.config.vrf.clone(),
                    ));
                    probes.insert(key, (member.clone(), task));
                }
            }
        }
        // Dropping a Task aborts it: members that came back, left their pool, or got monitors.
        probes.retain(|key, (_, task)| wanted.contains(key) && !task.is_finished());
    }
}

async fn probe_member(
    member: Arc<Member>,
    timeout: Duration,
    timing: ProbeTiming,
    datagram: bool,
    vrf: Option<String>,
) {
    let mut attempt = 0;
    loop {
        tokio::time::sleep(timing.delay(attempt)).await;
        if !member.health.needs_probe() {
            return;
        }
        let result = if datagram {
            udp_probe(member.address, timeout).await
        } else {
            connect(&Probe::new(member.address, None, timeout).in_vrf(vrf.as_deref()))
                .await
                .map(|_| "connected")
        };
        match result {
            Ok(detail) => {
                member.record_probe(true, detail);
                return;
            }
            Err(detail) => {
                tracing::debug!(pool = %member.pool, member = %member.label, %detail, next = ?timing.delay(attempt + 1), "probe failed");
                member.record_probe(false, &detail);
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

/// Reachability of a UDP member: an empty datagram from a connected socket. A reply, or no ICMP
/// error within `timeout`, means the port is open (a UDP service need not answer an empty
/// datagram); an ICMP error (port unreachable, host unreachable) reads back as a failed receive.
async fn udp_probe(addr: SocketAddr, timeout: Duration) -> Result<&'static str, String> {
    let local: SocketAddr = if addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        ([0, 0, 0, 0], 0).into()
    };
    let io = |e: std::io::Error| format!("udp probe: {}", crate::text::io_error(&e));
    let socket = tokio::net::UdpSocket::bind(local).await.map_err(io)?;
    socket.connect(addr).await.map_err(io)?;
    socket.send(&[]).await.map_err(io)?;
    let mut buf = [0u8; 512];
    match tokio::time::timeout(timeout, socket.recv(&mut buf)).await {
        Ok(Ok(_)) => Ok("answered"),
        Ok(Err(e)) => Err(io(e)),
        Err(_) => Ok("no ICMP error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_up_to_the_cap() {
        let t = ProbeTiming::default();
        let secs: Vec<u64> = (0..8).map(|n| t.delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(t.delay(40), Duration::from_secs(30));
        assert_eq!(t.delay(u32::MAX), Duration::from_secs(30));
    }
}
