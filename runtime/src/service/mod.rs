//! The engine as a service: one thread owns the [`Engine`] and runs it between commands that
//! front ends send over a channel. Every request carries its own reply, a sender for its
//! result and, when asked, one for its step updates; what a front end does with them
//! (encode an image, answer an HTTP job, fill a C caller's mailbox) happens on the front
//! end's threads, never on the engine's.
//!
//! The HTTP server, the JSON-lines server, the C ABI, the Python package and the serving
//! study are all translators over a [`Service`]; front ends that answer by request id
//! (C and Python) share a [`Mailbox`].
//!
//! ```no_run
//! use std::sync::mpsc;
//! use flashdiff_runtime::engine::{Engine, RequestConfig};
//! use flashdiff_runtime::service::{Reply, Service};
//! let engine = Engine::new(&flashdiff_runtime::engine::default_weights(), 1).unwrap();
//! let service = Service::start(engine).unwrap();
//! let (tx, rx) = mpsc::channel();
//! service.submit(7, "a red circle", RequestConfig::default(), Reply::to(tx)).unwrap();
//! let (id, output) = rx.recv().unwrap();
//! assert_eq!(id, 7);
//! assert!(output.is_ok());
//! ```

mod mailbox;

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use flashdiff_models::{Conditioning, Denoiser};

pub use mailbox::{Mailbox, MailboxError, Standing};

use crate::checkpoint;
use crate::engine::{Engine, EngineError, Output, RequestConfig, StepEvent};

/// A finished request: its id and its output or why it has none.
pub type Finished = (u64, Result<Output, EngineError>);

/// A request's step, as the engine reports it, owned so that it can cross threads.
#[derive(Debug, Clone, PartialEq)]
pub struct StepUpdate {
    /// The request.
    pub id: u64,
    /// Steps done.
    pub step: u32,
    /// Total steps.
    pub steps: u32,
    /// Which patches the step just done computed (empty before the first patch-wise step).
    pub active: Vec<bool>,
    /// The patch of every latent token, once the warm-up has partitioned the latent.
    pub patch_of: Option<Vec<u32>>,
}

impl StepUpdate {
    fn of(ev: &StepEvent) -> Self {
        Self {
            id: ev.id,
            step: ev.step,
            steps: ev.steps,
            active: ev.active.to_vec(),
            patch_of: ev.patch_of.map(<[u32]>::to_vec),
        }
    }
}

/// Where a request's answers go.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The result, once: the output, or the error that ended the request (a refused
    /// submission included, unless the command asked for an acceptance answer).
    pub result: Sender<Finished>,
    /// Step updates, when the front end streams them.
    pub events: Option<Sender<StepUpdate>>,
}

impl Reply {
    /// Results to `result`, no step updates.
    pub fn to(result: Sender<Finished>) -> Self {
        Self {
            result,
            events: None,
        }
    }

    /// Results to `result`, step updates to `events`.
    pub fn streaming(result: Sender<Finished>, events: Sender<StepUpdate>) -> Self {
        Self {
            result,
            events: Some(events),
        }
    }
}

/// What a front end asks of the engine's thread.
pub enum Command {
    /// A new request. With `accepted`, the admission check answers there (and a refused
    /// request sends no result); without, a refusal is the request's result.
    Submit {
        /// The request's id, unique among requests in flight.
        id: u64,
        /// The prompt.
        prompt: String,
        /// The prompt conditioned by the engine's model already (a front end that checks
        /// prompts before it queues them), or `None` to condition it here.
        cond: Option<Conditioning>,
        /// The settings.
        cfg: RequestConfig,
        /// Where its answers go.
        reply: Reply,
        /// The admission check's answer, for front ends that answer the caller at once.
        accepted: Option<Sender<Result<(), EngineError>>>,
    },
    /// A request an earlier engine left unfinished: from its checkpoint in the engine's
    /// checkpoint folder when there is a valid one, else from the start (the output is the
    /// same either way).
    Resume {
        /// The request's id.
        id: u64,
        /// The prompt.
        prompt: String,
        /// The settings.
        cfg: RequestConfig,
        /// Where its answers go.
        reply: Reply,
    },
    /// Cancels a request in flight: its result is [`EngineError::Cancelled`], sent before
    /// `done` is answered. `done` gets an error for a request not in flight.
    Cancel {
        /// The request.
        id: u64,
        /// The answer, when the front end waits for one.
        done: Option<Sender<Result<(), EngineError>>>,
    },
    /// Admits nothing more, finishes what is in flight, then stops the thread.
    Shutdown,
}

/// What the engine's thread publishes after every scheduling round.
#[derive(Debug, Default)]
struct Progress {
    rounds: u64,
    in_flight: usize,
    stopped: bool,
}

#[derive(Debug, Default)]
struct Beacon {
    progress: Mutex<Progress>,
    moved: Condvar,
}

