//! FlashDiff: saliency patches under a change budget (`flashdiff_gate::budget`). Every step
//! each patch adds the relative L1 change of block 0's modulated input over its tokens; a
//! step is computed once the latent's accumulated change (the patches' changes weighted by
//! their share of that input) reaches `epsilon`, or one patch alone twice that, or a patch
//! reached K skips, and is otherwise forecast for every token from the computed steps.
//! `share` says which patches a computed step runs: 0 (FlashDiff) every patch, 1 (the
//! per-patch ablation) only those at the budget, the others standing in with forecast K/V
//! and velocity; with `auto` the request sets it itself from the first step change it
//! observes (`flashdiff_gate::choice`). `pick` says which patches of a regional step run:
//! those at their budget, or (the ablation of that choice, `random-patches`) as many drawn
//! at random. A request with a work
//! budget F computes the most steps its FLOPs allow (`budget_steps`): which ones the work target
//! (`flashdiff_gate::pace`) decides from the same accumulated change.

use std::time::Instant;

use flashdiff_gate::budget::{level, step_change, Budget, BudgetConfig};
use flashdiff_gate::choice::{choose, dispersion, Execution};
use flashdiff_gate::pace::Pace;
use flashdiff_models::Denoiser;

use super::{
    adaptive_epsilon, block0_input, budget_steps, counts, floats, forecast_whole_step, memory_of,
    no_work_budget, random_patches, saliency_patches, Memory, Method, Recall,
};
use crate::checkpoint::MemoryRecord;
use crate::engine::request::Request;
use crate::engine::{Choice, EngineError, RequestConfig, FINAL_FULL_STEPS};

pub(super) struct FlashDiff {
    /// The budget's share (see the module docs).
    pub(super) share: f32,
    /// Whether the request chooses the share itself ([`crate::engine::Mode::Auto`]).
    pub(super) auto: bool,
    /// Which patches a regional step runs.
    pub(super) pick: Pick,
}

/// Which patches a regional step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick {
    /// Those at their budget.
    AtBudget,
    /// As many as are at their budget, drawn at random (seeded by the request's seed and the
    /// step): the ablation of the per-patch choice.
    AtRandom,
}

/// What the change budget remembers: block 0's modulated input at the previous step, and
/// the budget (from the first step after the partition).
#[derive(Default)]
struct Remembered {
    before: Option<Vec<f32>>,
    budget: Option<Budget>,
}

impl Memory for Remembered {
    fn save(&self, out: &mut Vec<MemoryRecord>) {
        if let Some(b) = &self.before {
            out.push(floats("block0.input", b));
        }
        if let Some(b) = &self.budget {
            let st = b.state();
            out.push(floats(
                "budget.settings",
                &[st.cfg.epsilon, st.cfg.share, st.whole],
            ));
            out.push(counts("budget.max_skip", &[st.cfg.max_skip]));
            out.push(floats("budget.accumulated", &st.accumulated));
            out.push(counts("budget.skipped_run", &st.skipped_run));
        }
    }
}

impl FlashDiff {
    /// Feeds the budget this step's change and decides into `r.active`; `true` when the step
    /// is computed. The budget learns which patches ran in [`Method::choose`] (the caller
    /// may run another choice of the same size) or here when nothing runs.
    pub(super) fn decide(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        load: f32,
    ) -> Result<bool, EngineError> {
        let t0 = Instant::now();
        let now = block0_input(model, r)?;
        let layout = r.layout.as_ref().expect("partitioned");
        let patches = layout.patches() as usize;
        let tokens = layout.patch_of().len();
        let memory = memory_of::<Remembered>(&mut r.memory)?;
        let budget = match &mut memory.budget {
            Some(b) => b,
            slot => slot.insert(Budget::new(
                patches,
                BudgetConfig {
                    epsilon: r.cfg.epsilon,
                    share: self.share,
                    max_skip: r.cfg.max_skip,
                },
            )?),
        };
        let mut rate = 0.0f32;
        if let Some(before) = &memory.before {
            let step = step_change(
                &now,
                before,
                now.len() / tokens.max(1),
                layout.patch_of(),
                patches,
            )?;
            budget.observe_weighted(&step.change, &step.signal)?;
            rate = level(&step.change, &step.signal);
            if self.auto && r.report.choice.is_none() {
                let dispersion = dispersion(&step.change, &step.signal)?;
                let execution = choose(dispersion, r.cfg.auto_dispersion);
                if execution == Execution::Regional {
                    let mut st = budget.state().clone();
                    st.cfg.share = 1.0;
                    *budget = Budget::from_state(st)?;
                }
                r.report.choice = Some(Choice {
                    execution,
                    dispersion,
                    threshold: r.cfg.auto_dispersion,
                });
            }
        }
        if r.cfg.adaptive_epsilon {
            let e = adaptive_epsilon(r.cfg.epsilon).epsilon(load);
            budget.set_epsilon(e)?;
            r.report.epsilon_sum += e as f64;
            r.report.epsilon_steps += 1;
        }
        let computed = if r.step + FINAL_FULL_STEPS >= r.cfg.steps {
            r.active.fill(true);
            true
        } else if let Some(fraction) = r.cfg.budget {
            let allowed = budget_steps(model, &r.cfg, fraction);
            let computed = pace(&r.cfg, allowed, r.step, &r.report.active_per_step)?
                .decide(budget.level(), rate);
            r.active.fill(computed);
            // Regionally, a computed step runs the patches at their budget (every patch
            // where none is).
            if computed && budget.config().share > 0.0 {
                let mut due = vec![false; patches];
                if budget.decide(&mut due) && due.iter().any(|&d| d) {
                    r.active.copy_from_slice(&due);
                }
            }
            computed
        } else {
            budget.decide(&mut r.active)
        };
        if !computed {
            budget.ran(&r.active)?;
        }
        memory.before = Some(now);
        r.report.time.gate += t0.elapsed();
        Ok(computed)
    }
}

