//! Why a request or the engine failed: one variant per case a caller handles differently.

use flashdiff_gate::GateError;
use flashdiff_models::families::tinydit::scene::PromptError;
use flashdiff_models::io::weights::WeightsError;
use flashdiff_models::ModelError;
use flashdiff_partitioner::PartitionError;
use flashdiff_scheduler::SchedError;

/// Why a request or the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model could not be loaded.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// The prompt is not in the model's language.
    #[error(transparent)]
    Prompt(#[from] PromptError),
    /// A request setting is out of range: the request's field (`"max_skip"`, the CLI's
    /// `--max-skip`) and why, with the value and the valid range.
    #[error("\"{field}\" {reason}")]
    Invalid {
        /// The field, as the request schema names it.
        field: &'static str,
        /// The value and what it must be.
        reason: String,
    },
    /// A field the interface a request came through does not take (the request schema's
    /// name for it, and why).
    #[error("\"{field}\": {reason}")]
    Refused {
        /// The field, as the request schema names it.
        field: &'static str,
        /// Why this interface does not take it.
        reason: String,
    },
    /// The request was cancelled before it finished.
    #[error("request {0} was cancelled")]
    Cancelled(u64),
    /// Workers were lost: the request's monotask kept losing its worker, or no worker is
    /// left and none can be started.
    #[error("{0}")]
    WorkerLost(String),
    /// A file, folder or thread the engine needs could not be made: what, and the system's
    /// error.
    #[error("{what}: {source}")]
    Io {
        /// What was being made or written (with its path).
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint this engine cannot continue: made for another model, of a request in
    /// flight, or inconsistent (it is untrusted input).
    #[error("checkpoint of request {id}: {reason}")]
    Checkpoint {
        /// The request the checkpoint is of.
        id: u64,
        /// What does not fit.
        reason: String,
    },
    /// The engine's thread has stopped: nothing more is taken.
    #[error("the engine has stopped")]
    Stopped,
    /// The engine's own configuration: a worker count or policy out of range, a call made
    /// while requests are in flight.
    #[error("{0}")]
    Config(String),
    /// The engine broke one of its own invariants (a bug, reported instead of a hang).
    #[error("{0}")]
    Internal(String),
    /// A policy refused (should not happen for validated input).
    #[error("partitioner: {0}")]
    Partition(#[from] PartitionError),
    /// Gate refusal.
    #[error("gate: {0}")]
    Gate(#[from] GateError),
    /// Scheduler refusal (admission control included).
    #[error("scheduler: {0}")]
    Scheduler(#[from] SchedError),
    /// The model refused its input or its tensor library failed.
    #[error("{0}")]
    Model(ModelError),
}

impl EngineError {
    /// The same error for another request (the engine fails every request in flight with
    /// the error that stopped it): the variant is kept where it carries no source error.
    pub(super) fn duplicate(&self) -> EngineError {
        match self {
            Self::WorkerLost(m) => Self::WorkerLost(m.clone()),
            Self::Internal(m) => Self::Internal(m.clone()),
            Self::Stopped => Self::Stopped,
            e => Self::Config(e.to_string()),
        }
    }
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Weights(e) => Self::Weights(e),
            ModelError::Prompt(e) => Self::Prompt(e),
            e => Self::Model(e),
        }
    }
}
