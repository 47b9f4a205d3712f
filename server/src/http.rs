//! `flashdiff serve --port P`: the engine behind HTTP.
//!
//! One driver thread owns the [`Engine`] (it is `&mut` and runs the model); HTTP handlers on
//! the tokio runtime check a request and condition its prompt (on a blocking thread, once),
//! then hand it to the driver over a channel and read the job table. A request starts when
//! it arrives: the driver admits it between scheduling rounds, so new requests join the ones
//! in flight. Finished jobs go to a finisher thread, which encodes, saves and journals them:
//! the driver does no disk I/O of results and never waits for the job table's lock while
//! a result is written.
//!
//! Endpoints: `POST /v1/images/generations` (OpenAI-compatible, waits for the images),
//! `POST /v1/jobs`, `GET|DELETE /v1/jobs/{id}`, `GET /v1/jobs/{id}/events` (server-sent
//! events, one per step with its active patches and the patch layout, then the result; a
//! late subscriber gets the latest step first), `GET /` (a page: prompt box, live progress,
//! the patch map step by step, the image), `GET /healthz`,
//! `GET /metrics` (Prometheus text). Errors are JSON `{"error": {"message", "type"}}` naming
//! the field. Past `--max-queue` unfinished jobs new work gets 429 with `Retry-After`.
//! SIGTERM and SIGINT stop accepting, finish what was admitted, then exit.
//!
//! With a state directory ([`crate::journal`]) every job's admission and end are journaled
//! (synced), results saved, and requests checkpointed at every step: a server killed at any
//! point, started again on the same directory, resumes every unfinished job from its last
//! step (or from its start when it had none) and answers for the finished ones.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use flashdiff_runtime::checkpoint;
use flashdiff_runtime::engine::{
    check_request, from_config_record, to_config_record, Engine, EngineError, Output,
    RequestConfig, StepEvent,
};
use flashdiff_runtime::schema::RequestFields;

use crate::journal::{Entry, JobRecord, Store};
use flashdiff_runtime::image;
use flashdiff_runtime::models::scene::IMAGE;
use flashdiff_runtime::models::{Conditioning, Denoiser};

/// Server settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Address to bind, e.g. `127.0.0.1:8080`.
    pub addr: String,
    /// Most unfinished jobs (queued and running) before new ones get 429.
    pub max_queue: usize,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// Request defaults (the serve flags).
    pub base: RequestConfig,
    /// The operator's `--warmup`; `None`: a request that gives none runs the model's
    /// default warm-up, shortened to fit below its steps.
    pub warmup: Option<u32>,
    /// Where jobs and checkpoints survive a crash (`None`: nothing survives).
    pub state_dir: Option<std::path::PathBuf>,
    /// Least time between two checkpoints of a request (zero: every step).
    pub checkpoint_every: Duration,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Running => "running",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
        }
    }
    fn done(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Cancelled)
    }
}

struct Job {
    phase: Phase,
    created: u64,
    /// PNG scale factor (the `size` asked for over the model's side).
    scale: usize,
    report: Option<Value>,
    png: Option<Vec<u8>>,
    error: Option<String>,
    last_step: Option<Instant>,
    /// A DELETE asked to cancel it (it reads "cancelling" until the engine stops it).
    cancelling: bool,
    /// The latest step event, replayed first to a subscriber that joins while it runs.
    last_event: Option<Value>,
    /// Step events for subscribers; dropped once the job ends (after its "done" event), so
    /// a finished job holds no event buffer.
    events: Option<broadcast::Sender<Value>>,
    phase_tx: watch::Sender<Phase>,
}

/// Counters for `/metrics`.
#[derive(Default)]
struct Metrics {
    admitted: AtomicU64,
    rejected: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    patch_steps: AtomicU64,
    computed: AtomicU64,
    /// Step latency histogram: counts per bucket of [`STEP_BUCKETS`] (+Inf last), sum in µs.
    step_buckets: Mutex<([u64; STEP_BUCKETS.len() + 1], f64)>,
}

/// Upper bounds of the step latency histogram, seconds.
const STEP_BUCKETS: [f64; 8] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5];

enum Cmd {
    /// A new job, its prompt conditioned by the handler that checked it.
    Submit {
        id: u64,
        prompt: String,
        cond: Conditioning,
        cfg: RequestConfig,
    },
    Cancel(u64),
    /// A job the previous server left unfinished: from its checkpoint, else from the start.
    Resume {
        id: u64,
        prompt: String,
        cfg: RequestConfig,
    },
}

