//! One timer per connection for all its deadlines (header, keep-alive idle, response, body).
//!
//! A request moves its deadline several times, and registering and removing a tokio timer for
//! each phase costs a timer-wheel update and a clock read each time (about 3% of the CPU of a
//! keep-alive request in the profile). Here the deadline is a plain value; the timer in the wheel
//! is moved only when the deadline comes earlier than it. When it fires for a deadline that has
//! since moved later, it is re-armed to the new one: at most once per timeout period, not per
//! request.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

pub struct Timer {
    sleep: Pin<Box<Sleep>>,
    deadline: Instant,
}

impl Timer {
    pub fn new() -> Timer {
        // Far away and not registered until first polled.
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        Timer {
            sleep: Box::pin(tokio::time::sleep_until(far)),
            deadline: far,
        }
    }

    /// Moves the deadline.
    pub fn set(&mut self, deadline: Instant) {
        self.deadline = deadline;
        if deadline < self.sleep.deadline() {
            self.sleep.as_mut().reset(deadline);
        }
    }

    /// Sets the deadline `after` from now.
    pub fn set_after(&mut self, after: Duration) {
        self.set(Instant::now() + after);
    }

    /// Completes when the deadline has passed.
    pub async fn expired(&mut self) {
        poll_fn(|cx| loop {
            match self.sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    if self.sleep.deadline() >= self.deadline {
                        return Poll::Ready(());
                    }
                    // Fired for a deadline that has moved later since: re-arm.
                    let d = self.deadline;
                    self.sleep.as_mut().reset(d);
                }
            }
        })
        .await
    }

    /// Runs `fut` until it completes (`Some`) or the deadline passes (`None`).
    pub async fn run<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(v));
            }
            loop {
                match self.sleep.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        if self.sleep.deadline() >= self.deadline {
                            return Poll::Ready(None);
                        }
                        let d = self.deadline;
                        self.sleep.as_mut().reset(d);
                    }
                }
            }
        })
        .await
    }
}

impl Default for Timer {
    fn default() -> Self {
        Timer::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn later_deadlines_rearm_lazily_earlier_ones_at_once() {
        let mut t = Timer::new();
        t.set_after(Duration::from_millis(100));
        assert_eq!(
            t.run(tokio::time::sleep(Duration::from_millis(50))).await,
            Some(())
        );
        // Moved later: the earlier wheel entry fires first and is re-armed, not obeyed.
        t.set_after(Duration::from_millis(200));
        let started = Instant::now();
        assert_eq!(t.run(std::future::pending::<()>()).await, None);
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        // Moved earlier: obeyed.
        t.set_after(Duration::from_secs(10));
        t.set_after(Duration::from_millis(5));
        let started = Instant::now();
        t.expired().await;
        assert_eq!(started.elapsed(), Duration::from_millis(5));
    }
}
