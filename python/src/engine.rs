//! The engine from Python: load a built-in model (or a TinyDiT-family weights file), then
//! `generate` one request, or `submit` / `step` / `poll` / `result` / `cancel` for a serving
//! loop. Settings are the request schema's fields (`flashdiff_runtime::schema`), as JSON
//! lines and HTTP take them; a lone request that gives none gets `flashdiff generate`'s
//! defaults, so the same prompt and seed give the CLI's output bit for bit.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use flashdiff_runtime::engine::{
    fit_warmup, lone_request_patches, report_json, Engine as REngine, Output, RequestConfig,
};
use flashdiff_runtime::media;
use flashdiff_runtime::models::registry::{ModelSpec, BUILTIN_MODELS};
use flashdiff_runtime::models::Kind;
use flashdiff_runtime::schema::{RequestFields, IMAGE_FIELDS};

use crate::fail;

struct State {
    inner: REngine,
    results: HashMap<u64, Result<Output, String>>,
    next_id: u64,
}

impl State {
    fn collect(&mut self) {
        self.inner.collect_finished(&mut self.results);
    }
}

/// A serving engine over one model. Calls from several Python threads are safe: they take
/// turns, and none holds the GIL while the model runs.
#[pyclass(module = "flashdiff._native", frozen)]
pub struct Engine {
    state: Mutex<State>,
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
    /// Runs `f` on the engine's state with the GIL released: a thread waiting for the lock
    /// never holds the GIL that the thread holding it needs to return.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut State) -> Result<T, String> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut st = self.state.lock().map_err(|_| {
                "the engine is unusable: an earlier call on it panicked".to_string()
            })?;
            f(&mut st)
        })
        .map_err(fail)
    }

    /// The request a settings object (a JSON object of the schema's fields, `prompt`
    /// among them) describes, checked against the model.
    fn request(&self, st: &State, json: &str) -> Result<(String, RequestConfig), String> {
        let f = RequestFields::from_json(json.as_bytes()).map_err(|e| e.to_string())?;
        for field in f.given() {
            if field == "id" || IMAGE_FIELDS.contains(&field) {
                return Err(format!(
                    "\"{field}\": not a setting of a request from Python (the engine numbers \
                     requests itself; n, size and the output format are the HTTP image API's)"
                ));
            }
        }
        if let Some(m) = &f.model {
            if *m != self.model {
                return Err(format!(
                    "\"model\": {m:?}: this engine serves {:?} (make another Engine for another model)",
                    self.model
                ));
            }
        }
        let prompt = f.prompt.clone().ok_or("\"prompt\": missing")?;
        let model = st.inner.model();
        let base = RequestConfig {
            patches: Some(lone_request_patches(model)),
            ..RequestConfig::default()
        };
        let mut cfg = f.settings(&base).map_err(|e| e.to_string())?;
        if f.warmup.is_none() {
            cfg.warmup = fit_warmup(model.default_warmup(), cfg.steps);
        }
        st.inner.validate(&cfg).map_err(|e| e.to_string())?;
        Ok((prompt, cfg))
    }

    fn output<'py>(&self, py: Python<'py>, o: &Output) -> PyResult<Bound<'py, PyDict>> {
        let s = &o.sample;
        let bytes = py.detach(|| media::encode(s, self.kind)).map_err(fail)?;
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

/// A float setting as the request gave it (an `f32` widened to JSON's `f64` would print
/// 0.1 as 0.10000000149011612).
fn short(v: f32) -> serde_json::Value {
    v.to_string()
        .parse::<f64>()
        .map_or(serde_json::Value::Null, serde_json::Value::from)
}