struct Hub {
    jobs: Mutex<HashMap<u64, Job>>,
    next_id: AtomicU64,
    cmds: Mutex<mpsc::Sender<Cmd>>,
    metrics: Metrics,
    cfg: HttpConfig,
    workers: u32,
    model: String,
    /// The engine's model, to check prompts and settings before admitting them.
    checker: Arc<dyn Denoiser>,
    accepting: std::sync::atomic::AtomicBool,
    /// The journal and results (locked after `jobs` when both are held).
    store: Option<Mutex<Store>>,
}

type Shared = Arc<Hub>;

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An error response: status, JSON body naming what was wrong.
fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"message": message.into(), "type": kind}});
    (status, Json(body)).into_response()
}

/// A lock held by a thread that panicked: the job table can no longer be trusted.
fn poisoned() -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "job table poisoned",
    )
}

fn bad(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// Runs the server until SIGTERM/SIGINT; returns after draining.
pub fn serve(mut engine: Engine, cfg: HttpConfig) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let mut jobs = HashMap::new();
    let mut next_id = 1;
    let store = match &cfg.state_dir {
        None => None,
        Some(dir) => {
            let (mut store, replayed) = Store::open(dir)?;
            engine
                .set_checkpoint_dir(Some(store.checkpoints()), cfg.checkpoint_every)
                .map_err(|e| e.to_string())?;
            next_id = replayed.iter().map(|j| j.id + 1).max().unwrap_or(1);
            let kept = restore(&store, replayed, &mut jobs, &tx, cfg.max_queue)?;
            store.compact(&kept.0, &kept.1)?;
            Some(Mutex::new(store))
        }
    };
    let hub = Arc::new(Hub {
        jobs: Mutex::new(jobs),
        next_id: AtomicU64::new(next_id),
        cmds: Mutex::new(tx),
        metrics: Metrics::default(),
        workers: engine.workers(),
        model: engine.model().name().to_string(),
        checker: engine.shared_model(),
        cfg: cfg.clone(),
        accepting: std::sync::atomic::AtomicBool::new(true),
        store,
    });
    let (done_tx, done_rx) = mpsc::channel();
    let finisher = {
        let hub = hub.clone();
        std::thread::Builder::new()
            .name("flashdiff-finisher".into())
            .spawn(move || finish(done_rx, hub))
            .map_err(|e| format!("cannot start the results thread: {e}"))?
    };
    let driver = {
        let hub = hub.clone();
        std::thread::Builder::new()
            .name("flashdiff-driver".into())
            .spawn(move || drive(engine, rx, hub, done_tx))
            .map_err(|e| format!("cannot start the engine thread: {e}"))?
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    let res = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&cfg.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", cfg.addr))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        eprintln!(
            "flashdiff: serving {} on http://{local} ({} worker(s)); SIGTERM or Ctrl-C drains and stops",
            hub.model, hub.workers
        );
        let app = router(hub.clone());
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown(hub.clone()))
            .await
            .map_err(|e| format!("HTTP server failed: {e}"))
    });
    // Drain: the driver finishes what was admitted, then exits when the sender is dropped.
    hub.accepting.store(false, Relaxed);
    if let Ok(mut tx) = hub.cmds.lock() {
        let (dead, _) = mpsc::channel();
        *tx = dead;
    }
    drop(rt);
    let _ = driver.join();
    let _ = finisher.join();
    eprintln!("flashdiff: stopped");
    res
}

fn phase_code(p: Phase) -> u8 {
    match p {
        Phase::Failed => 1,
        Phase::Cancelled => 2,
        _ => 0,
    }
}

