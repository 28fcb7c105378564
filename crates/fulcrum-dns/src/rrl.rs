//! Response rate limiting against reflection (as BIND's RRL): at most N responses per second
//! to one client network (/24 for IPv4, /56 for IPv6 by default). Past the limit, responses
//! are dropped, except every `slip`-th, which goes out empty and truncated so that a real
//! client behind a spoofed flood can still retry over TCP.
//!
//! The table is a fixed array of atomic buckets indexed by a hash of the network: no lock, no
//! allocation, bounded memory whatever the number of sources. Two networks that share a bucket
//! share a limit, which errs on the side of limiting.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const BUCKETS: usize = 1 << 16;

/// What to do with a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    Slip,
}

pub struct Rrl {
    rate: u32,
    slip: u32,
    v4_mask: u32,
    v6_mask: u128,
    start: Instant,
    /// Per bucket: second (upper 32 bits) and responses in it (lower 32).
    buckets: Box<[AtomicU64]>,
}

impl std::fmt::Debug for Rrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rrl")
            .field("rate", &self.rate)
            .field("slip", &self.slip)
            .finish()
    }
}

impl Rrl {
    pub fn new(cfg: &fulcrum_config::RateLimit) -> Rrl {
        Rrl {
            rate: cfg.responses_per_second,
            slip: cfg.slip,
            v4_mask: u32::MAX
                .checked_shl(32 - u32::from(cfg.ipv4_prefix.min(32)))
                .unwrap_or(0),
            v6_mask: u128::MAX
                .checked_shl(128 - u32::from(cfg.ipv6_prefix.min(128)))
                .unwrap_or(0),
            start: Instant::now(),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn key(&self, ip: IpAddr) -> u64 {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(a) => u64::from(u32::from(a) & self.v4_mask),
            IpAddr::V6(a) => {
                let m = u128::from(a) & self.v6_mask;
                (m >> 64) as u64 ^ (m as u64) ^ 0x9e37_79b9_7f4a_7c15
            }
        }
    }

    pub fn check(&self, ip: IpAddr) -> Verdict {
        self.check_at(ip, self.start.elapsed().as_secs() as u32 + 1)
    }

    pub fn check_at(&self, ip: IpAddr, second: u32) -> Verdict {
        let h = self.key(ip).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let b = &self.buckets[(h >> 48) as usize % BUCKETS];
        let mut cur = b.load(Ordering::Relaxed);
        let count = loop {
            let (sec, n) = ((cur >> 32) as u32, cur as u32);
            let next = if sec == second {
                n.saturating_add(1)
            } else {
                1
            };
            match b.compare_exchange_weak(
                cur,
                (u64::from(second) << 32) | u64::from(next),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break next,
                Err(v) => cur = v,
            }
        };
        if count <= self.rate {
            return Verdict::Pass;
        }
        let over = count - self.rate;
        if self.slip > 0 && over.is_multiple_of(self.slip) {
            Verdict::Slip
        } else {
            Verdict::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_network_per_second_with_slip() {
        let r = Rrl::new(&fulcrum_config::RateLimit {
            responses_per_second: 5,
            slip: 2,
            ipv4_prefix: 24,
            ipv6_prefix: 56,
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.200".parse().unwrap();
        let other: IpAddr = "198.51.100.1".parse().unwrap();
        let v: Vec<Verdict> = (0..10)
            .map(|i| r.check_at(if i % 2 == 0 { a } else { b }, 7))
            .collect();
        assert_eq!(&v[..5], &[Verdict::Pass; 5]);
        assert_eq!(
            &v[5..],
            &[
                Verdict::Drop,
                Verdict::Slip,
                Verdict::Drop,
                Verdict::Slip,
                Verdict::Drop
            ]
        );
        assert_eq!(r.check_at(other, 7), Verdict::Pass);
        assert_eq!(
            r.check_at(a, 8),
            Verdict::Pass,
            "a new second starts afresh"
        );
    }
}
