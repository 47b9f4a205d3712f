//! `flashdiff serve`: JSON lines in and out, or the HTTP server; one engine per model.

use std::io::{BufRead, Write};

use flashdiff_runtime::engine::{Output, RequestConfig};
use flashdiff_runtime::media;
use flashdiff_runtime::models::families::tinydit::scene;
use flashdiff_runtime::models::Kind;
use flashdiff_runtime::schema::{Front, RequestFields};
use flashdiff_runtime::service::{Reply, Service};

use crate::args::{is_pipeline, RunArgs, ServeArgs, MODELS};
use crate::generate::{ms, with_model_warmup};
use crate::setup::{cores, make_engine};
use crate::{http, journal};

pub(crate) fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// CPU time of this process and its finished children, in seconds.
pub(crate) fn cpu_time() -> f64 {
    let mut total = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage writes one rusage into the zeroed struct we own; `who` is one of
        // the two constants it accepts.
        let u = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(who, &mut u);
            u
        };
        for t in [u.ru_utime, u.ru_stime] {
            total += t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        }
    }
    total
}

pub(crate) fn serve(o: ServeArgs) -> Result<(), String> {
    let base = o.knobs.request(
        o.sampling.steps,
        o.sampling.patches.and_then(|p| p.0),
        o.sampling.seed,
    );
    if let Some(port) = o.port {
        let mut engine = make_engine(&o.run, cores())?;
        let base = with_model_warmup(base, o.knobs.warmup, engine.model());
        let kind = engine.model().kind();
        if kind != Kind::Image {
            return Err(format!(
                "serve --port returns images (OpenAI's image API); --model {} makes a {}: \
                 serve it as JSON lines (without --port), which writes .{} files",
                o.run.model,
                if kind == Kind::Video {
                    "video"
                } else {
                    "sound"
                },
                media::extension(kind)
            ));
        }
        engine.validate(&base).map_err(|e| e.to_string())?;
        engine
            .set_queue_order(queue_order(&o.order))
            .and_then(|()| engine.set_start_window(o.start_window))
            .map_err(|e| e.to_string())?;
        return http::serve(
            engine,
            http::HttpConfig {
                addr: format!("{}:{port}", o.host),
                max_queue: o.max_queue as usize,
                body_limit: o.max_body as usize,
                base,
                warmup: o.knobs.warmup,
                checkpoint_every: std::time::Duration::from_millis(o.checkpoint_every_ms),
                state_dir: if o.ephemeral {
                    None
                } else {
                    Some(o.state_dir.clone().unwrap_or_else(journal::default_dir))
                },
            },
        );
    }
    serve_lines(o, base)
}

