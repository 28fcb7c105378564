//! Passive observation at L7: the responses a data plane forwards tell about the member that sent
//! them. A status the pool lists in `passive_statuses` (5xx by default; 403/404 as the seeds'
//! option) counts as a failure in the member's one rise/fall state machine, exactly like a failed
//! connect; any other response is a completed exchange and ends a run of failures.

use fulcrum_balance::Member;
use fulcrum_config::StatusSet;

/// A pool's `passive_statuses`, compiled to a bitmap over 100–599 for a lookup per response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusObserver {
    bits: [u64; 10],
}

impl StatusObserver {
    /// Compiles a status set.
    pub fn new(set: &StatusSet) -> StatusObserver {
        let mut bits = [0u64; 10];
        for status in 100u16..600 {
            if set.contains(status) {
                bits[usize::from(status / 64)] |= 1 << (status % 64);
            }
        }
        StatusObserver { bits }
    }

    /// Whether `status` counts against the member.
    #[inline]
    pub fn is_failure(&self, status: u16) -> bool {
        status < 600 && self.bits[usize::from(status / 64)] & (1 << (status % 64)) != 0
    }

    /// Feeds one response of `member` to its health state machine; returns whether it counted
    /// as a failure.
    pub fn observe(&self, member: &Member, status: u16) -> bool {
        if self.is_failure(status) {
            member.record_passive_failure(&format!("HTTP {status} from the member"));
            true
        } else {
            member.record_exchange_success();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_config::StatusMatch;

    #[test]
    fn classes_and_codes() {
        let o = StatusObserver::new(&StatusSet(vec![
            StatusMatch::Class(5),
            StatusMatch::Code(403),
            StatusMatch::Code(404),
        ]));
        for s in [500, 503, 599, 403, 404] {
            assert!(o.is_failure(s), "{s}");
        }
        for s in [0, 99, 200, 302, 401, 405, 600, 65535] {
            assert!(!o.is_failure(s), "{s}");
        }
        assert!(!StatusObserver::new(&StatusSet::default()).is_failure(500));
    }
}
