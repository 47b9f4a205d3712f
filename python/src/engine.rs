//! The engine from Python: load a built-in model (or a TinyDiT-family weights file), then
//! `generate` one request, or `submit` / `step` / `poll` / `result` / `cancel` for a serving
//! loop. Settings are the request schema's fields (`flashdiff_runtime::schema`), as JSON
//! lines and HTTP take them; a lone request that gives none gets `flashdiff generate`'s
//! defaults, so the same prompt and seed give the CLI's output bit for bit.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use flashdiff_runtime::engine::{
    lone_request_patches, report_json, Engine as REngine, Output, RequestConfig,
};
use flashdiff_runtime::media;
use flashdiff_runtime::models::pipelines::registry::{ModelSpec, BUILTIN_MODELS};
use flashdiff_runtime::models::Kind;
use flashdiff_runtime::schema::{Front, ImageRequest, RequestFields};
use flashdiff_runtime::service::{Mailbox, MailboxError, Standing};

use crate::fail;

/// A serving engine over one model. The model runs on the engine's own thread; calls from
/// several Python threads are safe, and none holds the GIL while it waits for the engine.
#[pyclass(module = "flashdiff._native", frozen)]
pub struct Engine {
    inner: Mailbox,
    next_id: AtomicU64,
    model: String,
    kind: Kind,
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Image => "image",
        Kind::Video => "video",
        Kind::Audio => "audio",
    }
}

impl Engine {
    /// The request a settings object (a JSON object of the schema's fields, `prompt`
    /// among them) describes, checked against the model.
    fn request(&self, json: &str) -> Result<(String, RequestConfig), String> {
        let f = RequestFields::from_json(json.as_bytes()).map_err(|e| e.to_string())?;
        let model = &**self.inner.service().model();
        let base = RequestConfig {
            patches: Some(lone_request_patches(model)),
            ..RequestConfig::default()
        };
        let (prompt, cfg) = f
            .resolve(Front::Python, model, &base, None)
            .map_err(|e| e.to_string())?;
        flashdiff_runtime::engine::check_request(model, &cfg).map_err(|e| e.to_string())?;
        Ok((prompt, cfg))
    }

    /// An HTTP body (`bytes` or `str`) checked as the HTTP server checks it with its
    /// default flags.
    fn image_request(
        &self,
        py: Python<'_>,
        body: &Bound<'_, PyAny>,
    ) -> PyResult<(ImageRequest, flashdiff_runtime::models::Conditioning)> {
        let bytes: Vec<u8> = if let Ok(b) = body.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else if let Ok(s) = body.extract::<String>() {
            s.into_bytes()
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "body: expected bytes or str (the HTTP request's body)",
            ));
        };
        let model = self.inner.service().model().clone();
        py.detach(|| ImageRequest::check(&bytes, &RequestConfig::default(), None, &*model))
            .map_err(fail)
    }

    fn output<'py>(
        &self,
        py: Python<'py>,
        o: &Output,
        scale: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let s = &o.sample;
        let bytes = match (self.kind, scale) {
            (Kind::Image, Some(z)) => {
                py.detach(|| flashdiff_runtime::image::png(&s.rgb, s.width, s.height, z))
            }
            _ => py.detach(|| media::encode(s, self.kind)).map_err(fail)?,
        };
        let d = PyDict::new(py);
        d.set_item("kind", kind_name(self.kind))?;
        let arr = match self.kind {
            Kind::Image => PyArray1::from_slice(py, &s.rgb)
                .reshape([s.height, s.width, 3])?
                .into_any(),
            Kind::Video => PyArray1::from_slice(py, &s.rgb)
                .reshape([s.frames, s.height, s.width, 3])?
                .into_any(),
            Kind::Audio => {
                let ch = s.audio_channels.max(1);
                PyArray1::from_slice(py, &s.audio)
                    .reshape([s.audio.len() / ch, ch])?
                    .into_any()
            }
        };
        d.set_item("sample", arr)?;
        d.set_item("sample_rate", s.sample_rate)?;
        d.set_item("report", report_json(o).to_string())?;
        d.set_item("file", PyBytes::new(py, &bytes))?;
        d.set_item("extension", media::extension(self.kind))?;
        Ok(d)
    }
}

