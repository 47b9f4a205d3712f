//! The policies: salient words, the saliency map, partitions and their layouts, the gate and
//! the scheduler. Arrays come in as numpy arrays read in place (C-contiguous, of the dtype
//! named; the Python wrappers convert other inputs first) and go out as new numpy arrays.

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use flashdiff_gate::budget::{
    relative_change as r_relative_change, Budget as RBudget, BudgetConfig,
};
use flashdiff_gate::{Gate as RGate, GateConfig};
use flashdiff_partitioner::{
    partition_saliency as r_partition_saliency, partition_uniform as r_partition_uniform,
    saliency_map as r_saliency_map, salient_mask as r_salient_mask, split_words as r_split_words,
    Grid, PatchLayout,
};
use flashdiff_scheduler::{
    Completion, Event, Pick, Scheduler as RScheduler, SchedulerConfig, Tag, WARMUP_MONOTASK,
};

use crate::fail;

/// An array's elements in memory order, or an error naming it when it is not contiguous.
pub(crate) fn contiguous<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        fail(format!(
            "{what}: the array is not C-contiguous (pass numpy.ascontiguousarray({what}))"
        ))
    })
}

/// The prompt's words as the built-in pipelines split them.
#[pyfunction]
fn split_words(prompt: &str) -> Vec<String> {
    r_split_words(prompt)
        .into_iter()
        .map(String::from)
        .collect()
}

/// Which words are salient (content words: not function words).
#[pyfunction]
fn salient_mask<'py>(py: Python<'py>, words: Vec<String>) -> Bound<'py, PyArray1<bool>> {
    PyArray1::from_vec(py, r_salient_mask(&words))
}

/// The saliency map: `attn` is `(tokens, prompt_len)` float32 cross-attention, `salient` a
/// bool per prompt token.
#[pyfunction]
fn saliency_map<'py>(
    py: Python<'py>,
    attn: PyReadonlyArrayDyn<'py, f32>,
    salient: PyReadonlyArray1<'py, bool>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let shape = attn.shape().to_vec();
    if shape.len() != 2 {
        return Err(fail(format!(
            "attn: expected a 2-D array (tokens, prompt_len), got {} dimensions",
            shape.len()
        )));
    }
    let a = contiguous(&attn, "attn")?;
    let m = contiguous(&salient, "salient")?;
    let s = py.detach(|| r_saliency_map(a, shape[0], m)).map_err(fail)?;
    Ok(PyArray1::from_vec(py, s))
}

fn grid_of(shape: &[usize]) -> PyResult<Grid> {
    let dim =
        |v: usize| u32::try_from(v).map_err(|_| fail(format!("grid: {v} does not fit in 32 bits")));
    match *shape {
        [h, w] => Grid::new(1, dim(h)?, dim(w)?).map_err(fail),
        [f, h, w] => Grid::new(dim(f)?, dim(h)?, dim(w)?).map_err(fail),
        _ => Err(fail(format!(
            "grid: expected (height, width) or (frames, height, width), got {} dimensions",
            shape.len()
        ))),
    }
}

/// Saliency-driven partition of the latent into `patches` patches; the map's shape,
/// `(height, width)` or `(frames, height, width)`, is the latent grid.
#[pyfunction]
fn partition_saliency(
    py: Python<'_>,
    saliency: PyReadonlyArrayDyn<'_, f32>,
    patches: u32,
) -> PyResult<Layout> {
    let grid = grid_of(saliency.shape())?;
    let s = contiguous(&saliency, "saliency")?;
    let inner = py
        .detach(|| r_partition_saliency(grid, s, patches))
        .map_err(fail)?;
    Ok(Layout { inner })
}

/// Uniform partition of a `(height, width)` or `(frames, height, width)` grid.
#[pyfunction]
fn partition_uniform(grid: Vec<usize>, patches: u32) -> PyResult<Layout> {
    let inner = r_partition_uniform(grid_of(&grid)?, patches).map_err(fail)?;
    Ok(Layout { inner })
}

/// A partition of the latent's tokens into patches.
#[pyclass(module = "flashdiff._native", frozen)]
pub struct Layout {
    pub(crate) inner: PatchLayout,
}

#[pymethods]
impl Layout {
    /// Patch count.
    #[getter]
    fn patches(&self) -> u32 {
        self.inner.patches()
    }

