//! A generation request over HTTP: parsing every field against the model, and admission
//! (queue bound, draining, one job per image).

use super::*;

/// A parsed generation request: prompt, per-image settings, images wanted, PNG scale.
pub(super) struct GenRequest {
    pub(super) prompt: String,
    /// The prompt conditioned by the model, once: the engine takes it as it is.
    pub(super) cond: Option<Conditioning>,
    pub(super) cfg: RequestConfig,
    pub(super) n: u32,
    pub(super) scale: usize,
}

/// Parses and checks a generation request: every field, the settings together, and the
/// prompt against the model's vocabulary, so that what is admitted can run.
pub(super) fn parse(
    body: &[u8],
    cfg: &HttpConfig,
    model: &dyn Denoiser,
) -> Result<GenRequest, String> {
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
pub(super) struct Warmups {
    /// The operator's `--warmup`.
    pub(super) server: Option<u32>,
    /// The model's default.
    pub(super) model: u32,
}

/// `side`: `(width, height)` of the model's images; "size" asks for a whole multiple.
pub(super) fn parse_fields(
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
pub(super) fn admit(
    hub: &Hub,
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
