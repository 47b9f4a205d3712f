//! Why a request or the engine failed: one variant per case a caller handles differently.

use std::fmt;

use flashdiff_gate::GateError;
use flashdiff_models::families::tinydit::scene::PromptError;
use flashdiff_models::io::weights::WeightsError;
use flashdiff_models::ModelError;
use flashdiff_partitioner::PartitionError;
use flashdiff_scheduler::SchedError;

/// Why a request or the engine failed.
#[derive(Debug)]
pub enum EngineError {
    /// The model could not be loaded.
    Weights(WeightsError),
    /// The prompt is not in the model's language.
    Prompt(PromptError),
    /// A request setting is out of range: the request's field (`"max_skip"`, the CLI's
    /// `--max-skip`) and why, with the value and the valid range.
    Invalid {
        /// The field, as the request schema names it.
        field: &'static str,
        /// The value and what it must be.
        reason: String,
    },
    /// A field the interface a request came through does not take (the request schema's
    /// name for it, and why).
    Refused {
        /// The field, as the request schema names it.
        field: &'static str,
        /// Why this interface does not take it.
        reason: String,
    },
    /// The request was cancelled before it finished.
    Cancelled(u64),
    /// Workers were lost: the request's monotask kept losing its worker, or no worker is
    /// left and none can be started.
    WorkerLost(String),
    /// The engine's own configuration or environment: a worker count or policy out of
    /// range, a call made while requests are in flight, a file that cannot be written.
    Config(String),
    /// The engine broke one of its own invariants (a bug, reported instead of a hang).
    Internal(String),
    /// A policy refused (should not happen for validated input).
    Partition(PartitionError),
    /// Gate refusal.
    Gate(GateError),
    /// Scheduler refusal (admission control included).
    Scheduler(SchedError),
    /// The model refused its input or its tensor library failed.
    Model(ModelError),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Weights(e) => write!(f, "{e}"),
            Self::Prompt(e) => write!(f, "{e}"),
            Self::Invalid { field, reason } => write!(f, "\"{field}\" {reason}"),
            Self::Refused { field, reason } => write!(f, "\"{field}\": {reason}"),
            Self::Cancelled(id) => write!(f, "request {id} was cancelled"),
            Self::WorkerLost(e) | Self::Config(e) | Self::Internal(e) => write!(f, "{e}"),
            Self::Partition(e) => write!(f, "partitioner: {e}"),
            Self::Gate(e) => write!(f, "gate: {e}"),
            Self::Scheduler(e) => write!(f, "scheduler: {e}"),
            Self::Model(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl EngineError {
    /// The same error for another request (the engine fails every request in flight with
    /// the error that stopped it): the variant is kept where it carries no source error.
    pub(super) fn duplicate(&self) -> EngineError {
        match self {
            Self::WorkerLost(m) => Self::WorkerLost(m.clone()),
            Self::Internal(m) => Self::Internal(m.clone()),
            e => Self::Config(e.to_string()),
        }
    }
}

impl From<WeightsError> for EngineError {
    fn from(e: WeightsError) -> Self {
        Self::Weights(e)
    }
}

impl From<PromptError> for EngineError {
    fn from(e: PromptError) -> Self {
        Self::Prompt(e)
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

impl From<PartitionError> for EngineError {
    fn from(e: PartitionError) -> Self {
        Self::Partition(e)
    }
}

impl From<GateError> for EngineError {
    fn from(e: GateError) -> Self {
        Self::Gate(e)
    }
}

impl From<SchedError> for EngineError {
    fn from(e: SchedError) -> Self {
        Self::Scheduler(e)
    }
}
