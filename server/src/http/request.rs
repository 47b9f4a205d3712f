//! A generation request over HTTP: parsing every field against the model, and admission
//! (queue bound, draining, one job per image).

use std::sync::atomic::Ordering::Relaxed;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use flashdiff_runtime::engine::{to_config_record, RequestConfig};
use flashdiff_runtime::models::{Conditioning, Denoiser};
use flashdiff_runtime::schema::ImageRequest;
use flashdiff_runtime::service::Command;
use tokio::sync::{broadcast, watch};

use crate::http::driver::journal;
use crate::http::{error, now_s, poisoned, HttpConfig, Hub, Job, Phase, Shared};
use crate::journal::Entry;

/// A parsed generation request: prompt, per-image settings, images wanted, PNG scale.
pub(super) struct GenRequest {
    pub(super) prompt: String,
    /// The prompt conditioned by the model, once: the engine takes it as it is.
    pub(super) cond: Option<Conditioning>,
    pub(super) cfg: RequestConfig,
    pub(super) n: u32,
    pub(super) scale: usize,
}

impl From<ImageRequest> for GenRequest {
    fn from(g: ImageRequest) -> Self {
        Self {
            prompt: g.prompt,
            cond: None,
            cfg: g.cfg,
            n: g.n,
            scale: g.scale,
        }
    }
}

/// Parses and checks a generation request ([`ImageRequest::check`]): every field, the
/// settings together, and the prompt against the model's vocabulary, so that what is
/// admitted can run.
pub(super) fn parse(
    body: &[u8],
    cfg: &HttpConfig,
    model: &dyn Denoiser,
) -> Result<GenRequest, String> {
    let (g, cond) = ImageRequest::check(body, &cfg.base, cfg.warmup, model)?;
    Ok(GenRequest {
        cond: Some(cond),
        ..g.into()
    })
}

/// Admits `g` as `g.n` jobs (seeds `seed`, `seed + 1`, ...); 429 past the queue bound, 503
/// while draining.
///
/// The jobs enter the table (and count against the queue bound) at once; their journal
/// records are written and synced on a blocking thread, holding no lock a handler needs,
/// and only then does the engine get them, so a job the engine runs is always one a restart
/// finds. A job cancelled while its record was being written is cancelled in the engine
/// right after it is submitted.
pub(super) async fn admit(
    hub: &Shared,
    g: &GenRequest,
) -> Result<Vec<(u64, watch::Receiver<Phase>)>, Box<Response>> {
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
    let (admitted, forgotten) = reserve(hub, g)?;
    let records: Vec<Entry> = admitted
        .iter()
        .map(|(id, cfg, _)| Entry::Submitted {
            id: *id,
            prompt: g.prompt.clone(),
            cfg: to_config_record(cfg),
            scale: g.scale as u32,
            created: now_s(),
        })
        .collect();
    let writer = hub.clone();
    let written = tokio::task::spawn_blocking(move || {
        journal(&writer, |s| {
            for id in forgotten {
                s.remove_result(id);
            }
            s.append_all(&records)
        })
    })
    .await
    .unwrap_or_else(|e| Err(format!("the journal writer failed: {e}")));
    let ids: Vec<u64> = admitted.iter().map(|a| a.0).collect();
    if let Err(e) = written {
        drop_jobs(hub, &ids);
        return Err(Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot record the job: {e}"),
        )));
    }
    // The command queue's lock is held from reading each job's cancel flag until its
    // commands are sent, so a DELETE that set the flag after the read sends its cancel
    // after the submit.
    let Ok(outbox) = hub.cmds.lock() else {
        drop_jobs(hub, &ids);
        return Err(Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "queue poisoned",
        )));
    };
    let stopped = || {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the engine has stopped",
        ))
    };
    let Some(ob) = outbox.as_ref() else {
        drop(outbox);
        drop_jobs(hub, &ids);
        return Err(stopped());
    };
    let mut out = Vec::new();
    for (id, cfg, phase_rx) in admitted {
        let cancelled = hub
            .jobs
            .lock()
            .map(|jobs| jobs.get(&id).is_some_and(|j| j.cancelling))
            .unwrap_or(false);
        let submit = Command::Submit {
            id,
            prompt: g.prompt.clone(),
            cond: Some(cond.clone()),
            cfg,
            reply: ob.reply.clone(),
            accepted: None,
        };
        if ob.tx.send(submit).is_err() {
            drop(outbox);
            drop_jobs(hub, &ids);
            return Err(stopped());
        }
        if cancelled {
            let _ = ob.tx.send(Command::Cancel { id, done: None });
        }
        hub.metrics.admitted.fetch_add(1, Relaxed);
        out.push((id, phase_rx));
    }
    Ok(out)
}

/// A job's number, settings and phase receiver, reserved in the table.
type Reserved = (u64, RequestConfig, watch::Receiver<Phase>);

