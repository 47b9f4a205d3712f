//! The server's side of the engine service: the finisher thread that encodes, stores and
//! journals results, and the step handler that keeps the job table's progress.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::Instant;

use flashdiff_runtime::engine::{EngineError, Output};
use flashdiff_runtime::image;
use flashdiff_runtime::service::{Finished, StepUpdate};
use serde_json::json;

use crate::http::{phase_code, Hub, Phase, Shared, STEP_BUCKETS};
use crate::journal::{Entry, Store};

/// The finisher's thread: encodes results, writes them and the journal, and updates the
/// job table, so that the engine's thread does no disk I/O and never waits for a handler's
/// lock. It ends when the last reply sender is gone.
pub(super) fn finish(rx: mpsc::Receiver<Finished>, hub: Shared) {
    for (id, r) in rx {
        match r {
            Ok(o) => finish_ok(&hub, o),
            Err(e) => {
                let phase = match e {
                    EngineError::Cancelled(_) => Phase::Cancelled,
                    _ => Phase::Failed,
                };
                finish_err(&hub, id, phase, e.to_string())
            }
        }
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

pub(super) fn step_event(hub: &Hub, ev: &StepUpdate, grid: [usize; 3]) {
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
