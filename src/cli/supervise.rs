//! Runs `serve`'s long-lived tasks (watches, election, controller, HTTPS server) under one
//! supervisor, so that none of them can die unnoticed: the first task to end before shutdown
//! (by returning, failing or panicking) marks the process unhealthy, stops the others, and
//! becomes the error `serve` exits with. A restarted Pod beats one that looks alive but is not.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

/// Whether every supervised task is still running; read by `/healthz`.
#[derive(Debug, Default)]
pub struct Health {
    /// Why the process is unhealthy; set once, by the first task that died.
    failure: OnceLock<String>,
}

impl Health {
    /// `None` while healthy; otherwise which task died and how.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    pub(crate) fn mark_failed(&self, reason: String) {
        // The first death is the cause; later ones are usually its consequences.
        let _ = self.failure.set(reason);
    }
}

/// How a supervised task ended when it should not have.
#[derive(Debug, thiserror::Error)]
pub enum TaskFailure {
    #[error("task `{task}` stopped before shutdown")]
    Returned { task: &'static str },
    #[error("task `{task}` failed")]
    Failed {
        task: &'static str,
        #[source]
        source: anyhow::Error,
    },
    #[error("task `{task}` panicked: {message}")]
    Panicked { task: &'static str, message: String },
    #[error("task `{task}` was cancelled")]
    Cancelled { task: &'static str },
}

impl TaskFailure {
    /// The name of the task that died.
    pub fn task(&self) -> &'static str {
        match self {
            Self::Returned { task }
            | Self::Failed { task, .. }
            | Self::Panicked { task, .. }
            | Self::Cancelled { task } => task,
        }
    }
}

/// A set of named tasks that stop together, on a shutdown signal or when any one of them ends.
pub struct Supervisor {
    tasks: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, &'static str>,
    stop: watch::Sender<bool>,
    health: Arc<Health>,
    /// How long tasks get to stop on their own before the rest are aborted.
    grace: Duration,
}

impl Supervisor {
    pub fn new(health: Arc<Health>, grace: Duration) -> Self {
        Self {
            tasks: JoinSet::new(),
            names: HashMap::new(),
            stop: watch::channel(false).0,
            health,
            grace,
        }
    }

    /// Completes when the supervisor asks its tasks to stop. A task that never awaits this is
    /// aborted once the grace period is over.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.subscribe();
        async move {
            // An error means the supervisor is gone, which is also a reason to stop.
            let _ = stop.wait_for(|stopping| *stopping).await;
        }
    }

    /// Runs `task` under the name `name` (used in logs, `/healthz` and the exit error).
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Runs `task`, which has no shutdown of its own, under the name `name`: it is dropped at
    /// the stop signal. Ending by itself before that is a failure like any other.
    pub fn spawn_until_stopped(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let stopping = self.stopping();
        self.spawn(name, async move {
            tokio::select! {
                () = task => {}
                () = stopping => {}
            }
            Ok(())
        });
    }

    /// Waits for `shutdown` or for the first task to end, then stops every task. `Ok` only on
    /// a shutdown where every task stopped cleanly; otherwise the first failure.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), TaskFailure> {
        let failure = tokio::select! {
            () = shutdown => None,
            Some(ended) = self.tasks.join_next_with_id() => Some(self.early_end(ended)),
        };
        if let Some(failure) = &failure {
            tracing::error!(task = failure.task(), error = %DisplayChain(failure), "a supervised task died; stopping");
            self.health.mark_failed(DisplayChain(failure).to_string());
        }
        self.stop.send_replace(true);
        let late = self.drain().await;
        match failure.or(late) {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Names a task that ended before shutdown; whatever its result, that is a failure.
    fn early_end(&mut self, ended: Result<(Id, anyhow::Result<()>), JoinError>) -> TaskFailure {
        let (task, outcome) = self.finished(ended);
        failure(task, outcome).unwrap_or(TaskFailure::Returned { task })
    }

    /// Waits for the tasks to stop after the stop signal; aborts those still running when the
    /// grace period ends. Returns the first task that failed or panicked while stopping.
    async fn drain(&mut self) -> Option<TaskFailure> {
        let deadline = tokio::time::Instant::now() + self.grace;
        let mut first = None;
        loop {
            let next = tokio::time::timeout_at(deadline, self.tasks.join_next_with_id());
            let ended = match next.await {
                Ok(Some(ended)) => ended,
                Ok(None) => return first,
                Err(_) => break,
            };
            let (task, outcome) = self.finished(ended);
            if let Some(failure) = failure(task, outcome) {
                tracing::error!(task, error = %DisplayChain(&failure), "a supervised task failed while stopping");
                first.get_or_insert(failure);
            }
        }
        let mut late: Vec<&str> = self.names.values().copied().collect();
        late.sort_unstable();
        tracing::warn!(tasks = ?late, grace = ?self.grace, "tasks did not stop in time; aborting them");
        self.tasks.shutdown().await;
        first
    }

    /// The name of a finished task, and how it finished.
    fn finished(
        &mut self,
        ended: Result<(Id, anyhow::Result<()>), JoinError>,
    ) -> (&'static str, Result<anyhow::Result<()>, JoinError>) {
        let (id, outcome) = match ended {
            Ok((id, result)) => (id, Ok(result)),
            Err(error) => (error.id(), Err(error)),
        };
        (self.names.remove(&id).unwrap_or("unnamed"), outcome)
    }
}

/// The failure in a task's outcome, if any: an error, a panic or a cancellation (only the
/// supervisor aborts its tasks, and only after draining, so that is unexpected too).
fn failure(
    task: &'static str,
    outcome: Result<anyhow::Result<()>, JoinError>,
) -> Option<TaskFailure> {
    match outcome {
        Ok(Ok(())) => None,
        Ok(Err(source)) => Some(TaskFailure::Failed { task, source }),
        Err(error) if error.is_cancelled() => Some(TaskFailure::Cancelled { task }),
        Err(error) => Some(TaskFailure::Panicked {
            task,
            message: panic_message(error.into_panic()),
        }),
    }
}

/// What a panic said, when it said it with a string (as `panic!` and `expect` do).
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_string(),
            Err(_) => "a non-string panic payload".to_string(),
        },
    }
}

