//! Why a reconcile failed, with the cause kept, and what follows from it: a bounded metric
//! label ([`Error::category`], from the real cause, also through the finalizer's wrapping) and
//! whether retrying can help ([`Error::is_invalid`]).

use kube::runtime::finalizer;

use crate::execute::StepError;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Step(#[from] StepError<kube::Error>),
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<Error>>),
    #[error("the ValkeyCluster has no namespace")]
    NoNamespace,
    #[error("this replica's Lease has run out: not acting on what it read")]
    NotLeading,
    /// An object the cluster would own exists and belongs to someone else; it is left alone.
    #[error(
        "{kind} {namespace}/{name} already exists and is not this cluster's; the operator leaves it untouched. Delete or rename it, or give the ValkeyCluster another name"
    )]
    NotOurs {
        kind: String,
        namespace: String,
        name: String,
    },
    /// The cluster's credentials Secret cannot be used, or new passwords cannot be made.
    #[error("the credentials Secret {namespace}/{name}: {problem}")]
    Credentials {
        namespace: String,
        name: String,
        problem: String,
    },
}

impl Error {
    /// A small, bounded label for metrics, naming the underlying cause.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kubernetes",
            Error::Step(StepError::Engine(error)) => error.category(),
            Error::Step(StepError::Host(_)) => "kubernetes",
            Error::Step(StepError::NoAddress { .. } | StepError::UnknownNode { .. }) => "node",
            Error::Finalizer(wrapped) => match wrapped.as_ref() {
                finalizer::Error::ApplyFailed(cause) | finalizer::Error::CleanupFailed(cause) => {
                    cause.category()
                }
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_) => {
                    "kubernetes"
                }
                finalizer::Error::UnnamedObject | finalizer::Error::InvalidFinalizer => "invalid",
            },
            Error::NoNamespace => "invalid",
            Error::NotLeading => "fenced",
            Error::NotOurs { .. } => "conflict",
            Error::Credentials { .. } => "credentials",
        }
    }

    /// The object itself is wrong: retrying without a change cannot help.
    pub fn is_invalid(&self) -> bool {
        self.category() == "invalid"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::valkey::EngineError;

    fn forbidden() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("pods is forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    #[test]
    fn the_category_names_the_cause_inside_the_finalizer() {
        let wrapped = |cause| Error::Finalizer(Box::new(finalizer::Error::ApplyFailed(cause)));
        assert_eq!(wrapped(Error::Kube(forbidden())).category(), "kubernetes");
        let timeout = EngineError::Timeout {
            node: "127.0.0.2:6379".into(),
            command: "CLUSTER FAILOVER".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(
            wrapped(Error::Step(StepError::Engine(timeout))).category(),
            "timeout"
        );
        assert_eq!(wrapped(Error::NoNamespace).category(), "invalid");
        assert!(wrapped(Error::NoNamespace).is_invalid());
        assert!(!Error::Kube(forbidden()).is_invalid());
    }
}
