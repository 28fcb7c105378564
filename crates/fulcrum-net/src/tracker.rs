//! Counts every live client connection of the process, so a graceful shutdown can wait for them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Tracker {
    active: AtomicUsize,
    idle: Notify,
}

#[derive(Debug)]
pub struct Tracked(Arc<Tracker>);

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Tracker {
    pub fn track(self: &Arc<Self>) -> Tracked {
        self.active.fetch_add(1, Ordering::AcqRel);
        Tracked(self.clone())
    }

    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Waits until no connection is left or `deadline` passed; returns how many are left.
    pub async fn wait_idle(&self, deadline: Duration) -> usize {
        let wait = async {
            loop {
                let notified = self.idle.notified();
                if self.active() == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(deadline, wait).await;
        self.active()
    }
}
