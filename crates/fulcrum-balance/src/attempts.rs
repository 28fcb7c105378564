//! One client's attempts at a pool: the member persistence remembers while it may still take
//! the client, else the scheduler's choice among the members not tried yet, with at most
//! `retries` members tried after the first. Every data plane that retries (tcp, http, message)
//! walks a pool through this, so what counts as a try and when trying stops is decided once.

use std::net::SocketAddr;

use crate::pool::{Picked, Pool};
use crate::sched::PickContext;

/// The members tried so far for one client, and what to try next.
#[derive(Debug)]
pub struct Attempts<'p> {
    pool: &'p Pool,
    ctx: PickContext,
    /// The member persistence points at (a cookie, a table entry).
    remembered: Option<SocketAddr>,
    /// The member the next attempt goes to again (over a new connection), when it may.
    again: Option<SocketAddr>,
    /// Members never chosen again, by index: the first `failures` failed this client, the rest
    /// were passed over (see `pass_over`).
    excluded: Vec<usize>,
    failures: usize,
    /// Whether the last member `next_member` gave came from persistence.
    persisted: bool,
}

impl Pool {
    /// Starts a client's attempts: `remembered` is the member persistence points at, if any.
    pub fn attempts(&self, ctx: PickContext, remembered: Option<SocketAddr>) -> Attempts<'_> {
        Attempts {
            pool: self,
            ctx,
            remembered,
            again: None,
            excluded: Vec::new(),
            failures: 0,
            persisted: false,
        }
    }
}

impl<'p> Attempts<'p> {
    /// Attempts that carry on from earlier ones: the members at `failed` (addresses, as they
    /// outlive a pool swapped by a reload) failed this client before, and count as tried.
    /// Addresses no longer in the pool are ignored. For a plane whose client waits between
    /// attempts (a message handed back when its member connection died).
    pub fn after(mut self, failed: &[SocketAddr]) -> Attempts<'p> {
        for addr in failed {
            if let Some((index, _)) = self.pool.member_by_addr(*addr) {
                self.count_failure(index);
            }
        }
        self
    }

    /// The member to try now: the one named by `again`, or the remembered one, while it may
    /// still take this client and has not failed it; otherwise the scheduler's choice among the
    /// members not tried yet. `None`: no member is left (see `tried` for whether any was).
    pub fn next_member(&mut self) -> Option<Picked> {
        let wanted = self.again.take().or(self.remembered);
        let remembered = wanted.and_then(|addr| self.pool.persistent(addr, &self.excluded));
        self.persisted = remembered
            .as_ref()
            .is_some_and(|p| Some(p.member.address) == self.remembered);
        remembered.or_else(|| self.pool.pick(&self.ctx, &self.excluded))
    }

    /// Whether every member of the pool failed this client or was passed over: `next_member`
    /// has nothing left to give. A plane that walks the whole pool looking for a member with
    /// room stops here rather than count a pick that found no member.
    pub fn all_out(&self) -> bool {
        self.excluded.len() >= self.pool.members().len()
    }

    /// `picked` failed this client: it is not chosen again. `true` while the pool's `retries`
    /// allow another member to be tried.
    pub fn failed(&mut self, picked: &Picked) -> bool {
        self.count_failure(picked.index);
        self.failures <= self.pool.retries as usize
    }

    fn count_failure(&mut self, index: usize) {
        match self.excluded.iter().position(|&i| i == index) {
            Some(at) if at < self.failures => {}
            Some(at) => {
                // Passed over before, failed now: moved among the failures.
                self.excluded.swap(at, self.failures);
                self.failures += 1;
            }
            None => {
                self.excluded.insert(self.failures, index);
                self.failures += 1;
            }
        }
    }

    /// `picked` cannot take this client now through no failure of its own (a plane's own
    /// readiness: no connection up, a full queue): it is not given again by these attempts,
    /// and it does not count as a try.
    pub fn pass_over(&mut self, picked: &Picked) {
        if !self.excluded.contains(&picked.index) {
            self.excluded.push(picked.index);
        }
    }

    /// Whether the next attempt after `picked` failing may go to another member (the retry
    /// budget is not spent), without counting it as failed yet.
    pub fn may_retry(&self) -> bool {
        self.failures < self.pool.retries as usize
    }

    /// The next attempt goes to `picked` again (a reused connection it had closed is not its
    /// fault): not counted as a try.
    pub fn same_again(&mut self, picked: &Picked) {
        self.again = Some(picked.member.address);
    }

    /// How many members failed this client so far.
    pub fn tried(&self) -> usize {
        self.failures
    }

    /// Whether the member `next_member` gave last is the one persistence remembered.
    pub fn persisted(&self) -> bool {
        self.persisted
    }

    /// The scheduler's choice with nothing excluded: for a plane whose every other member is
    /// out, where the one that failed this client may still serve it (a lone member that
    /// restarted while the message waited). Leaves these attempts as they are.
    pub fn any_member(&self) -> Option<Picked> {
        self.pool.pick(&self.ctx, &[])
    }

    pub fn pool(&self) -> &'p Pool {
        self.pool
    }
}