impl Beacon {
    fn publish(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut self.progress.lock().unwrap_or_else(PoisonError::into_inner));
        self.moved.notify_all();
    }
}

fn stopped() -> EngineError {
    EngineError::Stopped
}

/// The engine on its own thread. Dropping it drains: what was admitted finishes first.
pub struct Service {
    tx: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    beacon: Arc<Beacon>,
    model: Arc<dyn Denoiser>,
    workers: u32,
}

impl Service {
    /// Starts `engine`'s thread.
    pub fn start(engine: Engine) -> Result<Self, EngineError> {
        let (tx, rx) = mpsc::channel();
        let beacon = Arc::new(Beacon::default());
        let model = engine.shared_model();
        let workers = engine.workers();
        let thread = {
            let beacon = beacon.clone();
            std::thread::Builder::new()
                .name("flashdiff-engine".into())
                .spawn(move || {
                    let mut engine = engine;
                    run(&mut engine, rx, &beacon)
                })
                .map_err(|source| EngineError::Io {
                    what: "cannot start the engine thread".into(),
                    source,
                })?
        };
        Ok(Self {
            tx,
            thread: Some(thread),
            beacon,
            model,
            workers,
        })
    }

    /// Runs `f` with `engine` as a service on a scoped thread, for a caller that keeps the
    /// engine afterwards (a study that serves several traces on one engine). Returns when
    /// `f` has returned and what was admitted has finished.
    pub fn scoped<T>(engine: &mut Engine, f: impl FnOnce(&Service) -> T) -> T {
        let (tx, rx) = mpsc::channel();
        let beacon = Arc::new(Beacon::default());
        let model = engine.shared_model();
        let workers = engine.workers();
        std::thread::scope(|scope| {
            let b = beacon.clone();
            scope.spawn(move || run(engine, rx, &b));
            let service = Service {
                tx,
                thread: None,
                beacon,
                model,
                workers,
            };
            // Dropping the service drains it; the scope then joins the thread.
            f(&service)
        })
    }

    /// The engine's model, to check prompts and settings before submitting them.
    pub fn model(&self) -> &Arc<dyn Denoiser> {
        &self.model
    }

    /// The engine's workers.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// A sender of commands, for front ends on other threads. A command sent after the
    /// service stopped is dropped with its reply senders.
    pub fn sender(&self) -> Sender<Command> {
        self.tx.clone()
    }

    fn send(&self, cmd: Command) -> Result<(), EngineError> {
        self.tx.send(cmd).map_err(|_| stopped())
    }

    /// Submits a request and waits for the admission check (no longer than one scheduling
    /// round): a refused request is refused here and sends no result.
    pub fn submit(
        &self,
        id: u64,
        prompt: &str,
        cfg: RequestConfig,
        reply: Reply,
    ) -> Result<(), EngineError> {
        self.submit_conditioned(id, prompt, None, cfg, reply)
    }

    /// [`Service::submit`] with the prompt already conditioned by the model (`cond`), which
    /// the engine then takes as it is instead of encoding the prompt again.
    pub fn submit_conditioned(
        &self,
        id: u64,
        prompt: &str,
        cond: Option<Conditioning>,
        cfg: RequestConfig,
        reply: Reply,
    ) -> Result<(), EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Submit {
            id,
            prompt: prompt.to_string(),
            cond,
            cfg,
            reply,
            accepted: Some(tx),
        })?;
        rx.recv().map_err(|_| stopped())?
    }

    /// Cancels a request in flight and waits until its result (cancelled) has been sent.
    pub fn cancel(&self, id: u64) -> Result<(), EngineError> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Cancel { id, done: Some(tx) })?;
        rx.recv().map_err(|_| stopped())?
    }

    /// Requests in flight after the last scheduling round.
    pub fn in_flight(&self) -> usize {
        self.beacon
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .in_flight
    }

    /// Waits until the engine's thread completes a scheduling round, or `timeout` passes,
    /// or the thread stops; returns the requests in flight then. Returns at once when
    /// nothing is in flight.
    pub fn wait_round(&self, timeout: Duration) -> usize {
        let p = self
            .beacon
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if p.in_flight == 0 || p.stopped {
            return p.in_flight;
        }
        let seen = p.rounds;
        let (p, _) = self
            .beacon
            .moved
            .wait_timeout_while(p, timeout, |p| p.rounds == seen && !p.stopped)
            .unwrap_or_else(PoisonError::into_inner);
        p.in_flight
    }

    /// Finishes what was admitted and stops the thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Answers of the requests in flight.
#[derive(Default)]
struct Replies(HashMap<u64, Reply>);

impl Replies {
    fn finish(&mut self, id: u64, r: Result<Output, EngineError>) {
        if let Some(reply) = self.0.remove(&id) {
            let _ = reply.result.send((id, r));
        }
    }