/// Rebuilds the job table from the journal: finished jobs with their results (the newest
/// `4 x max_queue` of them; a succeeded job whose result files are gone is forgotten), and
/// every unfinished one queued to resume. Returns the jobs kept and the ids forgotten.
fn restore(
    store: &Store,
    replayed: Vec<JobRecord>,
    jobs: &mut HashMap<u64, Job>,
    tx: &mpsc::Sender<Cmd>,
    max_queue: usize,
) -> Result<(Vec<JobRecord>, Vec<u64>), String> {
    let keep = 4 * max_queue.max(1);
    let finished = replayed.iter().filter(|j| j.end.is_some()).count();
    let mut drop_finished = finished.saturating_sub(keep);
    let (mut kept, mut forgotten) = (Vec::new(), Vec::new());
    let mut resumed = 0;
    for j in replayed {
        let result = match &j.end {
            Some(_) if drop_finished > 0 => {
                drop_finished -= 1;
                forgotten.push(j.id);
                continue;
            }
            Some((0, _)) => match store.load_result(j.id) {
                Some(r) => Some(r),
                None => {
                    log::warn!("job {}: its saved result is gone; forgotten", j.id);
                    forgotten.push(j.id);
                    continue;
                }
            },
            _ => None,
        };
        let phase = match &j.end {
            None => Phase::Queued,
            Some((0, _)) => Phase::Succeeded,
            Some((2, _)) => Phase::Cancelled,
            Some(_) => Phase::Failed,
        };
        let (png, report) = match result {
            Some((png, report)) => (Some(png), Some(report)),
            None => (None, None),
        };
        let (phase_tx, _) = watch::channel(phase);
        jobs.insert(
            j.id,
            Job {
                phase,
                created: j.created,
                scale: j.scale.max(1) as usize,
                report,
                png,
                error: j
                    .end
                    .as_ref()
                    .map(|e| e.1.clone())
                    .filter(|e| !e.is_empty()),
                last_step: None,
                last_event: None,
                cancelling: false,
                events: (!phase.done()).then(|| broadcast::channel(256).0),
                phase_tx,
            },
        );
        if j.end.is_none() {
            let cfg =
                from_config_record(&j.cfg).map_err(|e| format!("journal: job {}: {e}", j.id))?;
            let _ = tx.send(Cmd::Resume {
                id: j.id,
                prompt: j.prompt.clone(),
                cfg,
            });
            resumed += 1;
        }
        kept.push(j);
    }
    // Checkpoints of jobs that ended (or were forgotten) before a crash could remove them.
    let unfinished: std::collections::HashSet<u64> = kept
        .iter()
        .filter(|j| j.end.is_none())
        .map(|j| j.id)
        .collect();
    if let Ok(entries) = std::fs::read_dir(store.checkpoints()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let id = name
                .strip_prefix("request-")
                .and_then(|n| n.split('.').next())
                .and_then(|n| n.parse::<u64>().ok());
            if id.is_none_or(|id| !unfinished.contains(&id) || name.ends_with(".tmp")) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if resumed > 0 || !kept.is_empty() {
        log::warn!(
            "state directory: {} job(s) restored, {resumed} of them unfinished and resuming",
            kept.len()
        );
    }
    Ok((kept, forgotten))
}

async fn shutdown(hub: Shared) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    hub.accepting.store(false, Relaxed);
    eprintln!("flashdiff: draining (no new requests accepted)");
    // Let admitted jobs finish before the listener closes their waiting handlers.
    loop {
        let open = hub
            .jobs
            .lock()
            .map(|j| j.values().filter(|j| !j.phase.done()).count())
            .unwrap_or(0);
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn router(hub: Shared) -> Router {
    let limit = hub.cfg.body_limit;
    Router::new()
        .route("/", get(page))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/images/generations", post(generations))
        .route("/v1/jobs", post(create_job))
        .route("/v1/jobs/{id}", get(get_job).delete(delete_job))
        .route("/v1/jobs/{id}/events", get(job_events))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(hub)
}

/// The engine's thread: admits commands between scheduling rounds, runs monotasks, and
/// records steps and results in the job table.
/// A job the engine is done with, for the finisher thread.
enum Done {
    Ok(Box<Output>),
    Err(u64, Phase, String),
}

/// The finisher's thread: encodes results, writes them and the journal, and updates the
/// job table, so that the engine's thread does no disk I/O and never waits for a handler's
/// lock. It ends when the driver does.
fn finish(rx: mpsc::Receiver<Done>, hub: Shared) {
    for d in rx {
        match d {
            Done::Ok(o) => finish_ok(&hub, *o),
            Done::Err(id, phase, msg) => finish_err(&hub, id, phase, msg),
        }
    }
}

fn drive(mut engine: Engine, rx: mpsc::Receiver<Cmd>, hub: Shared, done: mpsc::Sender<Done>) {
    let mut open = true;
    let g = engine.model().dims().grid;
    let grid = [g.frames, g.height, g.width];
    loop {
        // Block for work only when idle.
        let first = if engine.in_flight() == 0 {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => {
                    open = false;
                    continue;
                }
            }
        } else {
            None
        };
        for cmd in first
            .into_iter()
            .chain(std::iter::from_fn(|| match rx.try_recv() {
                Ok(c) => Some(c),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    None
                }
            }))
        {
            match cmd {
                Cmd::Submit {
                    id,
                    prompt,
                    cond,
                    cfg,
                } => {
                    if let Err(e) = engine.submit_conditioned(id, &prompt, cond, cfg) {
                        let _ = done.send(Done::Err(id, Phase::Failed, e.to_string()));
                    }
                }
                Cmd::Cancel(id) => {
                    // Not in flight (finished meanwhile): nothing to do.
                    let _ = engine.cancel(id);
                }
                Cmd::Resume { id, prompt, cfg } => resume_job(&mut engine, &done, id, &prompt, cfg),
            }
        }
        if engine.in_flight() > 0 {
            engine.poll(
                &mut |ev| step_event(&hub, ev, grid),
                Duration::from_millis(5),
            );
        }
        // Also after a cancel that emptied the engine: its result is waiting here.
        for r in engine.take_finished() {
            let _ = done.send(match r {
                Ok(o) => Done::Ok(Box::new(o)),
                Err((id, e)) => {
                    let phase = match e {
                        EngineError::Cancelled(_) => Phase::Cancelled,
                        _ => Phase::Failed,
                    };
                    Done::Err(id, phase, e.to_string())
                }
            });
        }
    }
}