/// An error with its causes, `a: b: c`, for logs and `/healthz`.
struct DisplayChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const GRACE: Duration = Duration::from_secs(5);

    /// A supervisor with `well_behaved` tasks that run until the stop signal and count how
    /// many of them saw it.
    fn supervisor_with_steady_tasks(
        well_behaved: usize,
    ) -> (Supervisor, Arc<Health>, Arc<AtomicUsize>) {
        let health = Arc::new(Health::default());
        let mut supervisor = Supervisor::new(health.clone(), GRACE);
        let stopped = Arc::new(AtomicUsize::new(0));
        for name in ["steady-1", "steady-2", "steady-3"]
            .into_iter()
            .take(well_behaved)
        {
            let stopping = supervisor.stopping();
            let stopped = stopped.clone();
            supervisor.spawn(name, async move {
                stopping.await;
                stopped.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
        }
        (supervisor, health, stopped)
    }

    /// Runs `supervisor` with no shutdown signal: only a dying task can end it.
    async fn run_until_a_task_dies(supervisor: Supervisor) -> TaskFailure {
        let outcome = tokio::time::timeout(
            Duration::from_secs(10),
            supervisor.run(std::future::pending()),
        )
        .await
        .expect("the supervisor noticed the dead task");
        outcome.expect_err("a dead task is a failure")
    }

    #[tokio::test]
    async fn a_task_that_returns_early_is_named_and_the_others_stop() {
        let (mut supervisor, health, stopped) = supervisor_with_steady_tasks(2);
        supervisor.spawn("quitter", async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        });
        let failure = run_until_a_task_dies(supervisor).await;
        assert!(
            matches!(failure, TaskFailure::Returned { task: "quitter" }),
            "{failure:?}"
        );
        assert_eq!(
            health.failure(),
            Some("task `quitter` stopped before shutdown")
        );
        assert_eq!(stopped.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_task_that_panics_is_named_with_its_message() {
        let (mut supervisor, health, stopped) = supervisor_with_steady_tasks(2);
        supervisor.spawn("crasher", async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            panic!("lost the plot");
        });
        let failure = run_until_a_task_dies(supervisor).await;
        assert!(
            matches!(&failure, TaskFailure::Panicked { task: "crasher", message } if message == "lost the plot"),
            "{failure:?}"
        );
        assert_eq!(
            health.failure(),
            Some("task `crasher` panicked: lost the plot")
        );
        assert_eq!(stopped.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_task_that_fails_is_named_with_its_causes() {
        let (mut supervisor, health, stopped) = supervisor_with_steady_tasks(2);
        supervisor.spawn("failer", async {
            Err(anyhow::anyhow!("connection refused").context("watching ValkeyClusters"))
        });
        let failure = run_until_a_task_dies(supervisor).await;
        assert_eq!(failure.task(), "failer");
        assert!(matches!(failure, TaskFailure::Failed { .. }), "{failure:?}");
        assert_eq!(
            health.failure(),
            Some("task `failer` failed: watching ValkeyClusters: connection refused")
        );
        // The cause travels with the error, for `main`'s `{:#}`.
        let chain = format!("{:#}", anyhow::Error::from(failure));
        assert!(chain.ends_with("connection refused"), "{chain}");
        assert_eq!(stopped.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_shutdown_stops_every_task_and_is_ok() {
        let (supervisor, health, stopped) = supervisor_with_steady_tasks(3);
        let (signal, shutdown) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(supervisor.run(async {
            let _ = shutdown.await;
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !running.is_finished(),
            "the supervisor waits for the shutdown"
        );
        signal.send(()).expect("the supervisor is listening");
        let outcome = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("the supervisor stops")
            .expect("the supervisor does not panic");
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(health.failure(), None);
        assert_eq!(stopped.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn tasks_without_a_shutdown_of_their_own_are_dropped_at_the_stop_signal() {
        let health = Arc::new(Health::default());
        let mut supervisor = Supervisor::new(health.clone(), GRACE);
        supervisor.spawn_until_stopped("forever", std::future::pending());
        let started = tokio::time::Instant::now();
        let outcome = supervisor.run(std::future::ready(())).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert!(started.elapsed() < GRACE, "not left to the grace period");
    }

    #[tokio::test]
    async fn a_task_that_ignores_the_stop_signal_is_aborted_after_the_grace_period() {
        let health = Arc::new(Health::default());
        let mut supervisor = Supervisor::new(health.clone(), Duration::from_millis(50));
        supervisor.spawn("stubborn", async {
            std::future::pending::<()>().await;
            Ok(())
        });
        let outcome = tokio::time::timeout(
            Duration::from_secs(10),
            supervisor.run(std::future::ready(())),
        )
        .await
        .expect("the supervisor gives up waiting");
        assert!(outcome.is_ok(), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_task_that_fails_while_stopping_makes_the_shutdown_fail() {
        let health = Arc::new(Health::default());
        let mut supervisor = Supervisor::new(health.clone(), GRACE);
        let stopping = supervisor.stopping();
        supervisor.spawn("sloppy", async move {
            stopping.await;
            Err(anyhow::anyhow!("could not flush"))
        });
        let failure = supervisor
            .run(std::future::ready(()))
            .await
            .expect_err("the failure is reported");
        assert_eq!(failure.task(), "sloppy");
        // The process was stopping anyway; it was never unhealthy while running.
        assert_eq!(health.failure(), None);
    }
}