fn standing_name(s: Standing) -> &'static str {
    match s {
        Standing::Pending => "pending",
        Standing::Done => "done",
        Standing::Failed => "failed",
        Standing::Unknown => "unknown",
    }
}

/// A float setting as the request gave it (an `f32` widened to JSON's `f64` would print
/// 0.1 as 0.10000000149011612).
fn short(v: f32) -> serde_json::Value {
    v.to_string()
        .parse::<f64>()
        .map_or(serde_json::Value::Null, serde_json::Value::from)
}

#[pymethods]
impl Engine {
    /// Loads `model`: a built-in model's name with its shipped weights (or the
    /// TinyDiT-family safetensors file `weights`), or a real pipeline (`flux-dev`,
    /// `sd3-medium`, ...: `flashdiff.PIPELINES`) from its diffusers folder `weights`, with
    /// `size` (height, width), `guidance` and `dtype` (`f32`, `bf16`) as the CLI's flags take
    /// them; on `workers` in-process workers, on `device` (`cpu`, or `cuda` in a build with
    /// the `cuda` feature).
    #[new]
    #[pyo3(signature = (model="tinydit", weights=None, workers=1, device="cpu", size=None, guidance=None, dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &str,
        weights: Option<PathBuf>,
        workers: u32,
        device: &str,
        size: Option<(usize, usize)>,
        guidance: Option<f32>,
        dtype: Option<&str>,
    ) -> PyResult<Self> {
        use flashdiff_runtime::models::pipelines;
        let table = pipelines::pipeline(model);
        if table.is_none() && (size.is_some() || guidance.is_some() || dtype.is_some()) {
            return Err(fail(format!(
                "model {model:?}: size, guidance and dtype are settings of a real pipeline ({})",
                pipelines::PIPELINES.join(", ")
            )));
        }
        let spec = match (&weights, ModelSpec::builtin(model), table) {
            (Some(w), Some(_), _) => ModelSpec {
                name: model.to_string(),
                ..ModelSpec::file(w)
            },
            (None, Some(s), _) => s,
            (Some(w), None, Some(p)) => ModelSpec::pipeline(
                model,
                w,
                pipelines::PipelineOptions {
                    size: size.unwrap_or(p.size),
                    guidance,
                    dtype: pipelines::parse_dtype(dtype.unwrap_or("f32"))
                        .map_err(|e| fail(format!("dtype: {e}")))?,
                    seconds: None,
                    frames: None,
                },
            ),
            (None, None, Some(_)) => {
                return Err(fail(format!(
                    "model {model:?}: a real pipeline needs weights= its diffusers folder"
                )))
            }
            (_, None, None) => {
                return Err(fail(format!(
                    "model {model:?}: neither a built-in model ({}) nor a pipeline ({}); inside \
                     your own diffusers pipeline use flashdiff.diffusers",
                    BUILTIN_MODELS.join(", "),
                    pipelines::PIPELINES.join(", ")
                )))
            }
        };
        let cuda = match device {
            "cpu" => false,
            "cuda" => true,
            d => return Err(fail(format!("device {d:?}: cpu or cuda"))),
        };
        let device = flashdiff_runtime::models::device(cuda)
            .map_err(|e| fail(format!("device {device:?}: {e}")))?;
        let inner = py
            .detach(|| {
                REngine::builder(&spec)
                    .workers(workers)
                    .device(&device)
                    .build()
            })
            .map_err(|e| match spec.is_pipeline() {
                true => fail(format!(
                    "model {model:?} from {}: {e}",
                    spec.weights.display()
                )),
                false => fail(e),
            })?;
        let kind = inner.model().kind();
        Ok(Self {
            inner: Mailbox::start(inner).map_err(fail)?,
            next_id: AtomicU64::new(1),
            model: model.to_string(),
            kind,
        })
    }

    /// The model's name.
    #[getter]
    fn model(&self) -> &str {
        &self.model
    }

    /// What the model makes: `image`, `video` or `audio`.
    #[getter]
    fn kind(&self) -> &'static str {
        kind_name(self.kind)
    }

    /// Workers.
    #[getter]
    fn workers(&self, py: Python<'_>) -> PyResult<u32> {
        let _ = py;
        Ok(self.inner.service().workers())
    }

    /// The settings a request would run with (a JSON object of the schema's fields), as a
    /// JSON object; raises on a bad field as `generate` would.
    fn settings(&self, py: Python<'_>, request: &str) -> PyResult<String> {
        let (_, c) = py.detach(|| self.request(request)).map_err(fail)?;
        Ok(serde_json::json!({
            "steps": c.steps,
            "warmup": c.warmup,
            "patches": c.patches,
            "epsilon": short(c.epsilon),
            "adaptive_epsilon": c.adaptive_epsilon,
            "max_skip": c.max_skip,
            "budget": c.budget.map(short),
            "seed": c.seed,
            "mode": c.mode.name(),
            "layout": match c.layout {
                flashdiff_runtime::engine::LayoutKind::Saliency => "saliency",
                flashdiff_runtime::engine::LayoutKind::Uniform => "uniform",
            },
            "reuse": c.reuse.name(),
            "monotasks": c.monotasks,
            "cache_threshold": short(c.cache_threshold),
            "priority": c.priority,
        })
        .to_string())
    }

    /// Runs one request start to end (other requests in flight advance too) and returns its
    /// output: `kind`, `sample` (array), `sample_rate`, `report` (JSON), `file` (the bytes
    /// `flashdiff generate` writes) and its `extension`.
    fn generate<'py>(&self, py: Python<'py>, request: &str) -> PyResult<Bound<'py, PyDict>> {
        let id = self.submit(py, request)?;
        loop {
            let standing = py.detach(|| self.inner.wait_for(id, Duration::from_millis(50)));
            if standing != Standing::Pending {
                break;
            }
            if let Err(e) = py.check_signals() {
                let _ = self.inner.cancel(id);
                let _ = self.inner.take(id);
                return Err(e);
            }
        }
        self.result(py, id, None)
    }

    /// Admits a request to OpenAI's image endpoint exactly as `flashdiff serve --port` with
    /// its default flags would: `body` is the HTTP body (OpenAI's image fields and the
    /// schema's settings), checked by the server's own rules, so a refusal raises
    /// [`Error`] with the text the server puts in its 400. Returns the ids of the `n`
    /// images (seeds `seed`, `seed + 1`, ...) and the PNG scale to pass to `result`.
    fn submit_image(&self, py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<(Vec<u64>, usize)> {
        let (g, cond) = self.image_request(py, body)?;
        let mut ids = Vec::with_capacity(g.n as usize);
        for i in 0..g.n {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            // The prompt was conditioned by the check: the engine takes it as it is.
            let submitted = py.detach(|| {
                self.inner
                    .submit_conditioned(id, &g.prompt, Some(cond.clone()), g.image(i))
            });
            if let Err(e) = submitted {
                for &done in &ids {
                    let _ = self.inner.cancel(done);
                    let _ = self.inner.take(done);
                }
                return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "the engine refused a checked request: {e}"
                )));
            }
            ids.push(id);
        }
        Ok((ids, g.scale))
    }

    /// Checks a body for OpenAI's image endpoint as `submit_image` does, without admitting
    /// it: returns the number of images and the PNG scale, or raises [`Error`] with the
    /// server's text.
    fn check_image(&self, py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<(u32, usize)> {
        let (g, _) = self.image_request(py, body)?;
        Ok((g.n, g.scale))
    }

    /// Waits up to `timeout_ms` (at most 10000) for request `id` to finish; returns where it
    /// stands then, as `poll` says it. The GIL is released while it waits.
    #[pyo3(signature = (id, timeout_ms=100))]
    fn wait(&self, py: Python<'_>, id: u64, timeout_ms: u32) -> PyResult<&'static str> {
        if timeout_ms > 10_000 {
            return Err(fail(format!(
                "timeout_ms {timeout_ms}: at most 10000 (call wait again)"
            )));
        }
        let s = py.detach(|| {
            self.inner
                .wait_for(id, Duration::from_millis(timeout_ms.into()))
        });
        Ok(standing_name(s))
    }

    /// Requests submitted whose results are not ready yet.
    #[getter]
    fn pending(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.pending())
    }

    /// Admits a request (a JSON object of the schema's fields); returns its id.
    fn submit(&self, py: Python<'_>, request: &str) -> PyResult<u64> {
        py.detach(|| {
            let (prompt, cfg) = self.request(request)?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            self.inner
                .submit(id, &prompt, cfg)
                .map_err(|e| e.to_string())?;
            Ok::<u64, String>(id)
        })
        .map_err(fail)
    }

    /// Waits until the engine completes a scheduling round, at most `timeout_ms`
    /// (0: the round, however long); returns the requests still in flight.
    #[pyo3(signature = (timeout_ms=5))]
    fn step(&self, py: Python<'_>, timeout_ms: u32) -> PyResult<usize> {
        if timeout_ms > 10_000 {
            return Err(fail(format!(
                "timeout_ms {timeout_ms}: at most 10000 (call step again)"
            )));
        }
        let wait = match timeout_ms {
            0 => Duration::from_secs(3600),
            t => Duration::from_millis(t.into()),
        };
        Ok(py.detach(|| self.inner.wait_round(wait)))
    }

    /// `pending`, `done`, `failed` (or cancelled) or `unknown` (never submitted, or its
    /// result already taken).
    fn poll(&self, py: Python<'_>, id: u64) -> PyResult<&'static str> {
        Ok(standing_name(py.detach(|| self.inner.standing(id))))
    }

    /// A finished request's output (as `generate` returns it), once: raises with the reason
    /// for a failed or cancelled one, and for one still pending or unknown. For an image,
    /// `scale` (1..=32) sets the PNG's scale, as the HTTP image API's `size` does.
    #[pyo3(signature = (id, scale=None))]
    fn result<'py>(
        &self,
        py: Python<'py>,
        id: u64,
        scale: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if let Some(z) = scale.filter(|z| !(1..=32).contains(z)) {
            return Err(fail(format!("scale {z}: must be in 1..=32")));
        }
        let o = match py.detach(|| self.inner.take(id)) {
            Ok(Ok(o)) => o,
            Ok(Err(why)) => return Err(fail(why)),
            Err(MailboxError::Pending(_)) => {
                return Err(fail(format!(
                    "request {id} is still pending: call step() until poll() says done"
                )))
            }
            Err(_) => {
                return Err(fail(format!(
                    "request {id}: unknown (never submitted, or its result was already taken)"
                )))
            }
        };
        self.output(py, &o, scale)
    }

    /// Cancels a request in flight; its result then raises "cancelled".
    fn cancel(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        py.detach(|| self.inner.cancel(id))
            .map_err(|e| fail(e.to_string()))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add("MODELS", BUILTIN_MODELS.to_vec())?;
    m.add(
        "PIPELINES",
        flashdiff_runtime::models::pipelines::PIPELINES.to_vec(),
    )?;
    // The engine's defaults, which `flashdiff.diffusers.enable` takes for its own.
    let d = PyDict::new(m.py());
    d.set_item(
        "epsilon",
        flashdiff_runtime::engine::ENGINE_DEFAULT_EPSILON as f64,
    )?;
    d.set_item("patches", flashdiff_runtime::engine::DEFAULT_PATCHES)?;
    d.set_item(
        "max_skip",
        flashdiff_runtime::engine::ENGINE_DEFAULT_MAX_SKIP,
    )?;
    d.set_item("warmup", flashdiff_runtime::engine::DEFAULT_WARMUP)?;
    d.set_item("steps", flashdiff_runtime::engine::DEFAULT_STEPS)?;
    m.add("DEFAULTS", d)?;
    Ok(())
}