/// Takes up a job the previous server left unfinished: from its checkpoint when there is a
/// valid one, else from the start (the output is the same either way).
fn resume_job(
    engine: &mut Engine,
    done: &mpsc::Sender<Done>,
    id: u64,
    prompt: &str,
    cfg: RequestConfig,
) {
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
            Ok(step) => return log::info!("job {id}: resumed at step {step}"),
            Err(e) => log::warn!("job {id}: {e}; starting it again"),
        }
    }
    if let Err(e) = engine.submit(id, prompt, cfg) {
        let _ = done.send(Done::Err(id, Phase::Failed, e.to_string()));
    }
}

/// Runs `f` on the store, if the server has one.
fn journal(hub: &Hub, f: impl FnOnce(&mut Store) -> Result<(), String>) -> Result<(), String> {
    match &hub.store {
        None => Ok(()),
        Some(store) => f(&mut *store
            .lock()
            .map_err(|_| "the store is poisoned".to_string())?),
    }
}

fn step_event(hub: &Hub, ev: &StepEvent, grid: [usize; 3]) {
    let (id, step, total) = (ev.id, ev.step, ev.steps);
    let Ok(mut jobs) = hub.jobs.lock() else {
        return;
    };
    let Some(j) = jobs.get_mut(&id) else {
        return;
    };
    if j.phase == Phase::Queued {
        j.phase = Phase::Running;
        let _ = j.phase_tx.send(Phase::Running);
    }
    let now = Instant::now();
    if let Some(prev) = j.last_step.replace(now) {
        let s = now.duration_since(prev).as_secs_f64();
        if let Ok(mut h) = hub.metrics.step_buckets.lock() {
            let b = STEP_BUCKETS
                .iter()
                .position(|&u| s <= u)
                .unwrap_or(STEP_BUCKETS.len());
            h.0[b] += 1;
            h.1 += s;
        }
    }
    if step < total {
        // The layout rides along, so a page can draw the patch map from any step it sees.
        let ev = json!({
            "type": "step",
            "step": step,
            "steps": total,
            "active": ev.active,
            "patch_of": ev.patch_of,
            "grid": grid,
        });
        if let Some(events) = &j.events {
            let _ = events.send(ev.clone());
        }
        j.last_event = Some(ev);
    }
}

fn finish_ok(hub: &Hub, o: Output) {
    let id = o.report.id;
    let m = &hub.metrics;
    m.completed.fetch_add(1, Relaxed);
    m.patch_steps.fetch_add(o.report.patch_steps, Relaxed);
    m.computed.fetch_add(o.report.computed, Relaxed);
    let Some(scale) = hub
        .jobs
        .lock()
        .ok()
        .and_then(|j| j.get(&id).map(|j| j.scale))
    else {
        return;
    };
    // Encoded, saved and journaled without the job table's lock, and before anyone can
    // read "succeeded".
    let report = flashdiff_runtime::engine::report_json(&o);
    let png = image::png(&o.sample.rgb, o.sample.width, o.sample.height, scale);
    if let Err(e) = journal(hub, |s| {
        s.save_result(id, &png, &report)?;
        s.append(&Entry::Finished {
            id,
            phase: 0,
            error: String::new(),
        })
    }) {
        log::error!("job {id}: {e}");
    }
    let Ok(mut jobs) = hub.jobs.lock() else {
        return;
    };
    let Some(j) = jobs.get_mut(&id) else {
        return;
    };
    j.png = Some(png);
    j.report = Some(report.clone());
    j.phase = Phase::Succeeded;
    j.last_event = None;
    if let Some(events) = j.events.take() {
        let _ = events.send(json!({"type": "done", "state": "succeeded", "report": report}));
    }
    let _ = j.phase_tx.send(Phase::Succeeded);
}

