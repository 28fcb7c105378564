//! Process-wide bounds: the open-file limit raised at start, and one cap on the client
//! connections of every stream service together, below what the descriptors allow, so that
//! health checks, member connects, DNS over TCP and the admin API still get descriptors when
//! clients flood in (HAProxy derives its `maxconn` from `ulimit -n` the same way).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fulcrum_net::Tracker;

/// Descriptors kept out of the client connections' reach, at most: listeners, health checks,
/// member connections of HTTP reuse pools, DNS, the admin API, log files.
pub const RESERVE: u64 = 1024;

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns (before, after).
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own and pass by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads the struct we own; raising the soft limit up to the hard one
        // needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((before, lim.rlim_cur))
}

/// The current soft RLIMIT_NOFILE.
fn nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as in raise_nofile.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// The cap the descriptors allow: a proxied connection holds two (client and member), and a
/// reserve (`RESERVE`, or a quarter of a small limit) stays for everything else.
pub fn derived_cap(nofile: u64) -> u64 {
    let reserve = RESERVE.min(nofile / 4);
    (nofile.saturating_sub(reserve) / 2).max(1)
}

/// The global client connection cap, shared by every stream service's admission check.
pub struct GlobalCap {
    limit: AtomicU64,
    tracker: Arc<Tracker>,
    /// Connections refused because the process was at its cap.
    pub refused: AtomicU64,
}

impl GlobalCap {
    pub fn new(tracker: Arc<Tracker>) -> GlobalCap {
        GlobalCap {
            limit: AtomicU64::new(derived_cap(nofile())),
            tracker,
            refused: AtomicU64::new(0),
        }
    }

    /// Applies `global.max_connections` (0: derived from the descriptor limit).
    pub fn configure(&self, configured: u64) {
        let allowed = derived_cap(nofile());
        let limit = match configured {
            0 => allowed,
            n => {
                if n > allowed {
                    tracing::warn!(
                        configured = n,
                        allowed,
                        "global.max_connections is above what the open-file limit allows (two descriptors per connection, {RESERVE} kept in reserve); raise the limit (LimitNOFILE=) or lower the key"
                    );
                }
                n
            }
        };
        self.limit.store(limit, Ordering::Relaxed);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Whether one more client connection may be taken.
    pub fn admits(&self) -> bool {
        (self.tracker.active() as u64) < self.limit()
    }

    pub fn metrics(&self, out: &mut fulcrum_admin::MetricFamilies) {
        let mut samples = out.gauge(
            "fulcrum_connections_active",
            "Client connections of every stream service open now.",
        );
        samples.sample(&[], self.tracker.active());
        let mut samples = out.gauge(
            "fulcrum_connections_limit",
            "The global client connection cap (global.max_connections, or derived from the open-file limit).",
        );
        samples.sample(&[], self.limit());
        let mut samples = out.counter(
            "fulcrum_connections_refused_total",
            "Client connections reset because the process was at its global cap.",
        );
        samples.sample(&[], self.refused.load(Ordering::Relaxed));
    }
}

/// Entries of each service's persistence table (source_ip, header, cookie_passive): bounded by
/// the profile's `max_entries`, each of a fixed size.
pub fn persistence_metrics(
    out: &mut fulcrum_admin::MetricFamilies,
    tables: &[(String, Arc<fulcrum_balance::PersistTable>)],
) {
    let mut samples = out.gauge(
        "fulcrum_persistence_entries",
        "Entries in a service's persistence table.",
    );
    for (vs, t) in tables {
        samples.sample(&[("vs", vs)], t.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_a_reserve() {
        assert_eq!(derived_cap(1_048_576), (1_048_576 - 1024) / 2);
        assert_eq!(derived_cap(1024), (1024 - 256) / 2);
        assert_eq!(derived_cap(0), 1);
    }
}
