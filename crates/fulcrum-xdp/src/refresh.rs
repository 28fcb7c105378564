//! Keeping the maps current: rings, reals and the connection table follow the members'
//! health, state and weights, next hops are resolved (`neighbours::resolve`) and checked again,
//! retired member numbers are reclaimed and capped services' flows recounted. `refresh` runs
//! after every configuration the binary writes and on a thread of its own (`spawn`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_config::AdminState;
use parking_lot::Mutex;

use crate::neighbours::{fmt_mac, resolve};
use crate::tables::{Service, State};
use crate::{build_ring, Real};

/// How often the refresh thread (`spawn`) runs `refresh`.
const REFRESH_EVERY: Duration = Duration::from_millis(200);
/// An unresolved next hop is looked up again this often.
const RESOLVE_EVERY: Duration = Duration::from_secs(1);
/// A resolved next hop is looked up again this often (a member's NIC or router may change).
const REVERIFY_EVERY: Duration = Duration::from_secs(30);

/// A service with `flow_limits.max`: its live flows are recounted this often (the program
/// cannot see flows leave by idling out or LRU eviction). A walk of the connection table, about
/// two bpf() calls per entry: measured 2.7 µs per flow (bench/xdp.sh, 2 CPUs), so ~0.7 s for a
/// full default table (262,144 flows), during which the plane's lock is held.
const RECOUNT_EVERY: Duration = Duration::from_secs(5);

/// Starts the thread that refreshes the loaded program in `state` every 200 ms while `running`.
pub fn spawn(state: Arc<Mutex<Option<State>>>, running: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("fulcrum-xdp".into())
        .spawn(move || {
            while running.load(Ordering::Acquire) {
                std::thread::sleep(REFRESH_EVERY);
                if let Some(st) = state.lock().as_mut() {
                    refresh(st);
                }
            }
        })
        .map(drop)
}

/// Members in no pool any more: their numbers retire (their flows keep them, see RealSlots);
/// refresh rewrites the rings without them.
pub fn retire_unlisted_reals(st: &mut State, services: &[Service]) {
    let listed: HashSet<SocketAddr> = services
        .iter()
        .flat_map(|s| s.pool.members().iter().map(|m| m.address))
        .collect();
    let (slots, now) = (&mut st.slots, Instant::now());
    st.reals.retain(|addr, r| {
        let keep = listed.contains(addr);
        if !keep {
            slots.retire(r.index, now);
        }
        keep
    });
}

/// Recounts the live flows of the services with `flow_limits.max` (see RECOUNT_EVERY).
fn recount(st: &mut State) {
    if st.last_recount.is_some_and(|t| t.elapsed() < RECOUNT_EVERY) {
        return;
    }
    st.last_recount = Some(Instant::now());
    let capped: Vec<u32> = st
        .services
        .iter()
        .filter(|s| s.limits.is_some_and(|l| l.max > 0))
        .map(|s| s.index)
        .collect();
    if capped.is_empty() {
        st.flow_counts.clear();
        return;
    }
    match st.dp.recount_flows(&capped) {
        Ok(counts) => st.flow_counts = counts,
        Err(e) => tracing::warn!(error = %e, "XDP: recounting the flows of capped services failed"),
    }
}

/// Brings rings, reals and the connection table in line with members' health, state, weights.
pub fn refresh(st: &mut State) {
    recount(st);
    if st.slots.retiring() > 0 {
        match st.slots.reclaim(&mut st.dp, Instant::now()) {
            Ok(0) => {}
            Ok(n) => tracing::debug!(freed = n, "XDP member numbers freed"),
            Err(e) => tracing::warn!(error = %e, "XDP: freeing member numbers failed"),
        }
    }
    let now = fulcrum_balance::clock::now_ms();
    // Next hops first: a member without a MAC cannot get slots.
    let mut to_resolve: Vec<SocketAddr> = Vec::new();
    for (addr, r) in &st.reals {
        let every = if r.resolved {
            REVERIFY_EVERY
        } else {
            RESOLVE_EVERY
        };
        if r.last_try.is_none_or(|t| t.elapsed() >= every) {
            to_resolve.push(*addr);
        }
    }
    for addr in to_resolve {
        let resolved = resolve(addr.ip());
        if let Some(r) = st.reals.get_mut(&addr) {
            r.last_try = Some(Instant::now());
            if let Some((mac, ifindex)) = resolved {
                if r.resolved && r.hop == Some((mac, ifindex)) {
                    continue;
                }
                let real = Real::new(addr.ip(), mac, r.nat_port, ifindex);
                match st.dp.set_real(r.index, real) {
                    Ok(()) => {
                        r.resolved = true;
                        r.hop = Some((mac, ifindex));
                        tracing::info!(member = %addr, mac = %fmt_mac(mac), ifindex, "XDP member next hop resolved");
                    }
                    Err(e) => {
                        tracing::warn!(member = %addr, error = %e, "XDP member update failed")
                    }
                }
            }
        }
    }
    for svc in &mut st.services {
        let members = svc.pool.members();
        let mut weights = Vec::with_capacity(members.len());
        let mut ids = Vec::with_capacity(members.len());
        for m in members {
            let real = st.reals.get_mut(&m.address);
            let (id, resolved) = real.as_ref().map_or((0, false), |r| (r.index, r.resolved));
            ids.push(id);
            let w = if resolved && m.accepts_new(now) {
                m.effective_weight().max(1)
            } else {
                0
            };
            weights.push(w);
            // Down or disabled: its flows go (clients are rescheduled); drain keeps them.
            let gone = !m.health.is_up() || m.effective_state() == AdminState::Disabled;
            if let Some(r) = real {
                if gone && !r.forgotten {
                    match st.dp.forget_real(r.index) {
                        Ok(n) => {
                            r.forgotten = true;
                            tracing::info!(member = %m.address, flows = n, "XDP: member out, its flows dropped");
                        }
                        Err(e) => {
                            tracing::warn!(member = %m.address, error = %e, "XDP: dropping flows failed")
                        }
                    }
                } else if !gone {
                    r.forgotten = false;
                }
            }
        }
        let names: Vec<String> = members.iter().map(|m| m.label.to_string()).collect();
        if weights != svc.weights || svc.built_from.0 != names || svc.built_from.1 != ids {
            let ring = build_ring(&names, &weights, &ids);
            match st.dp.set_ring(svc.index, &ring) {
                Ok(changed) => {
                    tracing::debug!(service = %svc.name, changed, "XDP ring updated");
                    svc.weights = weights;
                    svc.built_from = (names, ids);
                }
                Err(e) => tracing::warn!(service = %svc.name, error = %e, "XDP ring update failed"),
            }
        }
    }
}