fn finish_err(hub: &Hub, id: u64, phase: Phase, msg: String) {
    let m = &hub.metrics;
    match phase {
        Phase::Cancelled => m.cancelled.fetch_add(1, Relaxed),
        _ => m.failed.fetch_add(1, Relaxed),
    };
    let Ok(mut jobs) = hub.jobs.lock() else {
        return;
    };
    let Some(j) = jobs.get_mut(&id) else {
        return;
    };
    if let Err(e) = journal(hub, |s| {
        s.append(&Entry::Finished {
            id,
            phase: phase_code(phase),
            error: msg.clone(),
        })
    }) {
        log::error!("job {id}: {e}");
    }
    j.phase = phase;
    j.error = Some(msg.clone());
    j.last_event = None;
    if let Some(events) = j.events.take() {
        let _ = events.send(json!({"type": "done", "state": phase.name(), "error": msg}));
    }
    let _ = j.phase_tx.send(phase);
}

/// A parsed generation request: prompt, per-image settings, images wanted, PNG scale.
struct GenRequest {
    prompt: String,
    /// The prompt conditioned by the model, once: the engine takes it as it is.
    cond: Option<Conditioning>,
    cfg: RequestConfig,
    n: u32,
    scale: usize,
}

/// Parses and checks a generation request: every field, the settings together, and the
/// prompt against the model's vocabulary, so that what is admitted can run.
fn parse(body: &[u8], cfg: &HttpConfig, model: &dyn Denoiser) -> Result<GenRequest, String> {
    let side = model.image_size().unwrap_or((IMAGE, IMAGE));
    let warmup = Warmups {
        server: cfg.warmup,
        model: model.default_warmup(),
    };
    let g = parse_fields(body, &cfg.base, warmup, model.name(), side)?;
    check_request(model, &g.cfg).map_err(|e| e.to_string())?;
    let cond = model
        .condition(&g.prompt)
        .map_err(|e| format!("\"prompt\": {e}"))?;
    Ok(GenRequest {
        cond: Some(cond),
        ..g
    })
}

/// Where a request's warm-up comes from when it gives none.
#[derive(Debug, Clone, Copy)]
struct Warmups {
    /// The operator's `--warmup`.
    server: Option<u32>,
    /// The model's default.
    model: u32,
}