#[pymethods]
impl Engine {
    /// Loads `model` (a built-in model's name) with its shipped weights, or with the
    /// TinyDiT-family safetensors file `weights`, on `workers` in-process workers.
    #[new]
    #[pyo3(signature = (model="tinydit", weights=None, workers=1))]
    fn new(py: Python<'_>, model: &str, weights: Option<PathBuf>, workers: u32) -> PyResult<Self> {
        let spec = match (&weights, ModelSpec::builtin(model)) {
            (Some(w), Some(_)) => ModelSpec {
                name: model.to_string(),
                ..ModelSpec::file(w)
            },
            (None, Some(s)) => s,
            (_, None) => {
                return Err(fail(format!(
                    "model {model:?}: not a built-in model ({}); the real pipelines run from \
                     the CLI or the HTTP server, or inside diffusers through flashdiff.diffusers",
                    BUILTIN_MODELS.join(", ")
                )))
            }
        };
        let device = flashdiff_runtime::models::device(false).map_err(fail)?;
        let inner = py
            .detach(|| REngine::load(&spec, workers, &device))
            .map_err(fail)?;
        let kind = inner.model().kind();
        Ok(Self {
            state: Mutex::new(State {
                inner,
                results: HashMap::new(),
                next_id: 1,
            }),
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
        self.with(py, |st| Ok(st.inner.workers()))
    }

    /// The settings a request would run with (a JSON object of the schema's fields), as a
    /// JSON object; raises on a bad field as `generate` would.
    fn settings(&self, py: Python<'_>, request: &str) -> PyResult<String> {
        let (_, c) = self.with(py, |st| self.request(st, request))?;
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
            let done = self.with(py, |st| {
                if st.inner.in_flight() > 0 {
                    st.inner.poll(&mut |_| {}, Duration::from_millis(50));
                }
                st.collect();
                match st.results.remove(&id) {
                    Some(r) => Ok(Some(r)),
                    None if st.inner.is_in_flight(id) => Ok(None),
                    None => Err(format!("request {id} vanished")),
                }
            })?;
            match done {
                Some(Ok(o)) => return self.output(py, &o),
                Some(Err(e)) => return Err(fail(e)),
                None => py.check_signals()?,
            }
        }
    }

    /// Admits a request (a JSON object of the schema's fields); returns its id.
    fn submit(&self, py: Python<'_>, request: &str) -> PyResult<u64> {
        self.with(py, |st| {
            let (prompt, cfg) = self.request(st, request)?;
            let id = st.next_id;
            st.inner
                .submit(id, &prompt, cfg)
                .map_err(|e| e.to_string())?;
            st.next_id += 1;
            Ok(id)
        })
    }

    /// Advances the engine by one scheduling round, waiting at most `timeout_ms` for a
    /// worker; returns the requests still in flight.
    #[pyo3(signature = (timeout_ms=5))]
    fn step(&self, py: Python<'_>, timeout_ms: u32) -> PyResult<usize> {
        if timeout_ms > 10_000 {
            return Err(fail(format!(
                "timeout_ms {timeout_ms}: at most 10000 (call step again)"
            )));
        }
        self.with(py, |st| {
            if st.inner.in_flight() > 0 {
                st.inner
                    .poll(&mut |_| {}, Duration::from_millis(timeout_ms as u64));
            }
            st.collect();
            Ok(st.inner.in_flight())
        })
    }

    /// `pending`, `done`, `failed` (or cancelled) or `unknown` (never submitted, or its
    /// result already taken).
    fn poll(&self, py: Python<'_>, id: u64) -> PyResult<&'static str> {
        self.with(py, |st| {
            Ok(match st.results.get(&id) {
                Some(Ok(_)) => "done",
                Some(Err(_)) => "failed",
                None if st.inner.is_in_flight(id) => "pending",
                None => "unknown",
            })
        })
    }

    /// A finished request's output (as `generate` returns it), once: raises with the reason
    /// for a failed or cancelled one, and for one still pending or unknown.
    fn result<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyDict>> {
        let o = self.with(py, |st| match st.results.remove(&id) {
            Some(r) => r,
            None if st.inner.is_in_flight(id) => Err(format!(
                "request {id} is still pending: call step() until poll() says done"
            )),
            None => Err(format!(
                "request {id}: unknown (never submitted, or its result was already taken)"
            )),
        })?;
        self.output(py, &o)
    }

    /// Cancels a request in flight; its result then raises "cancelled".
    fn cancel(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        self.with(py, |st| {
            st.inner.cancel(id).map_err(|e| e.to_string())?;
            st.collect();
            Ok(())
        })
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add("MODELS", BUILTIN_MODELS.to_vec())?;
    Ok(())
}
