//! A background task on a thread and runtime of its own. The writer and the sampler run this
//! way because most tests run on tokio's one-thread runtime and call `kubectl` synchronously:
//! a shared runtime would stop them for as long as each call takes, and they would report write
//! gaps that never happened and miss a primary that lasted a second (a CI run did: a failover
//! and the switch back, 1 s apart, went unseen while the test polled the API).

use std::future::Future;

use tokio::sync::oneshot;

/// The running task; [`Self::join`] waits for its result.
pub struct Apart<T> {
    name: &'static str,
    result: oneshot::Receiver<T>,
}

impl<T: Send + 'static> Apart<T> {
    /// Runs the future `make` builds on a new thread named `name`.
    pub fn spawn<F, Fut>(name: &'static str, make: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        let (send, result) = oneshot::channel();
        let started = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("{name}: no runtime: {e}"));
                // The receiver is gone only when the test has already failed.
                let _ = send.send(runtime.block_on(make()));
            });
        if let Err(e) = started {
            panic!("{name}: no thread: {e}");
        }
        Self { name, result }
    }

    /// The task's result, once it has returned.
    pub async fn join(self) -> T {
        match self.result.await {
            Ok(value) => value,
            Err(_) => panic!("the {} thread panicked", self.name),
        }
    }
}