/// Checks the queue bound and puts `g`'s jobs in the table as queued, forgetting the oldest
/// finished jobs beyond four times the bound; returns the jobs and the forgotten ids (whose
/// result files the caller removes). Holds the table's lock only for this.
fn reserve(hub: &Hub, g: &GenRequest) -> Result<(Vec<Reserved>, Vec<u64>), Box<Response>> {
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
    let keep = 4 * hub.cfg.max_queue.max(1);
    let mut forgotten = Vec::new();
    if jobs.len() >= keep {
        let mut done: Vec<(u64, u64)> = jobs
            .iter()
            .filter(|(_, j)| j.phase.done())
            .map(|(&id, j)| (j.created, id))
            .collect();
        done.sort_unstable();
        for (_, id) in done.iter().take(jobs.len() + g.n as usize - keep) {
            jobs.remove(id);
            forgotten.push(*id);
        }
    }
    let mut admitted = Vec::new();
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
        admitted.push((id, cfg, phase_rx));
    }
    Ok((admitted, forgotten))
}

/// Takes jobs that could not be admitted out of the table again.
fn drop_jobs(hub: &Hub, ids: &[u64]) {
    if let Ok(mut jobs) = hub.jobs.lock() {
        for id in ids {
            jobs.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Metrics;
    use crate::http::Outbox;
    use crate::journal::Store;

    use flashdiff_runtime::models::pipelines::registry::ModelSpec;
    use flashdiff_runtime::service::Reply;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::time::Duration;
    use std::time::Instant;

    fn hub(state: &std::path::Path) -> (Shared, mpsc::Receiver<Command>) {
        let model: Arc<dyn Denoiser> = ModelSpec::builtin("tinydit")
            .expect("the built-in model")
            .load(&flashdiff_runtime::models::Device::Cpu)
            .expect("its weights")
            .into();
        let (store, _) = Store::open(state).expect("a state directory");
        let (tx, rx) = mpsc::channel();
        let cfg = HttpConfig {
            addr: "127.0.0.1:0".into(),
            max_queue: 8,
            body_limit: 1 << 16,
            base: RequestConfig::default(),
            warmup: None,
            state_dir: Some(state.into()),
            checkpoint_every: Duration::ZERO,
        };
        let hub = Arc::new(Hub {
            jobs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            cmds: Mutex::new(Some(Outbox {
                tx,
                reply: Reply::to(mpsc::channel().0),
            })),
            metrics: Metrics::default(),
            workers: 1,
            model: model.name().into(),
            checker: model,
            cfg,
            accepting: std::sync::atomic::AtomicBool::new(true),
            store: Some(Mutex::new(store)),
        });
        (hub, rx)
    }

    /// While a job's journal record waits on the disk, the job table stays free (a GET reads
    /// "queued", a DELETE marks it), the engine has not been given the job, and once the
    /// record is written the engine gets the submit and then the cancel.
    #[test]
    fn admission_writes_the_journal_without_the_table_lock() {
        let dir = std::env::temp_dir().join(format!("fd-admit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (hub, rx) = hub(&dir);
        let g = parse(
            br#"{"prompt": "a red circle", "steps": 12}"#,
            &hub.cfg,
            &*hub.checker,
        )
        .expect("a valid request");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        // A slow disk: the journal is held until the test lets it go.
        let slow = hub.store.as_ref().expect("a store").lock().expect("store");
        let admitting = {
            let hub = hub.clone();
            rt.spawn(async move { admit(&hub, &g).await.map(|v| v[0].0).ok() })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let id = loop {
            // try_lock: a table held across the journal write fails here.
            let queued = hub
                .jobs
                .try_lock()
                .ok()
                .and_then(|jobs| jobs.keys().next().copied());
            if let Some(id) = queued {
                break id;
            }
            assert!(Instant::now() < deadline, "the job never entered the table");
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(Duration::from_millis(50));
        let mut jobs = hub.jobs.try_lock().expect("the table is free meanwhile");
        let job = jobs.get_mut(&id).expect("the job");
        assert_eq!(job.phase, Phase::Queued);
        job.cancelling = true;
        drop(jobs);
        assert!(
            rx.try_recv().is_err(),
            "the engine got the job before its record was written"
        );
        drop(slow);
        let admitted = rt.block_on(admitting).expect("admission");
        assert_eq!(admitted, Some(id));
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Command::Submit { id: s, .. }) => assert_eq!(s, id),
            _ => panic!("expected the submit first"),
        }
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Command::Cancel { id: c, .. }) => assert_eq!(c, id),
            _ => panic!("expected the cancel of a job cancelled while it was recorded"),
        }
        let bytes = std::fs::read(dir.join("journal")).expect("the journal");
        let (entries, _) = crate::journal::replay_bytes(&bytes);
        assert!(
            entries
                .iter()
                .any(|e| matches!(e, Entry::Submitted { id: s, .. } if *s == id)),
            "the job is journaled"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
