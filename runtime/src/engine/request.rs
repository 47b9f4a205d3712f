//! A request in flight: its settings, its policies' state and its shared tensor state. The
//! request's life (life.rs, step.rs) moves it; a skipping method (methods/) reads and writes it,
//! and keeps what it remembers between steps in the request's `memory`, which only it reads.

use std::time::Instant;

use flashdiff_models::Tensor;
use flashdiff_partitioner::PatchLayout;

use super::forecast::Track;
use super::methods::Memory;
use super::{Report, RequestConfig};
use crate::state::SharedState;

/// A request in flight: its settings, method, policies' state and shared tensor state.
pub(super) struct Request {
    pub(super) cfg: RequestConfig,
    /// The prompt (kept for checkpoints).
    pub(super) prompt: String,
    /// Submission time on the wall clock (a resumed request's latency counts from it).
    pub(super) submitted_unix: std::time::SystemTime,
    /// Whether each of the prompt's words is salient (the saliency map's columns).
    pub(super) salient: Vec<bool>,
    /// The prompt's conditioning on the model's device.
    pub(super) context: Tensor,
    /// Every step's time conditioning (`steps x cond_len`), computed in one batched call
    /// when the first step after the warm-up opens.
    pub(super) conds: Vec<f32>,
    pub(super) state: SharedState,
    pub(super) layout: Option<PatchLayout>,
    pub(super) step: u32,
    pub(super) active: Vec<bool>,
    pub(super) report: Report,
    pub(super) submitted: Instant,
    /// What the request's method remembers between steps (its own type; see
    /// [`super::methods::Memory`]).
    pub(super) memory: Box<dyn Memory>,
    /// Extrapolation state ([`RequestConfig::reuse`]), from the first commit on.
    pub(super) track: Option<Track>,
    /// When its last checkpoint was written.
    pub(super) checkpointed: Option<Instant>,
}