    /// `(frames, height, width)` of the latent grid.
    #[getter]
    fn grid(&self) -> (u32, u32, u32) {
        let g = self.inner.grid();
        (g.frames(), g.height(), g.width())
    }

    /// The patch of every token (row-major over the grid).
    #[getter]
    fn patch_of<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_slice(py, self.inner.patch_of())
    }

    /// The tokens of patch `p`, ascending.
    fn patch_tokens<'py>(&self, py: Python<'py>, p: u32) -> PyResult<Bound<'py, PyArray1<u32>>> {
        if p >= self.inner.patches() {
            return Err(fail(format!(
                "patch {p} out of range: the layout has {} patches",
                self.inner.patches()
            )));
        }
        Ok(PyArray1::from_slice(py, self.inner.patch_tokens(p)))
    }

    /// Tokens per patch.
    fn sizes<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_vec(py, self.inner.sizes())
    }

    fn __repr__(&self) -> String {
        let (f, h, w) = self.grid();
        format!("Layout(patches={}, grid=({f}, {h}, {w}))", self.patches())
    }
}

/// The per-request gate: which patches run each step, from what the last steps observed.
#[pyclass(module = "flashdiff._native")]
pub struct Gate {
    inner: RGate,
}

#[pymethods]
impl Gate {
    /// A gate for `patches` patches; settings left out are the gate's defaults (the
    /// paper's ε 0.05).
    #[new]
    #[pyo3(signature = (patches, epsilon=None, eta=None, max_skip=None))]
    fn new(
        patches: usize,
        epsilon: Option<f32>,
        eta: Option<f32>,
        max_skip: Option<u32>,
    ) -> PyResult<Self> {
        let d = GateConfig::default();
        let cfg = GateConfig {
            epsilon: epsilon.unwrap_or(d.epsilon),
            eta: eta.unwrap_or(d.eta),
            max_skip: max_skip.unwrap_or(d.max_skip),
        };
        Ok(Self {
            inner: RGate::new(patches, cfg).map_err(fail)?,
        })
    }

    /// Patch count.
    #[getter]
    fn patches(&self) -> usize {
        self.inner.patches()
    }

    /// `(epsilon, eta, max_skip)`.
    #[getter]
    fn config(&self) -> (f32, f32, u32) {
        let c = self.inner.config();
        (c.epsilon, c.eta, c.max_skip)
    }

    /// Decisions made so far.
    #[getter]
    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    /// Changes ε from the next decision on.
    fn set_epsilon(&mut self, epsilon: f32) -> PyResult<()> {
        self.inner.set_epsilon(epsilon).map_err(fail)
    }

    /// The next step's decision: a bool per patch (runs or not) and counts: `active`,
    /// `forced` (by the skip bound), `no_history`, `kept_one`.
    fn decide<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyArray1<bool>>, Bound<'py, PyDict>)> {
        let mut active = vec![false; self.inner.patches()];
        let s = self.inner.decide(&mut active).map_err(fail)?;
        let d = PyDict::new(py);
        d.set_item("active", s.active)?;
        d.set_item("forced", s.forced)?;
        d.set_item("no_history", s.no_history)?;
        d.set_item("kept_one", s.kept_one)?;
        Ok((PyArray1::from_vec(py, active), d))
    }

    /// Feeds the step's per-patch importance (change of the patch's output); entries of
    /// patches that were skipped are ignored.
    fn observe(&mut self, importance: PyReadonlyArray1<'_, f32>) -> PyResult<()> {
        let v = contiguous(&importance, "importance")?;
        self.inner.observe_all(v).map_err(fail)
    }

    /// Feeds one patch's importance.
    fn observe_patch(&mut self, patch: usize, importance: f32) -> PyResult<()> {
        self.inner.observe(patch, importance).map_err(fail)
    }

    /// The gate's current weight of every patch.
    fn weights<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        PyArray1::from_slice(py, self.inner.weights())
    }
}

/// FlashDiff's change budget for one request: each patch accumulates its change since it
/// last ran; a step is computed once the latent's accumulated change (each step's changes
/// weighted by the patches' share of the signal) reaches ε, or one patch's reaches 2ε, or a
/// patch K skips.
#[pyclass(module = "flashdiff._native")]
pub struct Budget {
    inner: RBudget,
}