/// `serve` without `--port`: JSON lines in, a result line out as each request finishes.
pub(crate) fn serve_lines(o: ServeArgs, base: RequestConfig) -> Result<(), String> {
    if let Some(d) = &o.out_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let file = match o.input.as_deref() {
        None => None,
        Some(p) if p.as_os_str() == "-" => None,
        Some(p) => {
            Some(std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?)
        }
    };
    // The server's own model first; a line naming another built-in model starts an engine
    // for it on first use (each with its own workers).
    let mut engines = vec![ModelEngine::start(&o, None)?];
    // Lines are read on their own thread, so a request starts as soon as its line arrives
    // and results are written as they finish, while later lines are still being typed.
    let (tx, rx) = std::sync::mpsc::channel::<Result<String, String>>();
    std::thread::spawn(move || {
        let input: Box<dyn BufRead> = match file {
            Some(f) => Box::new(std::io::BufReader::new(f)),
            None => Box::new(std::io::BufReader::new(std::io::stdin())),
        };
        for line in input.lines() {
            let stop = line.is_err();
            if tx
                .send(line.map_err(|e| format!("reading requests: {e}")))
                .is_err()
                || stop
            {
                return;
            }
        }
    });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Prompt and model of every request in flight (ids are unique across models).
    let mut prompts: std::collections::HashMap<u64, (String, usize)> =
        std::collections::HashMap::new();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (wall0, cpu0) = (std::time::Instant::now(), cpu_time());
    let (mut n, mut served, mut open) = (0usize, 0u32, true);
    loop {
        // Admit every line that has arrived; wait for one only when nothing runs.
        loop {
            let msg = if prompts.is_empty() && open {
                rx.recv()
                    .map_err(|_| std::sync::mpsc::TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            let line = match msg {
                Ok(l) => l?,
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            };
            n += 1;
            if line.trim().is_empty() {
                continue;
            }
            let fallback_id = n as u64;
            let outcome = match parse_request(&line, fallback_id) {
                Ok((id, ..)) if prompts.contains_key(&id) => Some((
                    id,
                    format!("line {n}: request id {id} is already in flight"),
                )),
                Ok((id, f)) => match engine_for(&mut engines, &o, f.model.as_deref()) {
                    Ok(i) => {
                        let service = &engines[i].service;
                        let model = &**service.model();
                        match f.resolve(Front::Lines, model, &base, o.knobs.warmup) {
                            Ok((prompt, cfg)) => {
                                let reply = Reply::to(done_tx.clone());
                                match service.submit(id, &prompt, cfg, reply) {
                                    Ok(()) => {
                                        prompts.insert(id, (prompt, i));
                                        None
                                    }
                                    Err(e) => Some((id, e.to_string())),
                                }
                            }
                            Err(e) => Some((id, format!("line {n}: {e}"))),
                        }
                    }
                    Err(e) => Some((id, format!("line {n}: {e}"))),
                },
                Err(e) => Some((fallback_id, format!("line {n}: {e}"))),
            };
            if let Some((id, e)) = outcome {
                writeln!(
                    out,
                    "{{\"id\":{id},\"ok\":false,\"error\":{}}}",
                    json_str(&e)
                )
                .and_then(|_| out.flush())
                .map_err(|e| e.to_string())?;
            }
        }
        if prompts.is_empty() {
            if open {
                continue;
            }
            break;
        }
        let first = match done_rx.recv_timeout(std::time::Duration::from_millis(5)) {
            Ok(r) => r,
            Err(_) => continue,
        };
        for (id, r) in std::iter::once(first).chain(done_rx.try_iter()) {
            served += r.is_ok() as u32;
            let kind = prompts.get(&id).map_or(Kind::Image, |p| engines[p.1].kind);
            let line = result_line(
                r.map_err(|e| (id, e)),
                &mut prompts,
                o.out_dir.as_deref(),
                kind,
            )?;
            writeln!(out, "{line}")
                .and_then(|_| out.flush())
                .map_err(|e| e.to_string())?;
        }
    }
    let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu_time() - cpu0);
    eprintln!(
        "served {served} requests on {} worker(s) in {wall:.2} s wall, {cpu:.2} s CPU (CPU/wall {:.2}){}",
        engines[0].service.workers(),
        cpu / wall.max(1e-9),
        if engines.len() > 1 {
            format!("; {} models, each with its own workers", engines.len())
        } else {
            String::new()
        }
    );
    Ok(())
}

/// One model's engine in a JSON-lines server.
pub(crate) struct ModelEngine {
    /// The built-in model's name (`None`: the server's own, from --model or --weights).
    name: Option<String>,
    kind: Kind,
    service: Service,
}

impl ModelEngine {
    fn start(o: &ServeArgs, model: Option<&str>) -> Result<Self, String> {
        let run = RunArgs {
            model: model.unwrap_or(&o.run.model).to_string(),
            weights: if model.is_some() {
                None
            } else {
                o.run.weights.clone()
            },
            // A built-in model a request names has its own size and no guidance.
            size: if model.is_some() { None } else { o.run.size },
            seconds: if model.is_some() { None } else { o.run.seconds },
            frames: if model.is_some() { None } else { o.run.frames },
            guidance: if model.is_some() {
                None
            } else {
                o.run.guidance
            },
            dtype: if model.is_some() {
                None
            } else {
                o.run.dtype.clone()
            },
            ..o.run.clone()
        };
        let mut engine = make_engine(&run, cores())?;
        engine
            .set_queue_order(queue_order(&o.order))
            .and_then(|()| engine.set_start_window(o.start_window))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            name: model.map(str::to_string),
            kind: engine.model().kind(),
            service: Service::start(engine).map_err(|e| e.to_string())?,
        })
    }
}

