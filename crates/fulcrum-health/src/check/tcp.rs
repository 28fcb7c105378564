//! tcp: the member accepts a connection within the timeout.

use super::{connect, Probe, Verdict};

pub(crate) async fn run(probe: &Probe) -> Verdict {
    match connect(probe).await {
        Ok(_) => Verdict::pass("connected"),
        Err(detail) => Verdict::fail(detail),
    }
}
