//! A spawned task that ends when its owner lets go of it.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Aborts the task on drop, so removing a check or probe from a map is what stops it, and
/// nothing outlives the service.
#[derive(Debug)]
pub(crate) struct Task(JoinHandle<()>);

impl Task {
    /// Spawns on the current runtime.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(fut: F) -> Task {
        Task(tokio::spawn(fut))
    }

    pub fn spawn_on<F: Future<Output = ()> + Send + 'static>(handle: &Handle, fut: F) -> Task {
        Task(handle.spawn(fut))
    }

    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    #[cfg(test)]
    pub fn id(&self) -> tokio::task::Id {
        self.0.id()
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}
