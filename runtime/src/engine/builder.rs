//! [`EngineBuilder`]: how an engine is made, in one place: its model, the device, where its
//! workers run, and the settings otherwise set one call at a time while it is idle.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flashdiff_models::pipelines::registry::ModelSpec;
use flashdiff_models::{Denoiser, Device};

use super::workers::HangPolicy;
use super::{Engine, EngineError, QueueOrder};

/// The model an engine is built over.
enum Source {
    /// Loaded by the builder (and by every worker process).
    Spec(ModelSpec),
    /// Already loaded by the caller.
    Loaded(Arc<dyn Denoiser>),
}

/// Where the workers run.
enum Run {
    /// One worker: the coordinator's thread; more: threads sharing the model, with request
    /// state under [`super::state_dir`] (a loaded model: virtual workers on the coordinator).
    Default,
    /// Threads of this process sharing the model, request state under the folder.
    Threads(PathBuf),
    /// Child processes of `exe` (`exe worker ...`), each loading the model on its CPU,
    /// request state under `shm`.
    Processes { exe: PathBuf, shm: PathBuf },
}

/// How an engine is made. From [`Engine::builder`] (a model to load) or
/// [`Engine::builder_with`] (a model already loaded); then [`EngineBuilder::build`].
///
/// ```no_run
/// use flashdiff_runtime::engine::{default_weights, Engine, QueueOrder};
/// let engine = Engine::builder(&default_weights())
///     .workers(2)
///     .queue_order(QueueOrder::Arrival)
///     .build()?;
/// # Ok::<(), flashdiff_runtime::engine::EngineError>(())
/// ```
#[must_use = "an EngineBuilder does nothing until build()"]
pub struct EngineBuilder {
    source: Source,
    device: Device,
    workers: u32,
    run: Run,
    dispatch_depth: Option<u32>,
    queue_order: Option<QueueOrder>,
    hang_policy: Option<HangPolicy>,
    checkpoints: Option<(PathBuf, Duration)>,
    start_window: Option<u32>,
}

impl Engine {
    /// An engine over the model `spec` names or points at (a weights file or folder), one
    /// worker on the CPU unless the builder says otherwise.
    pub fn builder(spec: impl Into<ModelSpec>) -> EngineBuilder {
        EngineBuilder::new(Source::Spec(spec.into()))
    }

    /// An engine over a model already loaded (any [`Denoiser`]).
    pub fn builder_with(model: Arc<dyn Denoiser>) -> EngineBuilder {
        EngineBuilder::new(Source::Loaded(model))
    }
}

impl EngineBuilder {
    fn new(source: Source) -> Self {
        Self {
            source,
            device: Device::Cpu,
            workers: 1,
            run: Run::Default,
            dispatch_depth: None,
            queue_order: None,
            hang_policy: None,
            checkpoints: None,
            start_window: None,
        }
    }

    /// The device the model is loaded onto (the CPU by default; see
    /// `flashdiff_models::device`). Request state stays in host memory.
    pub fn device(mut self, device: &Device) -> Self {
        self.device = device.clone();
        self
    }

    /// How many workers (1 by default; see [`Engine::workers`]).
    pub fn workers(mut self, workers: u32) -> Self {
        self.workers = workers;
        self
    }

    /// Workers as threads of this process sharing the model, with request state in
    /// memory-mapped files under `shm_dir`.
    pub fn threads(mut self, shm_dir: &Path) -> Self {
        self.run = Run::Threads(shm_dir.to_path_buf());
        self
    }

    /// Workers as child processes of `exe` (`exe worker ...`), each loading the model onto
    /// its CPU, with request state in memory-mapped files under `shm_dir` (e.g. `/dev/shm`).
    /// The coordinator loads the model too (to condition prompts and decode results).
    pub fn processes(mut self, exe: &Path, shm_dir: &Path) -> Self {
        self.run = Run::Processes {
            exe: exe.to_path_buf(),
            shm: shm_dir.to_path_buf(),
        };
        self
    }

