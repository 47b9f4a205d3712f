//! Executing one monotask on a request's shared state: what a worker (a process, or the
//! coordinator itself in single-process mode) does. Inputs are read from the state, outputs
//! written to the regions the ownership protocol gives the task (see [`crate::state`]).

use flashdiff_models::{euler_full_step, Denoiser, Device, KvCache, Patches, StepInput, Tensor};

use crate::state::{Region, SharedState};

/// A monotask's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// The whole warm-up: `warmup` Euler steps of `steps`, from the initial noise.
    Warmup {
        /// Total steps of the request (sets the step size).
        steps: u32,
        /// Warm-up steps.
        warmup: u32,
    },
    /// One monotask of a step: the patches the coordinator packed into monotask `monotask`
    /// ([`Region::Monotask`]), computed in one forward so that they see each other's fresh
    /// K/V; reads start-of-step state, writes the fresh rows of its tokens.
    Patches {
        /// Monotask index within the step.
        monotask: u32,
        /// Attend only inside the patch (NaivePatch baseline; one patch per monotask).
        isolated: bool,
    },
}

fn model_err(e: flashdiff_models::ModelError) -> String {
    e.to_string()
}

fn tensor(data: &[f32], shape: &[usize], dev: &Device) -> Result<Tensor, String> {
    Tensor::from_slice(data, shape, dev).map_err(|e| e.to_string())
}

fn host(t: &Tensor) -> Result<Vec<f32>, String> {
    t.flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| e.to_string())
}

/// Runs `task` on `st`. Idempotent: running it again (after a lost worker) writes the same
/// values, because it reads only state that nothing changes until the step's barrier.
pub fn run(model: &dyn Denoiser, st: &mut SharedState, task: Task) -> Result<(), String> {
    let dims = model.dims().clone();
    let dev = model.device().clone();
    let (tokens, pd, d, layers) = (
        dims.grid.tokens(),
        dims.channels,
        dims.kv_dim,
        dims.kv_layers,
    );
    let context = tensor(st.get(Region::Context), &[dims.context_len], &dev)?;
    match task {
        Task::Warmup { steps, warmup } => warm_up(model, st, &context, steps, warmup),
        Task::Patches { monotask, isolated } => {
            let which = st.get(Region::Monotask);
            let toks: Vec<u32> = (0..tokens as u32)
                .filter(|&t| which[t as usize] == monotask as f32)
                .collect();
            if toks.is_empty() {
                return Err(format!(
                    "monotask {monotask} has no tokens at this request's step"
                ));
            }
            let patch_of = st.get(Region::PatchOf);
            let groups_of: Vec<u32> = patch_of.iter().map(|&p| p as u32).collect();
            let groups = groups_of.iter().copied().max().unwrap_or(0) as usize + 1;
            // Tokens of each patch in this monotask (0 for the patches it does not hold).
            let mut size = vec![0.0f32; groups];
            for &t in &toks {
                size[groups_of[t as usize] as usize] += 1.0;
            }
            let held = size.iter().filter(|&&n| n > 0.0).count();
            if isolated && held != 1 {
                return Err(format!(
                    "monotask {monotask} holds {held} patches; an isolated one holds one"
                ));
            }
            let xs = st.get(Region::X);
            let x: Vec<f32> = toks
                .iter()
                .flat_map(|&t| xs[t as usize * pd..(t as usize + 1) * pd].iter().copied())
                .collect();
            let x = tensor(&x, &[toks.len(), pd], &dev)?;
            let cond = tensor(st.get(Region::Cond), &[dims.cond_len], &dev)?;
            let step = StepInput {
                context: &context,
                cond: &cond,
            };
            let patches = Patches {
                of_token: &groups_of,
                patches: groups,
            };
            let out = if isolated {
                model.subset_forward(&x, &toks, step, None, patches)
            } else {
                let k = tensor(st.get(Region::CacheKeys), &[layers, tokens, d], &dev)?;
                let v = tensor(st.get(Region::CacheValues), &[layers, tokens, d], &dev)?;
                model.subset_forward(&x, &toks, step, Some(KvCache { k: &k, v: &v }), patches)
            }
            .map_err(model_err)?;
            let mass = host(&out.patch_mass)?;
            // R_i = (1/|A_i|^2) sum_{u in A_i} mass[u][i] (paper §4.2), for each patch i here.
            let mut importance = vec![0.0f32; groups];
            for (u, &t) in toks.iter().enumerate() {
                let p = groups_of[t as usize] as usize;
                importance[p] += mass[u * groups + p];
            }
            // Only this monotask's rows: other workers write theirs at the same time.
            let (fk, fv) = (host(&out.k)?, host(&out.v)?);
            let n = toks.len();
            for l in 0..layers {
                for (i, &t) in toks.iter().enumerate() {
                    let at = (l * tokens + t as usize) * d;
                    let row = (l * n + i) * d;
                    st.write_at(Region::FreshKeys, at, &fk[row..row + d]);
                    st.write_at(Region::FreshValues, at, &fv[row..row + d]);
                }
            }
            let vel = host(&out.velocity)?;
            for (i, &t) in toks.iter().enumerate() {
                st.write_at(
                    Region::FreshVelocity,
                    t as usize * pd,
                    &vel[i * pd..(i + 1) * pd],
                );
            }
            for (p, &n) in size.iter().enumerate().filter(|(_, &n)| n > 0.0) {
                st.write_at(Region::Importance, p, &[importance[p] / (n * n)]);
            }
            Ok(())
        }
    }
}

/// The warm-up: `warmup` full Euler steps from the initial noise, leaving the latent, the
/// last velocity and K/V, and the mean cross-attention in the state.
fn warm_up(
    model: &dyn Denoiser,
    st: &mut SharedState,
    context: &Tensor,
    steps: u32,
    warmup: u32,
) -> Result<(), String> {
    let dims = model.dims();
    let (tokens, words) = (dims.grid.tokens(), dims.words);
    if steps == 0 || warmup == 0 || warmup >= steps {
        return Err(format!(
            "warm-up of {warmup} steps out of {steps} is not valid"
        ));
    }
    let mut x = st.get(Region::X0).to_vec();
    let mut cross = vec![0.0f32; tokens * words];
    let mut last = None;
    for n in 0..warmup {
        let out = euler_full_step(model, &mut x, context, n, steps, true).map_err(model_err)?;
        if let Some(s) = &out.saliency {
            for (a, b) in cross.iter_mut().zip(host(s)?) {
                *a += b / warmup as f32;
            }
        }
        last = Some(out);
    }
    let out = last.expect("warm-up has at least one step");
    st.get_mut(Region::X).copy_from_slice(&x);
    st.get_mut(Region::Velocity)
        .copy_from_slice(&host(&out.velocity)?);
    st.get_mut(Region::Cross).copy_from_slice(&cross);
    st.get_mut(Region::CacheKeys)
        .copy_from_slice(&host(&out.k)?);
    st.get_mut(Region::CacheValues)
        .copy_from_slice(&host(&out.v)?);
    Ok(())
}
