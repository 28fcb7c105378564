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
    /// Members that failed this client, by index; never chosen again.
    tried: Vec<usize>,
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
            tried: Vec::new(),
            persisted: false,
        }
    }
}

impl<'p> Attempts<'p> {
    /// The member to try now: the one named by `again`, or the remembered one, while it may
    /// still take this client and has not failed it; otherwise the scheduler's choice among the
    /// members not tried yet. `None`: no member is left (see `tried` for whether any was).
    pub fn next_member(&mut self) -> Option<Picked> {
        let wanted = self.again.take().or(self.remembered);
        let remembered = wanted.and_then(|addr| self.pool.persistent(addr, &self.tried));
        self.persisted = remembered
            .as_ref()
            .is_some_and(|p| Some(p.member.address) == self.remembered);
        remembered.or_else(|| self.pool.pick(&self.ctx, &self.tried))
    }

    /// `picked` failed this client: it is not chosen again. `true` while the pool's `retries`
    /// allow another member to be tried.
    pub fn failed(&mut self, picked: &Picked) -> bool {
        if !self.tried.contains(&picked.index) {
            self.tried.push(picked.index);
        }
        self.tried.len() <= self.pool.retries as usize
    }

    /// Whether the next attempt after `picked` failing may go to another member (the retry
    /// budget is not spent), without counting it as failed yet.
    pub fn may_retry(&self) -> bool {
        self.tried.len() < self.pool.retries as usize
    }

    /// The next attempt goes to `picked` again (a reused connection it had closed is not its
    /// fault): not counted as a try.
    pub fn same_again(&mut self, picked: &Picked) {
        self.again = Some(picked.member.address);
    }

    /// How many members failed this client so far.
    pub fn tried(&self) -> usize {
        self.tried.len()
    }

    /// Whether the member `next_member` gave last is the one persistence remembered.
    pub fn persisted(&self) -> bool {
        self.persisted
    }

    pub fn pool(&self) -> &'p Pool {
        self.pool
    }
}