    /// See [`Engine::set_dispatch_depth`].
    pub fn dispatch_depth(mut self, depth: u32) -> Self {
        self.dispatch_depth = Some(depth);
        self
    }

    /// See [`Engine::set_queue_order`].
    pub fn queue_order(mut self, order: QueueOrder) -> Self {
        self.queue_order = Some(order);
        self
    }

    /// See [`Engine::set_hang_policy`].
    pub fn hang_policy(mut self, policy: HangPolicy) -> Self {
        self.hang_policy = Some(policy);
        self
    }

    /// See [`Engine::set_checkpoint_dir`].
    pub fn checkpoints(mut self, dir: &Path, every: Duration) -> Self {
        self.checkpoints = Some((dir.to_path_buf(), every));
        self
    }

    /// See [`Engine::set_start_window`].
    pub fn start_window(mut self, window: Option<u32>) -> Self {
        self.start_window = window;
        self
    }

    /// The engine, or why it cannot be made (the model does not load, a setting is out of
    /// range, a worker or folder cannot be started).
    pub fn build(self) -> Result<Engine, EngineError> {
        let mut engine = match (self.source, self.run) {
            (Source::Spec(spec), Run::Default) => {
                Engine::load(&spec, self.workers, &self.device, None)?
            }
            (Source::Spec(spec), Run::Threads(dir)) => {
                Engine::load(&spec, self.workers, &self.device, Some(&dir))?
            }
            (Source::Spec(spec), Run::Processes { exe, shm }) => {
                if !matches!(self.device, Device::Cpu) {
                    return Err(EngineError::Config(
                        "worker processes load the model on the CPU: leave the device out".into(),
                    ));
                }
                Engine::with_processes(spec, self.workers, &exe, &shm)?
            }
            (Source::Loaded(model), Run::Default) => Engine::with_model(model, self.workers, None)?,
            (Source::Loaded(model), Run::Threads(dir)) => {
                Engine::with_threads(model, self.workers, &dir)?
            }
            (Source::Loaded(_), Run::Processes { .. }) => {
                return Err(EngineError::Config(
                    "worker processes load the model themselves: build from a model spec \
                     (Engine::builder), not a loaded model"
                        .into(),
                ))
            }
        };
        if let Some(d) = self.dispatch_depth {
            engine.set_dispatch_depth(d)?;
        }
        if let Some(o) = self.queue_order {
            engine.set_queue_order(o)?;
        }
        if let Some(p) = self.hang_policy {
            engine.set_hang_policy(p)?;
        }
        if let Some((dir, every)) = self.checkpoints {
            engine.set_checkpoint_dir(Some(dir), every)?;
        }
        if self.start_window.is_some() {
            engine.set_start_window(self.start_window)?;
        }
        Ok(engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::default_weights;

    #[test]
    fn the_builder_applies_every_setting_it_was_given() {
        let dir = std::env::temp_dir().join(format!("fd-builder-{}", std::process::id()));
        let e = Engine::builder(&default_weights())
            .workers(2)
            .start_window(Some(3))
            .checkpoints(&dir, Duration::from_secs(1))
            .build()
            .expect("the built-in model");
        assert_eq!(e.workers(), 2);
        assert_eq!(e.start_window(), Some(3));
        assert_eq!(e.checkpoint_dir(), Some(dir.as_path()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_builder_refuses_what_cannot_be_built_and_says_why() {
        let e = Engine::builder(&default_weights()).workers(0).build();
        assert!(e.is_err());
        let model = Engine::builder(&default_weights())
            .build()
            .unwrap()
            .shared_model();
        let err = Engine::builder_with(model)
            .processes(Path::new("/bin/true"), &std::env::temp_dir())
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("model spec"), "{err}");
        let err = Engine::builder(&default_weights())
            .dispatch_depth(0)
            .workers(2)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("dispatch depth 0"), "{err}");
    }
}
