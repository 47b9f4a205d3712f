//! `flashdiff serve --port P`: the engine behind HTTP.
//!
//! The engine runs as the runtime's [`Service`] on its own thread; HTTP handlers on the
//! tokio runtime check a request and condition its prompt (on a blocking thread, once), then
//! send it to the service with the server's reply senders and read the job table. A request
//! starts when it arrives: the service admits it between scheduling rounds, so new requests
//! join the ones in flight. Step updates reach a step thread that keeps each job's progress;
//! results reach a finisher thread, which encodes, saves and journals them: the engine's
//! thread does no disk I/O and never takes the job table's lock.
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

mod driver;
mod handlers;
mod request;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flashdiff_runtime::engine::{from_config_record, Engine, RequestConfig};
use flashdiff_runtime::models::Denoiser;
use flashdiff_runtime::service::{Command, Reply, Service};
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use self::driver::{finish, step_event};
use self::handlers::{
    create_job, delete_job, generations, get_job, healthz, job_events, metrics, page,
};
use crate::journal::{JobRecord, Store};

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

/// The engine's command queue and where its answers go; gone once the server drains.
struct Outbox {
    tx: mpsc::Sender<Command>,
    reply: Reply,
}

struct Hub {
    jobs: Mutex<HashMap<u64, Job>>,
    next_id: AtomicU64,
    cmds: Mutex<Option<Outbox>>,
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
    let mut jobs = HashMap::new();
    let mut next_id = 1;
    let (mut store, replayed) = match &cfg.state_dir {
        None => (None, Vec::new()),
        Some(dir) => {
            let (store, replayed) = Store::open(dir)?;
            engine
                .set_checkpoint_dir(Some(store.checkpoints()), cfg.checkpoint_every)
                .map_err(|e| e.to_string())?;
            (Some(store), replayed)
        }
    };
    let workers = engine.workers();
    let model = engine.model().name().to_string();
    let checker = engine.shared_model();
    let g = checker.dims().grid;
    let grid = [g.frames, g.height, g.width];
    let service = Service::start(engine).map_err(|e| e.to_string())?;
    let (done_tx, done_rx) = mpsc::channel();
    let (step_tx, step_rx) = mpsc::channel();
    let outbox = Outbox {
        tx: service.sender(),
        reply: Reply::streaming(done_tx, step_tx),
    };
    if let Some(store) = &mut store {
        next_id = replayed.iter().map(|j| j.id + 1).max().unwrap_or(1);
        let kept = restore(store, replayed, &mut jobs, &outbox, cfg.max_queue)?;
        store.compact(&kept.0, &kept.1)?;
    }
    let hub = Arc::new(Hub {
        jobs: Mutex::new(jobs),
        next_id: AtomicU64::new(next_id),
        cmds: Mutex::new(Some(outbox)),
        metrics: Metrics::default(),
        workers,
        model,
        checker,
        cfg: cfg.clone(),
        accepting: std::sync::atomic::AtomicBool::new(true),
        store: store.map(Mutex::new),
    });
    let finisher = {
        let hub = hub.clone();
        std::thread::Builder::new()
            .name("flashdiff-finisher".into())
            .spawn(move || finish(done_rx, hub))
            .map_err(|e| format!("cannot start the results thread: {e}"))?
    };
    let stepper = {
        let hub = hub.clone();
        std::thread::Builder::new()
            .name("flashdiff-steps".into())
            .spawn(move || {
                for u in step_rx {
                    step_event(&hub, &u, grid);
                }
            })
            .map_err(|e| format!("cannot start the step-event thread: {e}"))?
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
    // Drain: the engine finishes what was admitted; the result and step threads end when
    // the last reply sender is gone with it.
    hub.accepting.store(false, Relaxed);
    if let Ok(mut outbox) = hub.cmds.lock() {
        *outbox = None;
    }
    drop(rt);
    service.shutdown();
    let _ = stepper.join();
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
    outbox: &Outbox,
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
            let _ = outbox.tx.send(Command::Resume {
                id: j.id,
                prompt: j.prompt.clone(),
                cfg,
                reply: outbox.reply.clone(),
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