#[pymethods]
impl Budget {
    /// A budget for `patches` patches: ε (the engine's default 0.1), `share` (0: a computed
    /// step runs every patch; 1: only the patches at their budget) and K.
    #[new]
    #[pyo3(signature = (patches, epsilon=0.1, share=0.0, max_skip=3))]
    fn new(patches: usize, epsilon: f32, share: f32, max_skip: u32) -> PyResult<Self> {
        let cfg = BudgetConfig {
            epsilon,
            share,
            max_skip,
        };
        Ok(Self {
            inner: RBudget::new(patches, cfg).map_err(fail)?,
        })
    }

    /// Patch count.
    #[getter]
    fn patches(&self) -> usize {
        self.inner.patches()
    }

    /// `(epsilon, share, max_skip)`.
    #[getter]
    fn config(&self) -> (f32, f32, u32) {
        let c = self.inner.config();
        (c.epsilon, c.share, c.max_skip)
    }

    /// Changes ε from the next decision on.
    fn set_epsilon(&mut self, epsilon: f32) -> PyResult<()> {
        self.inner.set_epsilon(epsilon).map_err(fail)
    }

    /// Adds one step's change per patch (finite, >= 0), with each patch's share of the signal
    /// (`signal`: one finite value >= 0 per patch, e.g. `sum |before|` over its tokens; every
    /// patch weighs the same without it).
    #[pyo3(signature = (change, signal=None))]
    fn observe(
        &mut self,
        change: PyReadonlyArray1<'_, f32>,
        signal: Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<()> {
        let v = contiguous(&change, "change")?;
        match &signal {
            Some(w) => {
                let w = contiguous(w, "signal")?;
                self.inner.observe_weighted(v, w).map_err(fail)
            }
            None => self.inner.observe(v).map_err(fail),
        }
    }

    /// The level the next decision reads: the latent's accumulated change since the last
    /// computed step, or the largest patch's over 2; the step is computed at ε.
    fn level(&self) -> f32 {
        self.inner.level()
    }

    /// The step's decision: a bool per patch, all false when the step is forecast whole.
    /// Call `ran` with what actually ran.
    fn decide<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        let mut active = vec![false; self.inner.patches()];
        self.inner.decide(&mut active);
        PyArray1::from_vec(py, active)
    }

    /// Records which patches ran: their accumulated change restarts at 0.
    fn ran(&mut self, active: PyReadonlyArray1<'_, bool>) -> PyResult<()> {
        let v = contiguous(&active, "active")?;
        self.inner.ran(v).map_err(fail)
    }

    /// Each patch's accumulated change since it last ran (infinite before its first report).
    fn accumulated<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        PyArray1::from_slice(py, self.inner.accumulated())
    }
}

/// Each patch's relative L1 change between two snapshots of a per-token signal
/// (`tokens x width`, float32), grouped by `patch_of`.
#[pyfunction]
pub fn relative_change<'py>(
    py: Python<'py>,
    now: PyReadonlyArrayDyn<'_, f32>,
    before: PyReadonlyArrayDyn<'_, f32>,
    patch_of: PyReadonlyArray1<'_, u32>,
    patches: usize,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (n, b, p) = (
        contiguous(&now, "now")?,
        contiguous(&before, "before")?,
        contiguous(&patch_of, "patch_of")?,
    );
    if p.is_empty() || n.len() % p.len() != 0 {
        return Err(fail(format!(
            "now has {} values, not a whole number per token of patch_of ({} tokens)",
            n.len(),
            p.len()
        )));
    }
    let c = r_relative_change(n, b, n.len() / p.len(), p, patches).map_err(fail)?;
    Ok(PyArray1::from_vec(py, c))
}

/// The scheduler of patch-steps across workers (monotasks: a warm-up, or a step's patches).
#[pyclass(module = "flashdiff._native")]
pub struct Scheduler {
    inner: RScheduler,
}

fn tag_tuple(t: Tag) -> (u64, u32, Option<u32>) {
    let m = (t.monotask != WARMUP_MONOTASK).then_some(t.monotask);
    (t.request, t.step, m)
}

fn tag_of(t: (u64, u32, Option<u32>)) -> Tag {
    Tag {
        request: t.0,
        step: t.1,
        monotask: t.2.unwrap_or(WARMUP_MONOTASK),
    }
}

fn pick_str(p: Pick) -> String {
    match p {
        Pick::Own => "own".into(),
        Pick::Stolen { from } => format!("stolen from worker {from}"),
        Pick::KeptOwn {
            waiting_priority,
            benefit,
            cost,
        } => format!(
            "kept own (priority {waiting_priority} waiting elsewhere; benefit {benefit} <= cost {cost})"
        ),
    }
}