/// The work target of a request allowed `total` computed steps ([`budget_steps`]) at
/// decidable step `step`, rebuilt from what its report says was computed (so a request moved
/// between processes or restored from a checkpoint carries no extra state): `total` less
/// the warm-up, the final steps and the decided steps already computed.
fn pace(
    cfg: &RequestConfig,
    total: u32,
    step: u32,
    active_per_step: &[u32],
) -> Result<Pace, EngineError> {
    let decidable = cfg.steps.saturating_sub(FINAL_FULL_STEPS);
    let computed = active_per_step.iter().filter(|&&a| a > 0).count() as u32;
    let allowed = total.saturating_sub(cfg.warmup + FINAL_FULL_STEPS);
    let since = active_per_step
        .iter()
        .rev()
        .take_while(|&&a| a == 0)
        .count() as u32;
    Pace::at(
        decidable.saturating_sub(step),
        allowed.saturating_sub(computed),
        since,
    )
    .map_err(|e| EngineError::Internal(format!("work budget of {total} steps: {e}")))
}

impl Method for FlashDiff {
    fn reads_signal(&self) -> bool {
        true
    }

    fn memory(&self) -> Box<dyn Memory> {
        Box::new(Remembered::default())
    }

    /// The budget is checked against the request's patches; an input of another width is
    /// refused by the first step that reads it.
    fn recall(&self, rec: &Recall) -> Result<Box<dyn Memory>, String> {
        let before = rec.floats("block0.input").map(<[f32]>::to_vec);
        if before
            .as_ref()
            .is_some_and(|b| b.len() % rec.tokens.max(1) != 0)
        {
            return Err("block 0's remembered input is not a whole number of token rows".into());
        }
        let parts = (
            rec.floats("budget.settings"),
            rec.counts("budget.max_skip"),
            rec.floats("budget.accumulated"),
            rec.counts("budget.skipped_run"),
        );
        let budget = match parts {
            (None, None, None, None) => None,
            (Some(&[epsilon, share, whole]), Some(&[max_skip]), Some(acc), Some(run)) => {
                let b = Budget::from_state(flashdiff_gate::budget::BudgetState {
                    cfg: BudgetConfig {
                        epsilon,
                        share,
                        max_skip,
                    },
                    accumulated: acc.to_vec(),
                    skipped_run: run.to_vec(),
                    whole,
                })
                .map_err(|e| format!("change budget: {e}"))?;
                if b.patches() != rec.patches {
                    return Err("budget and layout disagree on the patch count".into());
                }
                Some(b)
            }
            _ => return Err("the change budget's record is incomplete".into()),
        };
        Ok(Box::new(Remembered { before, budget }))
    }

    /// A work budget is one of its knobs, except for the random ablation.
    fn check(&self, _: &dyn Denoiser, cfg: &RequestConfig) -> Result<(), EngineError> {
        match self.pick {
            Pick::AtRandom => no_work_budget(cfg),
            Pick::AtBudget => Ok(()),
        }
    }

    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        saliency_patches(cfg, adaptive_r)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.reuse.forecasts()
    }

    fn skip_step(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        load: f32,
    ) -> Result<bool, EngineError> {
        if self.decide(model, r, load)? {
            return Ok(false);
        }
        forecast_whole_step(model, r);
        Ok(true)
    }

    /// The patches were decided in `skip_step` (at random, as many, for the ablation); the
    /// budget learns that they ran.
    fn choose(
        &self,
        _: &dyn Denoiser,
        r: &mut Request,
        _: f32,
        _: bool,
    ) -> Result<(), EngineError> {
        if self.pick == Pick::AtRandom {
            random_patches::draw(&mut r.active, r.cfg.seed, r.step);
        }
        let memory = memory_of::<Remembered>(&mut r.memory)?;
        let budget = memory
            .budget
            .as_mut()
            .ok_or_else(|| EngineError::Internal("a step chosen before it was decided".into()))?;
        budget.ran(&r.active)?;
        Ok(())
    }
}