/// The engine a request for `model` runs on (index into `engines`), started on first use.
/// A request naming no model, or the server's own --model (without --weights), runs on the
/// server's engine.
pub(crate) fn engine_for(
    engines: &mut Vec<ModelEngine>,
    o: &ServeArgs,
    model: Option<&str>,
) -> Result<usize, String> {
    let model = model
        .filter(|m| (o.run.weights.is_some() && !is_pipeline(&o.run.model)) || *m != o.run.model);
    if let Some(m) = model.filter(|m| is_pipeline(m)) {
        return Err(format!(
            "\"model\": {m} is not loaded by this server (start one with --model {m} --weights DIR)"
        ));
    }
    if let Some(i) = engines.iter().position(|e| e.name.as_deref() == model) {
        return Ok(i);
    }
    engines.push(ModelEngine::start(o, model)?);
    Ok(engines.len() - 1)
}

/// The JSON line of a finished request (its PNG, GIF or WAV written into `out_dir` when
/// given).
pub(crate) fn result_line(
    r: Result<Output, (u64, flashdiff_runtime::engine::EngineError)>,
    prompts: &mut std::collections::HashMap<u64, (String, usize)>,
    out_dir: Option<&std::path::Path>,
    kind: Kind,
) -> Result<String, String> {
    Ok(match r {
        Ok(o2) => {
            let rep = &o2.report;
            let prompt = prompts.remove(&rep.id).unwrap_or_default().0;
            let checker = match scene::parse(&prompt)
                .ok()
                .filter(|_| kind == Kind::Image)
                .and_then(|s| flashdiff_eval::image::check_sized(&o2.sample.rgb, &s))
            {
                Some(v) => {
                    format!(
                        "{{\"background\":{},\"present\":{},\"shape\":{},\"all\":{}}}",
                        v.background,
                        v.present,
                        v.shape,
                        v.all()
                    )
                }
                None => "null".into(),
            };
            let image = match out_dir {
                Some(d) => {
                    let p = d.join(format!("{}.{}", rep.id, media::extension(kind)));
                    std::fs::write(
                        &p,
                        media::encode(&o2.sample, kind).map_err(|e| e.to_string())?,
                    )
                    .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
                    json_str(&p.display().to_string())
                }
                None => "null".into(),
            };
            format!(
                "{{\"id\":{},\"ok\":true,\"image\":{image},\"latency_ms\":{:.1},\"patches\":{},\"patch_steps\":{},\"computed\":{},\"skipped_share\":{:.4},\"checker\":{checker}}}",
                rep.id,
                ms(rep.latency),
                rep.patches,
                rep.patch_steps,
                rep.computed,
                rep.skipped_share()
            )
        }
        Err((id, e)) => {
            prompts.remove(&id);
            format!(
                "{{\"id\":{id},\"ok\":false,\"error\":{}}}",
                json_str(&e.to_string())
            )
        }
    })
}

pub(crate) fn queue_order(s: &str) -> flashdiff_runtime::engine::QueueOrder {
    use flashdiff_runtime::engine::QueueOrder;
    if s == "deadline" {
        QueueOrder::Deadline
    } else {
        QueueOrder::Arrival
    }
}

/// A request line: id, prompt, settings, the built-in model it names (`None`: the
/// server's own) and the warm-up if the line gave one.
/// A JSON line's id (`fallback_id` when it gives none) and fields; the model it names is
/// one of the built-in models or the server's own.
pub(crate) fn parse_request(line: &str, fallback_id: u64) -> Result<(u64, RequestFields), String> {
    let f = RequestFields::from_json(line.as_bytes()).map_err(|e| e.to_string())?;
    if let Some(m) = f.model.as_deref().filter(|m| !MODELS.contains(m)) {
        return Err(format!(
            "\"model\" {m:?}: must be one of {}",
            MODELS.join(", ")
        ));
    }
    Ok((f.id.unwrap_or(fallback_id), f))
}