/// `side`: `(width, height)` of the model's images; "size" asks for a whole multiple.
fn parse_fields(
    body: &[u8],
    base: &RequestConfig,
    warmups: Warmups,
    model: &str,
    side: (usize, usize),
) -> Result<GenRequest, String> {
    let f = RequestFields::from_json(body).map_err(|e| e.to_string())?;
    if f.id.is_some() {
        return Err("\"id\": the server numbers its jobs itself".into());
    }
    let prompt = match f.prompt.as_deref() {
        Some(s) if !s.trim().is_empty() => s.to_string(),
        Some(_) => return Err("\"prompt\" is empty".into()),
        None => return Err("\"prompt\" is required".into()),
    };
    let n = match f.n {
        None => 1,
        Some(n @ 1..=4) => n as u32,
        Some(n) => return Err(format!("\"n\" {n}: must be in 1..=4")),
    };
    let (sw, sh) = (side.0.max(1) as u64, side.1.max(1) as u64);
    // The built-in 32-pixel images may be enlarged up to 32x (8x by default); larger
    // images up to 1024 pixels a side.
    let most = (1024 / sw.max(sh)).clamp(1, 32);
    let scale = match f.size.as_deref() {
        None => (256 / sw).clamp(1, 8) as usize,
        Some(s) => {
            let parsed = s
                .split_once('x')
                .and_then(|(w, h)| Some((w.parse::<u64>().ok()?, h.parse::<u64>().ok()?)));
            match parsed {
                Some((w, h))
                    if w % sw == 0 && (1..=most).contains(&(w / sw)) && h * sw == w * sh =>
                {
                    (w / sw) as usize
                }
                _ => {
                    return Err(format!(
                        "\"size\" {s:?}: must be {sw}x{sh} times a whole number up to {most} \
                         (the model makes {sw}x{sh} images, scaled up)"
                    ))
                }
            }
        }
    };
    if let Some(f) = f.response_format.as_deref().filter(|f| *f != "b64_json") {
        return Err(format!(
            "\"response_format\" {f:?}: only \"b64_json\" is supported (no image hosting)"
        ));
    }
    if let Some(f) = f.output_format.as_deref().filter(|f| *f != "png") {
        return Err(format!(
            "\"output_format\" {f:?}: only \"png\" is supported"
        ));
    }
    if let Some(m) = f.model.as_deref().filter(|m| *m != model) {
        return Err(format!("\"model\" {m:?}: this server runs {model:?}"));
    }
    // The warm-up a request leaves out: the operator's, else the model's (fitted to the
    // steps); a request's own is checked with the other settings.
    let given_warmup = f.warmup.is_some();
    let mut cfg = f.settings(base).map_err(|e| e.to_string())?;
    if !given_warmup {
        cfg.warmup = match warmups.server {
            Some(w) if w >= cfg.steps => {
                return Err(format!(
                    "\"steps\" {}: this server's --warmup {w} needs more; give a \"warmup\" \
                     below {}",
                    cfg.steps, cfg.steps
                ))
            }
            Some(w) => w,
            None => flashdiff_runtime::engine::fit_warmup(warmups.model, cfg.steps),
        };
    }
    Ok(GenRequest {
        prompt,
        cond: None,
        cfg,
        n,
        scale,
    })
}

/// Admits `g` as `g.n` jobs (seeds `seed`, `seed + 1`, ...); 429 past the queue bound, 503
/// while draining.
fn admit(hub: &Hub, g: &GenRequest) -> Result<Vec<(u64, watch::Receiver<Phase>)>, Box<Response>> {
    if !hub.accepting.load(Relaxed) {
        return Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the server is shutting down",
        )));
    }
    let cond = g.cond.as_ref().ok_or_else(|| {
        Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the prompt was not conditioned",
        ))
    })?;
    let mut jobs = hub.jobs.lock().map_err(|_| Box::new(poisoned()))?;
    let open = jobs.values().filter(|j| !j.phase.done()).count();
    if open + g.n as usize > hub.cfg.max_queue {
        hub.metrics.rejected.fetch_add(1, Relaxed);
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "{open} jobs unfinished, the queue holds {}: retry later",
                hub.cfg.max_queue
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Err(Box::new(r));
    }
    // Keep the table bounded: forget the oldest finished jobs beyond 4x the queue bound.
    let keep = 4 * hub.cfg.max_queue.max(1);
    if jobs.len() >= keep {
        let mut done: Vec<(u64, u64)> = jobs
            .iter()
            .filter(|(_, j)| j.phase.done())
            .map(|(&id, j)| (j.created, id))
            .collect();
        done.sort_unstable();
        for (_, id) in done.iter().take(jobs.len() + g.n as usize - keep) {
            jobs.remove(id);
            let _ = journal(hub, |s| {
                s.remove_result(*id);
                Ok(())
            });
        }
    }
    let cmds = hub.cmds.lock().map_err(|_| {
        Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "queue poisoned",
        ))
    })?;
    let mut out = Vec::new();
    for i in 0..g.n {
        let id = hub.next_id.fetch_add(1, Relaxed);
        // Enough for a slow client to miss no step of a typical request; a client further
        // behind skips steps (never the "done" event, which is the last).
        let (events, _) = broadcast::channel(256);
        let (phase_tx, phase_rx) = watch::channel(Phase::Queued);
        jobs.insert(
            id,
            Job {
                phase: Phase::Queued,
                created: now_s(),
                scale: g.scale,
                report: None,
                png: None,
                error: None,
                last_step: None,
                last_event: None,
                cancelling: false,
                events: Some(events),
                phase_tx,
            },
        );
        let cfg = RequestConfig {
            seed: g.cfg.seed.wrapping_add(i as u64),
            ..g.cfg.clone()
        };
        if let Err(e) = journal(hub, |s| {
            s.append(&Entry::Submitted {
                id,
                prompt: g.prompt.clone(),
                cfg: to_config_record(&cfg),
                scale: g.scale as u32,
                created: now_s(),
            })
        }) {
            jobs.remove(&id);
            return Err(Box::new(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("cannot record the job: {e}"),
            )));
        }
        if cmds
            .send(Cmd::Submit {
                id,
                prompt: g.prompt.clone(),
                cond: cond.clone(),
                cfg,
            })
            .is_err()
        {
            jobs.remove(&id);
            return Err(Box::new(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the engine has stopped",
            )));
        }
        hub.metrics.admitted.fetch_add(1, Relaxed);
        out.push((id, phase_rx));
    }
    Ok(out)
}

