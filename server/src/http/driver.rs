//! The engine's side: the driver thread that runs the engine between commands, and the
//! finisher thread that encodes, stores and journals results off it.

use super::*;

/// A job the engine is done with, for the finisher thread.
pub(super) enum Done {
    Ok(Box<Output>),
    Err(u64, Phase, String),
}

/// The finisher's thread: encodes results, writes them and the journal, and updates the
/// job table, so that the engine's thread does no disk I/O and never waits for a handler's
/// lock. It ends when the driver does.
pub(super) fn finish(rx: mpsc::Receiver<Done>, hub: Shared) {
    for d in rx {
        match d {
            Done::Ok(o) => finish_ok(&hub, *o),
            Done::Err(id, phase, msg) => finish_err(&hub, id, phase, msg),
        }
    }
}

/// The engine's thread: admits commands between scheduling rounds, runs monotasks, and
/// records steps and results in the job table.
pub(super) fn drive(
    mut engine: Engine,
    rx: mpsc::Receiver<Cmd>,
    hub: Shared,
    done: mpsc::Sender<Done>,
) {
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
pub(super) fn resume_job(
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
pub(super) fn journal(
    hub: &Hub,
    f: impl FnOnce(&mut Store) -> Result<(), String>,
) -> Result<(), String> {
    match &hub.store {
        None => Ok(()),
        Some(store) => f(&mut *store
            .lock()
            .map_err(|_| "the store is poisoned".to_string())?),
    }
}

pub(super) fn step_event(hub: &Hub, ev: &StepEvent, grid: [usize; 3]) {
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

pub(super) fn finish_ok(hub: &Hub, o: Output) {
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

pub(super) fn finish_err(hub: &Hub, id: u64, phase: Phase, msg: String) {
    let m = &hub.metrics;
    match phase {
        Phase::Cancelled => m.cancelled.fetch_add(1, Relaxed),
        _ => m.failed.fetch_add(1, Relaxed),
    };
    let known = hub.jobs.lock().is_ok_and(|j| j.contains_key(&id));
    if !known {
        return;
    }
    // Journaled without the job table's lock, and before anyone can read the end.
    if let Err(e) = journal(hub, |s| {
        s.append(&Entry::Finished {
            id,
            phase: phase_code(phase),
            error: msg.clone(),
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
    j.phase = phase;
    j.error = Some(msg.clone());
    j.last_event = None;
    if let Some(events) = j.events.take() {
        let _ = events.send(json!({"type": "done", "state": phase.name(), "error": msg}));
    }
    let _ = j.phase_tx.send(phase);
}