    fn deliver(&mut self, engine: &mut Engine) {
        for r in engine.take_finished() {
            match r {
                Ok(o) => self.finish(o.report.id, Ok(o)),
                Err((id, e)) => self.finish(id, Err(e)),
            }
        }
    }

    fn step(&self, ev: &StepEvent) {
        if let Some(tx) = self.0.get(&ev.id).and_then(|r| r.events.as_ref()) {
            let _ = tx.send(StepUpdate::of(ev));
        }
    }
}

/// The engine's thread: admits commands between scheduling rounds, runs rounds while
/// anything is in flight, and sends every result to its request's reply.
fn run(engine: &mut Engine, rx: Receiver<Command>, beacon: &Beacon) {
    let mut replies = Replies::default();
    // A panic in the engine (a bug) must not leave front ends waiting for answers that
    // never come: every request in flight gets it as its error, and the service stops.
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(engine, &rx, beacon, &mut replies)
    }));
    if let Err(panic) = served {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        log::error!("the engine panicked: {what}");
        for (id, reply) in replies.0.drain() {
            let _ = reply.result.send((
                id,
                Err(EngineError::Internal(format!(
                    "the engine stopped: it panicked ({what})"
                ))),
            ));
        }
    }
    beacon.publish(|p| {
        p.stopped = true;
        p.in_flight = 0;
    });
}

/// The loop of [`run`]: commands between rounds, rounds while anything is in flight.
fn serve(engine: &mut Engine, rx: &Receiver<Command>, beacon: &Beacon, replies: &mut Replies) {
    let mut open = true;
    loop {
        if engine.in_flight() == 0 {
            if !open {
                break;
            }
            // Idle: block for the next command.
            match rx.recv() {
                Ok(c) => handle(engine, replies, c, &mut open),
                Err(_) => open = false,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => handle(engine, replies, c, &mut open),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if engine.in_flight() > 0 {
            engine.poll(&mut |ev| replies.step(ev), Duration::from_millis(5));
        }
        replies.deliver(engine);
        let n = engine.in_flight();
        beacon.publish(|p| {
            p.rounds += 1;
            p.in_flight = n;
        });
    }
}

fn handle(engine: &mut Engine, replies: &mut Replies, cmd: Command, open: &mut bool) {
    match cmd {
        Command::Submit {
            id,
            prompt,
            cond,
            cfg,
            reply,
            accepted,
        } => {
            let admitted = match !*open {
                true => Err(stopped()),
                false if replies.0.contains_key(&id) => Err(EngineError::Invalid {
                    field: "id",
                    reason: format!("{id}: a request with this id is already in flight"),
                }),
                false => match cond {
                    Some(c) => engine.submit_conditioned(id, &prompt, c, cfg),
                    None => engine.submit(id, &prompt, cfg),
                },
            };
            match (admitted, accepted) {
                (Ok(()), accepted) => {
                    replies.0.insert(id, reply);
                    if let Some(a) = accepted {
                        let _ = a.send(Ok(()));
                    }
                }
                (Err(e), Some(a)) => {
                    let _ = a.send(Err(e));
                }
                (Err(e), None) => {
                    let _ = reply.result.send((id, Err(e)));
                }
            }
        }
        Command::Resume {
            id,
            prompt,
            cfg,
            reply,
        } => {
            if !*open {
                let _ = reply.result.send((id, Err(stopped())));
                return;
            }
            match resume(engine, id, &prompt, cfg) {
                Ok(()) => {
                    replies.0.insert(id, reply);
                }
                Err(e) => {
                    let _ = reply.result.send((id, Err(e)));
                }
            }
        }
        Command::Cancel { id, done } => {
            let r = engine.cancel(id);
            // The cancelled result goes out before the answer, so that a front end that
            // waited for the answer finds the result already sent.
            replies.deliver(engine);
            if let Some(d) = done {
                let _ = d.send(r);
            }
        }
        Command::Shutdown => *open = false,
    }
}

/// Takes up a request an earlier engine left unfinished: from its checkpoint when there
/// is a valid one, else from the start.
fn resume(
    engine: &mut Engine,
    id: u64,
    prompt: &str,
    cfg: RequestConfig,
) -> Result<(), EngineError> {
    let path = engine
        .checkpoint_dir()
        .map(|d| checkpoint::path(d, id))
        .filter(|p| p.exists());
    if let Some(p) = path {
        let resumed = checkpoint::read(&p)
            .and_then(|c| match c.id == id {
                true => Ok(c),
                false => Err(format!("checkpoint {} is of request {}", p.display(), c.id)),
            })
            .map_err(EngineError::Config)
            .and_then(|c| {
                let step = c.step;
                engine.resume(c).map(|()| step)
            });
        match resumed {
            Ok(step) => {
                log::info!("request {id}: resumed at step {step}");
                return Ok(());
            }
            Err(e) => log::warn!("request {id}: {e}; starting it again"),
        }
    }
    engine.submit(id, prompt, cfg)
}

#[cfg(test)]
mod tests;