async fn healthz(State(hub): State<Shared>) -> Response {
    Json(json!({"status": if hub.accepting.load(Relaxed) { "ok" } else { "draining" }, "model": hub.model, "workers": hub.workers})).into_response()
}

async fn metrics(State(hub): State<Shared>) -> Response {
    let (queued, running) = hub
        .jobs
        .lock()
        .map(|j| {
            (
                j.values().filter(|j| j.phase == Phase::Queued).count(),
                j.values().filter(|j| j.phase == Phase::Running).count(),
            )
        })
        .unwrap_or((0, 0));
    let m = &hub.metrics;
    let mut s = String::new();
    let mut line = |name: &str, kind: &str, help: &str, v: String| {
        s.push_str(&format!(
            "# HELP flashdiff_{name} {help}\n# TYPE flashdiff_{name} {kind}\nflashdiff_{name} {v}\n"
        ));
    };
    line(
        "queue_depth",
        "gauge",
        "Jobs admitted and not started.",
        queued.to_string(),
    );
    line("in_flight", "gauge", "Jobs running.", running.to_string());
    for (name, c, help) in [
        ("admitted_total", &m.admitted, "Jobs admitted."),
        ("rejected_total", &m.rejected, "Requests rejected with 429."),
        (
            "completed_total",
            &m.completed,
            "Jobs finished with an image.",
        ),
        ("failed_total", &m.failed, "Jobs that failed."),
        ("cancelled_total", &m.cancelled, "Jobs cancelled."),
    ] {
        line(name, "counter", help, c.load(Relaxed).to_string());
    }
    let (ps, comp) = (m.patch_steps.load(Relaxed), m.computed.load(Relaxed));
    line(
        "patch_steps_skipped_ratio",
        "gauge",
        "Share of patch-steps skipped over completed jobs.",
        format!(
            "{}",
            if ps > 0 {
                1.0 - comp as f64 / ps as f64
            } else {
                0.0
            }
        ),
    );
    if let Ok(h) = m.step_buckets.lock() {
        s.push_str("# HELP flashdiff_step_seconds Time between a job's consecutive steps.\n# TYPE flashdiff_step_seconds histogram\n");
        let mut cum = 0;
        for (i, &c) in h.0.iter().enumerate() {
            cum += c;
            let le = STEP_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |u| u.to_string());
            s.push_str(&format!(
                "flashdiff_step_seconds_bucket{{le=\"{le}\"}} {cum}\n"
            ));
        }
        s.push_str(&format!(
            "flashdiff_step_seconds_sum {}\nflashdiff_step_seconds_count {cum}\n",
            h.1
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s).into_response()
}

/// Parses a request and conditions its prompt off the async threads (for a real model that
/// runs its text encoders).
async fn parse_blocking(hub: &Shared, body: axum::body::Bytes) -> Result<GenRequest, Response> {
    let hub = hub.clone();
    match tokio::task::spawn_blocking(move || parse(&body, &hub.cfg, &*hub.checker)).await {
        Ok(Ok(g)) => Ok(g),
        Ok(Err(e)) => Err(bad(e)),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("checking the request failed: {e}"),
        )),
    }
}

async fn generations(State(hub): State<Shared>, body: axum::body::Bytes) -> Response {
    let g = match parse_blocking(&hub, body).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    let ids = match admit(&hub, &g) {
        Ok(ids) => ids,
        Err(r) => return *r,
    };
    let mut data = Vec::new();
    let mut reports = Vec::new();
    for (id, mut rx) in ids {
        let _ = rx.wait_for(|p| p.done()).await;
        let Ok(jobs) = hub.jobs.lock() else {
            return poisoned();
        };
        let Some(j) = jobs.get(&id) else {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "job vanished",
            );
        };
        match (&j.png, &j.error) {
            (Some(png), _) => {
                data.push(
                    json!({"b64_json": base64::engine::general_purpose::STANDARD.encode(png)}),
                );
                reports.push(j.report.clone().unwrap_or(Value::Null));
            }
            (None, Some(e)) => {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "generation_error",
                    e.clone(),
                )
            }
            (None, None) => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "job ended without a result",
                )
            }
        }
    }
    Json(json!({"created": now_s(), "data": data, "flashdiff": {"reports": reports}}))
        .into_response()
}