fn event_dict<'py>(py: Python<'py>, e: &Event) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let kind = |k: &str| d.set_item("event", k);
    match *e {
        Event::Admitted {
            request,
            priority,
            deadline,
        } => {
            kind("admitted")?;
            d.set_item("request", request)?;
            d.set_item("priority", priority)?;
            d.set_item("deadline", deadline)?;
        }
        Event::Ready {
            tag,
            priority,
            worker,
            cost,
        } => {
            kind("ready")?;
            d.set_item("tag", tag_tuple(tag))?;
            d.set_item("priority", priority)?;
            d.set_item("worker", worker)?;
            d.set_item("cost", cost)?;
        }
        Event::StepOpened {
            request,
            step,
            tasks,
        } => {
            kind("step_opened")?;
            d.set_item("request", request)?;
            d.set_item("step", step)?;
            d.set_item("tasks", tasks)?;
        }
        Event::Dispatched {
            worker,
            tag,
            priority,
            pick,
        } => {
            kind("dispatched")?;
            d.set_item("worker", worker)?;
            d.set_item("tag", tag_tuple(tag))?;
            d.set_item("priority", priority)?;
            d.set_item("pick", pick_str(pick))?;
        }
        Event::Completed { worker, tag } => {
            kind("completed")?;
            d.set_item("worker", worker)?;
            d.set_item("tag", tag_tuple(tag))?;
        }
        Event::Dropped { worker, tag } => {
            kind("dropped")?;
            d.set_item("worker", worker)?;
            d.set_item("tag", tag_tuple(tag))?;
        }
        Event::WorkerAdded(w) => {
            kind("worker_added")?;
            d.set_item("worker", w)?;
        }
        Event::Failed { worker, tag } => {
            kind("failed")?;
            d.set_item("worker", worker)?;
            d.set_item("tag", tag_tuple(tag))?;
        }
        Event::Requeued { tag } => {
            kind("requeued")?;
            d.set_item("tag", tag_tuple(tag))?;
        }
        Event::WorkerLost(w) => {
            kind("worker_lost")?;
            d.set_item("worker", w)?;
        }
        Event::RequestEnded { request, failed } => {
            kind("request_ended")?;
            d.set_item("request", request)?;
            d.set_item("failed", failed)?;
        }
    }
    Ok(d)
}

