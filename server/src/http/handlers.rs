//! The endpoints: OpenAI's image generations, jobs (create, read, events, cancel), health,
//! metrics and the page.

use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use flashdiff_runtime::service::Command;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::http::request::{admit, parse, GenRequest};
use crate::http::{bad, error, now_s, poisoned, Phase, Shared, STEP_BUCKETS};

pub(super) async fn healthz(State(hub): State<Shared>) -> Response {
    Json(json!({"status": if hub.accepting.load(Relaxed) { "ok" } else { "draining" }, "model": hub.model, "workers": hub.workers})).into_response()
}

pub(super) async fn metrics(State(hub): State<Shared>) -> Response {
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

/// A request's body as axum read it; one over `--max-body` (or unreadable) gets the JSON
/// error every other refusal gets.
type Body = Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>;

/// Parses a request and conditions its prompt off the async threads (for a real model that
/// runs its text encoders).
pub(super) async fn parse_blocking(hub: &Shared, body: Body) -> Result<GenRequest, Response> {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "the request body is over the limit of {} bytes (--max-body)",
                    hub.cfg.body_limit
                ),
            ))
        }
        Err(e) => return Err(error(e.status(), "invalid_request_error", e.body_text())),
    };
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

pub(super) async fn generations(State(hub): State<Shared>, body: Body) -> Response {
    let g = match parse_blocking(&hub, body).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    let ids = match admit(&hub, &g).await {
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

pub(super) async fn create_job(State(hub): State<Shared>, body: Body) -> Response {
    let g = match parse_blocking(&hub, body).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    if g.n != 1 {
        return bad("\"n\": a job makes one image; submit one job per image");
    }
    match admit(&hub, &g).await {
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

pub(super) fn job_id(raw: &str) -> Result<u64, Box<Response>> {
    raw.parse::<u64>()
        .map_err(|_| Box::new(bad(format!("job id {raw:?} is not a non-negative integer"))))
}

pub(super) fn missing(id: u64) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no job {id} (never created, or forgotten long after it finished)"),
    )
}

/// The page at `/`: a prompt box, live progress and the patch map of every step (which
/// patches ran, which were skipped), then the image. Static; it talks to the job API.
pub(super) async fn page() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("../page.html"),
    )
        .into_response()
}

pub(super) async fn get_job(State(hub): State<Shared>, Path(raw): Path<String>) -> Response {
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

pub(super) async fn delete_job(State(hub): State<Shared>, Path(raw): Path<String>) -> Response {
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
    if let Ok(outbox) = hub.cmds.lock() {
        if let Some(ob) = outbox.as_ref() {
            let _ = ob.tx.send(Command::Cancel { id, done: None });
        }
    }
    (
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "state": "cancelling"})),
    )
        .into_response()
}

pub(super) async fn job_events(State(hub): State<Shared>, Path(raw): Path<String>) -> Response {
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