async fn create_job(State(hub): State<Shared>, body: axum::body::Bytes) -> Response {
    let g = match parse_blocking(&hub, body).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    if g.n != 1 {
        return bad("\"n\": a job makes one image; submit one job per image");
    }
    match admit(&hub, &g) {
        Ok(ids) => {
            let id = ids[0].0;
            (
                StatusCode::ACCEPTED,
                [(header::LOCATION, format!("/v1/jobs/{id}"))],
                Json(json!({"id": id, "state": "queued"})),
            )
                .into_response()
        }
        Err(r) => *r,
    }
}

fn job_id(raw: &str) -> Result<u64, Box<Response>> {
    raw.parse::<u64>()
        .map_err(|_| Box::new(bad(format!("job id {raw:?} is not a non-negative integer"))))
}

fn missing(id: u64) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no job {id} (never created, or forgotten long after it finished)"),
    )
}

/// The page at `/`: a prompt box, live progress and the patch map of every step (which
/// patches ran, which were skipped), then the image. Static; it talks to the job API.
async fn page() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("page.html"),
    )
        .into_response()
}

async fn get_job(State(hub): State<Shared>, Path(raw): Path<String>) -> Response {
    let id = match job_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let Ok(jobs) = hub.jobs.lock() else {
        return poisoned();
    };
    let Some(j) = jobs.get(&id) else {
        return missing(id);
    };
    Json(json!({
        "id": id,
        "state": if j.cancelling && !j.phase.done() {
            "cancelling"
        } else {
            j.phase.name()
        },
        "created": j.created,
        "report": j.report,
        "error": j.error,
        "b64_json": j.png.as_ref().map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
    }))
    .into_response()
}

async fn delete_job(State(hub): State<Shared>, Path(raw): Path<String>) -> Response {
    let id = match job_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let phase = match hub.jobs.lock() {
        Ok(mut jobs) => match jobs.get_mut(&id) {
            Some(j) => {
                j.cancelling |= !j.phase.done();
                j.phase
            }
            None => return missing(id),
        },
        Err(_) => return poisoned(),
    };
    if phase.done() {
        return error(
            StatusCode::CONFLICT,
            "conflict",
            format!("job {id} already {}", phase.name()),
        );
    }
    if let Ok(cmds) = hub.cmds.lock() {
        let _ = cmds.send(Cmd::Cancel(id));
    }
    (
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "state": "cancelling"})),
    )
        .into_response()
}

async fn job_events(State(hub): State<Shared>, Path(raw): Path<String>) -> Response {
    let id = match job_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let (rx, finished, latest) = match hub.jobs.lock() {
        Ok(jobs) => match jobs.get(&id) {
            Some(j) => (
                j.events.as_ref().map(broadcast::Sender::subscribe),
                j.phase.done().then(|| {
                    json!({"type": "done", "state": j.phase.name(), "report": j.report, "error": j.error})
                }),
                j.last_event.clone().filter(|_| !j.phase.done()),
            ),
            None => return missing(id),
        },
        Err(_) => return poisoned(),
    };
    // A finished job replays its result; a running one streams until its "done" event.
    let stream = futures_util::stream::unfold(
        (rx, finished, false, latest),
        |(mut rx, finished, ended, latest)| async move {
            if ended {
                return None;
            }
            if let Some(v) = latest {
                let ev = SseEvent::default().event("step").data(v.to_string());
                return Some((Ok::<_, Infallible>(ev), (rx, finished, false, None)));
            }
            if let Some(done) = finished {
                let ev = SseEvent::default().event("done").data(done.to_string());
                return Some((Ok(ev), (rx, None, true, None)));
            }
            // Unfinished jobs always have their sender (it is dropped when they end).
            let r = rx.as_mut()?;
            loop {
                match r.recv().await {
                    Ok(v) => {
                        let kind = v["type"].as_str().unwrap_or("step").to_string();
                        let last = kind == "done";
                        let ev = SseEvent::default().event(kind).data(v.to_string());
                        return Some((Ok(ev), (rx, None, last, None)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