#[pymethods]
impl Scheduler {
    /// A scheduler; settings left out are the scheduler's defaults. With `record_events`
    /// it keeps a log of what it was given and what it decided ([`Scheduler::take_events`]).
    #[new]
    #[pyo3(signature = (workers=None, max_requests=None, max_queued=None, switch_cost=None,
                        transfer_cost=None, max_attempts=None, record_events=false))]
    fn new(
        workers: Option<u32>,
        max_requests: Option<usize>,
        max_queued: Option<usize>,
        switch_cost: Option<f64>,
        transfer_cost: Option<f64>,
        max_attempts: Option<u32>,
        record_events: bool,
    ) -> PyResult<Self> {
        let d = SchedulerConfig::default();
        let cfg = SchedulerConfig {
            workers: workers.unwrap_or(d.workers),
            max_requests: max_requests.unwrap_or(d.max_requests),
            max_queued: max_queued.unwrap_or(d.max_queued),
            switch_cost: switch_cost.unwrap_or(d.switch_cost),
            transfer_cost: transfer_cost.unwrap_or(d.transfer_cost),
            max_attempts: max_attempts.unwrap_or(d.max_attempts),
            record_events,
            // A Python caller completes what it dispatched before asking again.
            depth: 1,
            ..d
        };
        Ok(Self {
            inner: RScheduler::new(cfg).map_err(fail)?,
        })
    }

    /// Workers, the lost ones included.
    #[getter]
    fn workers(&self) -> u32 {
        self.inner.workers()
    }

    /// Admits a request and queues its warm-up (cost in the caller's unit).
    #[pyo3(signature = (request, priority=0, warmup_cost=1.0, deadline=None))]
    fn admit(
        &mut self,
        request: u64,
        priority: u8,
        warmup_cost: f64,
        deadline: Option<f64>,
    ) -> PyResult<()> {
        self.inner
            .submit_with_deadline(request, priority, warmup_cost, deadline)
            .map_err(fail)
    }

    /// Opens `step` of a request with its active patches as `(patch, cost)` pairs.
    fn submit_step(&mut self, request: u64, step: u32, patches: Vec<(u32, f64)>) -> PyResult<()> {
        self.inner
            .submit_step(request, step, &patches)
            .map_err(fail)
    }

    /// The next monotask for `worker`, or None: a dict with `tag` (request, step, monotask
    /// or None for a warm-up), `priority`, `cost`, `overhead`, `attempt` and `pick`.
    fn dispatch<'py>(
        &mut self,
        py: Python<'py>,
        worker: u32,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(a) = self.inner.next(worker).map_err(fail)? else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("tag", tag_tuple(a.task.tag))?;
        d.set_item("priority", a.task.priority)?;
        d.set_item("cost", a.task.cost)?;
        d.set_item("overhead", a.overhead)?;
        d.set_item("attempt", a.task.attempt)?;
        d.set_item("pick", pick_str(a.pick))?;
        Ok(Some(d))
    }

    /// Reports a dispatched monotask done. Returns what that did: `("patch",)`,
    /// `("warmup_done", request)`, `("step_done", request, step)`, `("stale",)` or
    /// `("request_failed", request)`.
    fn complete<'py>(
        &mut self,
        py: Python<'py>,
        worker: u32,
        tag: (u64, u32, Option<u32>),
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.complete(worker, tag_of(tag)).map_err(fail)?;
        completion(py, c)
    }

    /// Reports a dispatched monotask failed (it runs again, up to `max_attempts`).
    fn fail<'py>(
        &mut self,
        py: Python<'py>,
        worker: u32,
        tag: (u64, u32, Option<u32>),
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.fail(worker, tag_of(tag)).map_err(fail)?;
        completion(py, c)
    }

    /// Ends a request whose last step completed.
    fn finish(&mut self, request: u64) -> PyResult<()> {
        self.inner.finish(request).map_err(fail)
    }

    /// Cancels a request: its queued monotasks are dropped, running ones complete as stale.
    fn cancel(&mut self, request: u64) -> PyResult<()> {
        self.inner.cancel(request).map_err(fail)
    }

    /// Adds a worker; returns its id.
    fn add_worker(&mut self) -> PyResult<u32> {
        self.inner.add_worker().map_err(fail)
    }

    /// A worker is gone: its monotasks go to others. Returns `(requeued, failed_request)`.
    fn worker_lost(&mut self, worker: u32) -> PyResult<(usize, Option<u64>)> {
        let l = self.inner.worker_lost(worker).map_err(fail)?;
        Ok((l.requeued, l.failed))
    }

    /// `requests`, `queued`, `running`, `alive` workers and `backlog` (cost queued).
    fn load<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let l = self.inner.load();
        let d = PyDict::new(py);
        d.set_item("requests", l.requests)?;
        d.set_item("queued", l.queued)?;
        d.set_item("running", l.running)?;
        d.set_item("alive", l.alive)?;
        d.set_item("backlog", l.backlog())?;
        Ok(d)
    }

    /// The events recorded since the last call (empty without `record_events`), as dicts
    /// with an `event` key.
    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let evs = self.inner.take_events();
        let l = PyList::empty(py);
        for e in &evs {
            l.append(event_dict(py, e)?)?;
        }
        Ok(l)
    }
}

fn completion<'py>(py: Python<'py>, c: Completion) -> PyResult<Bound<'py, PyAny>> {
    let t = match c {
        Completion::Patch => ("patch",).into_pyobject(py)?.into_any(),
        Completion::WarmupDone(r) => ("warmup_done", r).into_pyobject(py)?.into_any(),
        Completion::StepDone(r, s) => ("step_done", r, s).into_pyobject(py)?.into_any(),
        Completion::Stale => ("stale",).into_pyobject(py)?.into_any(),
        Completion::RequestFailed(r) => ("request_failed", r).into_pyobject(py)?.into_any(),
    };
    Ok(t)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(split_words, m)?)?;
    m.add_function(wrap_pyfunction!(salient_mask, m)?)?;
    m.add_function(wrap_pyfunction!(saliency_map, m)?)?;
    m.add_function(wrap_pyfunction!(partition_saliency, m)?)?;
    m.add_function(wrap_pyfunction!(partition_uniform, m)?)?;
    m.add_class::<Layout>()?;
    m.add_class::<Gate>()?;
    m.add_class::<Budget>()?;
    m.add_function(wrap_pyfunction!(relative_change, m)?)?;
    m.add_class::<Scheduler>()?;
    Ok(())
}
