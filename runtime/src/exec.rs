//! Executing one monotask on a request's shared state: what a worker (a process, or the
//! coordinator itself in single-process mode) does. Inputs are read from the state, outputs
//! written to the regions the ownership protocol gives the task (see [`crate::state`]).

use crate::model::{CacheView, StepCond, StepStats, TextContext, TinyDit};
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

fn text_of(st: &SharedState) -> TextContext {
    TextContext::from_parts(
        st.get(Region::Pooled),
        st.get(Region::TextK),
        st.get(Region::TextV),
    )
}

/// Runs `task` on `st`. Idempotent: running it again (after a lost worker) writes the same
/// values, because it reads only state that nothing changes until the step's barrier.
pub fn run(model: &TinyDit, st: &mut SharedState, task: Task) -> Result<(), String> {
    let cfg = model.config().clone();
    let (tokens, pd, d, mt) = (cfg.tokens(), cfg.patch_dim(), cfg.d, cfg.max_tokens);
    let text = text_of(st);
    match task {
        Task::Warmup { steps, warmup } => {
            if steps == 0 || warmup == 0 || warmup >= steps {
                return Err(format!(
                    "warm-up of {warmup} steps out of {steps} is not valid"
                ));
            }
            let mut x = st.get(Region::X0).to_vec();
            let mut v = vec![0.0f32; x.len()];
            let mut cross = vec![0.0f32; tokens * mt];
            let mut cache = crate::model::KvCache::new(cfg.depth, tokens, d);
            for n in 0..warmup {
                let mut c = vec![0.0f32; tokens * mt];
                let mut stats = StepStats {
                    cross: Some(&mut c),
                    patch_mass: None,
                };
                v = model.full_step(&mut x, &text, &mut cache, n, steps, &mut stats);
                for (a, b) in cross.iter_mut().zip(&c) {
                    *a += b / warmup as f32;
                }
            }
            st.get_mut(Region::X).copy_from_slice(&x);
            st.get_mut(Region::V).copy_from_slice(&v);
            st.get_mut(Region::Cross).copy_from_slice(&cross);
            st.get_mut(Region::CacheK).copy_from_slice(&cache.k);
            st.get_mut(Region::CacheV).copy_from_slice(&cache.v);
            Ok(())
        }
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
            let cond = StepCond::from_slice(st.get(Region::Cond));
            let mut mass = vec![0.0f32; toks.len() * groups];
            let mut stats = StepStats {
                cross: None,
                patch_mass: Some((&groups_of, groups, &mut mass)),
            };
            let out = if isolated {
                model.forward_isolated(&x, &toks, &cond, &text, &mut stats)
            } else {
                let cache = CacheView {
                    k: st.get(Region::CacheK),
                    v: st.get(Region::CacheV),
                };
                model.forward(&x, &toks, &cond, &text, cache, &mut stats)
            };
            // R_i = (1/|A_i|^2) sum_{u in A_i} mass[u][i] (paper §4.2), for each patch i here.
            let mut importance = vec![0.0f32; groups];
            for (u, &t) in toks.iter().enumerate() {
                let p = groups_of[t as usize] as usize;
                importance[p] += mass[u * groups + p];
            }
            // Only this monotask's rows: other workers write theirs at the same time.
            for l in 0..cfg.depth {
                for (i, &t) in toks.iter().enumerate() {
                    let at = (l * tokens + t as usize) * d;
                    st.write_at(Region::FreshK, at, &out.k[l][i * d..(i + 1) * d]);
                    st.write_at(Region::FreshV, at, &out.v[l][i * d..(i + 1) * d]);
                }
            }
            for (i, &t) in toks.iter().enumerate() {
                st.write_at(
                    Region::FreshVel,
                    t as usize * pd,
                    &out.velocity[i * pd..(i + 1) * pd],
                );
            }
            for (p, &n) in size.iter().enumerate().filter(|(_, &n)| n > 0.0) {
                st.write_at(Region::Importance, p, &[importance[p] / (n * n)]);
            }
            Ok(())
        }
    }
}
