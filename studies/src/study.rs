//! The verdict protocol run on the engine ([`crate::protocol`] holds its rules): every method's
//! candidate settings run on validation prompts; for each target work level each method's
//! setting is chosen there ([`protocol::choose`]); the chosen settings then run once on test
//! prompts (other seeds), where each pair of methods gets its paired verdict. The curve study
//! ([`crate::curve`]) and the crossover study ([`crate::crossover`]) are this run over their
//! own method lists; their files (`curve.json`, `crossover.json`) hold the methods, every
//! candidate's validation result and every target's rows and pairs, so reports and pictures
//! are written again from them alone.

use anyhow::{anyhow, Error};
use std::ops::Range;
use std::path::Path;

use serde_json::{json, Value};

use crate::journal::Journal;
use crate::protocol::{self, PerPrompt, Split, IMAGE_TARGETS, MEDIA_TARGETS};
use crate::{ms, work, BenchConfig};
use flashdiff_models::families::tinydit::scene;
use flashdiff_models::{Kind, Sample};
use flashdiff_runtime::engine::{Engine, EngineError, Mode, RequestConfig, FINAL_FULL_STEPS};

/// One candidate setting of one method.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The method's name.
    pub method: &'static str,
    /// The setting as the report names it.
    pub label: String,
    /// The request it runs (the prompt's seed is set per prompt).
    pub cfg: RequestConfig,
}

/// A method: its name and what it is.
pub type Method = (&'static str, &'static str);

/// The target work levels of a model's kind: images 0.2, 0.25, 0.33 and 0.5; sound and video
/// 0.3, 0.4 and 0.5.
pub fn targets(kind: Kind) -> &'static [f64] {
    match kind {
        Kind::Image => &IMAGE_TARGETS,
        _ => &MEDIA_TARGETS,
    }
}

/// The fidelity measure of a model's kind, as the reports name it.
pub fn measure_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Image => "PSNR",
        Kind::Video => "clip PSNR",
        Kind::Audio => "SNR",
    }
}

/// `count` step counts below `steps` (fewer where there are not that many), spread evenly
/// from the fewest a run can take up: fewer steps' candidates.
pub fn fewer_steps(steps: u32, count: usize) -> Vec<u32> {
    let lo = 2u32.max(FINAL_FULL_STEPS + 1);
    let hi = steps.saturating_sub(1);
    if hi < lo || count == 0 {
        return Vec::new();
    }
    let span = (hi - lo) as usize;
    let mut v: Vec<u32> = (0..count)
        .map(|i| lo + ((i * span) as f64 / (count - 1).max(1) as f64).round() as u32)
        .collect();
    v.dedup();
    v
}

/// Fewer steps' candidates as requests: full computation at each of [`fewer_steps`].
pub fn fewer_steps_candidates(base: &RequestConfig, count: usize) -> Vec<Candidate> {
    fewer_steps(base.steps, count)
        .into_iter()
        .map(|n| Candidate {
            method: "fewer-steps",
            label: format!("{n} steps"),
            cfg: RequestConfig {
                mode: Mode::Full,
                steps: n,
                warmup: base.warmup.min(n - 1),
                budget: None,
                ..base.clone()
            },
        })
        .collect()
}

/// Per prompt of one setting: what the protocol reads and what the report adds.
#[derive(Default, Clone)]
struct Measured {
    scores: PerPrompt,
    ssim: Vec<f64>,
    agree: Vec<bool>,
    /// Whether the checker accepts every part of full computation's output.
    full_right: Vec<bool>,
    ms: Vec<f64>,
}

/// A prompt's checker: its per-part verdict on a sample (empty where the model has none).
pub(crate) type Checker = Box<dyn Fn(&Sample) -> Vec<bool>>;

/// The prompt of `seed` for a model of `kind` (images: scenes drawn for `side` pixels) and
/// its checker.
pub(crate) fn prompt(kind: Kind, side: usize, seed: u64) -> (String, Checker) {
    match kind {
        Kind::Image => {
            let s = scene::sample_sized(side, seed);
            let text = scene::prompt_text(&s);
            (
                text,
                Box::new(move |o: &Sample| {
                    flashdiff_eval::image::check_sized(&o.rgb, &s)
                        .map_or_else(Vec::new, |v| vec![v.background, v.present, v.shape])
                }),
            )
        }
        _ => {
            let (p, check) = crate::media::prompt_and_checker(kind, seed);
            (p, Box::new(move |o: &Sample| check(o).1))
        }
    }
}

/// Fidelity to full computation in dB (capped at 99) and SSIM (images; NaN otherwise).
pub(crate) fn fidelity(kind: Kind, side: usize, o: &Sample, full: &Sample) -> (f64, f64) {
    match kind {
        Kind::Image => (
            flashdiff_eval::metrics::psnr(&o.rgb, &full.rgb).min(99.0),
            flashdiff_eval::metrics::ssim(&o.rgb, &full.rgb, side, side),
        ),
        Kind::Video => (
            flashdiff_eval::metrics::video_quality(o, full)
                .map_or(f64::NAN, |q| q.clip_psnr.min(99.0)),
            f64::NAN,
        ),
        Kind::Audio => (
            flashdiff_eval::metrics::audio_quality(o, full).map_or(f64::NAN, |q| q.snr.min(99.0)),
            f64::NAN,
        ),
    }
}

/// What a run measures on: the engine's model, its kind and canvas side, the steps, and the
/// journal its results go to (and come back from, when a stopped run continues).
struct Bench<'a> {
    engine: &'a mut Engine,
    kind: Kind,
    side: usize,
    steps: u32,
    journal: Option<Journal>,
}

/// One request's result as the journal keeps it.
fn push(m: &mut Measured, v: &Value) {
    m.scores.push(num(v, "work"), num(v, "db"));
    m.ssim.push(num(v, "ssim"));
    m.agree.push(v["agree"] == json!(true));
    m.full_right.push(v["full_right"] == json!(true));
    m.ms.push(num(v, "ms"));
}

impl Bench<'_> {
    /// Runs full computation and `settings` on the prompts of `seeds`, or takes their results
    /// from the journal; `progress` hears of each prompt.
    fn measure(
        &mut self,
        settings: &[&Candidate],
        seeds: Range<u64>,
        what: &str,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<(Measured, Vec<Measured>)> {
        let (kind, side, steps) = (self.kind, self.side, self.steps);
        let mut full = Measured::default();
        let mut each = vec![Measured::default(); settings.len()];
        let n = seeds.end - seeds.start;
        let base = settings
            .first()
            .map_or_else(RequestConfig::default, |c| c.cfg.clone());
        for (i, seed) in seeds.enumerate() {
            let full_cfg = RequestConfig {
                mode: Mode::Full,
                steps,
                seed,
                budget: None,
                ..base.clone()
            };
            let cfgs: Vec<RequestConfig> = settings
                .iter()
                .map(|c| RequestConfig {
                    seed,
                    ..c.cfg.clone()
                })
                .collect();
            let cached =
                |j: &Option<Journal>, c: &RequestConfig| j.as_ref().and_then(|j| j.get(c)).cloned();
            let all_cached = std::iter::once(&full_cfg)
                .chain(&cfgs)
                .all(|c| cached(&self.journal, c).is_some());
            let verified = self.journal.as_ref().is_none_or(|j| j.verified);
            if all_cached && verified {
                progress(&format!("{what} prompt {}/{n}: from the journal", i + 1));
                for (c, m) in
                    std::iter::once((&full_cfg, &mut full)).chain(cfgs.iter().zip(each.iter_mut()))
                {
                    push(m, &cached(&self.journal, c).unwrap_or(Value::Null));
                }
                continue;
            }
            progress(&format!(
                "{what} prompt {}/{n}: full computation and {} settings",
                i + 1,
                settings.len()
            ));
            let (text, check) = prompt(kind, side, seed);
            let reference = self.engine.generate(&text, full_cfg.clone(), &mut |_| {})?;
            let fparts = check(&reference.sample);
            let right = !fparts.is_empty() && fparts.iter().all(|&ok| ok);
            let result = |o: &flashdiff_runtime::engine::Output| {
                let (db, ssim) = fidelity(kind, side, &o.sample, &reference.sample);
                json!({
                    "work": work(o, steps), "db": db, "ssim": ssim,
                    "agree": check(&o.sample) == fparts, "full_right": right,
                    "ms": ms(o.report.latency),
                })
            };
            let r = result(&reference);
            // Full computation is its own reference (work 1, 99 dB): it says nothing of whether
            // this build computes as the journal's did, so only a setting verifies the journal.
            if self
                .journal
                .as_ref()
                .is_some_and(|j| j.get(&full_cfg).is_none())
            {
                self.note(&full_cfg, &r)?;
            }
            push(&mut full, &r);
            for (c, m) in cfgs.iter().zip(&mut each) {
                let verified = self.journal.as_ref().is_none_or(|j| j.verified);
                let r = match cached(&self.journal, c) {
                    // A build that computes differently is caught on the first result the
                    // journal gives: it is computed again and compared.
                    Some(r) if verified => r,
                    _ => {
                        let o = self.engine.generate(&text, c.clone(), &mut |_| {})?;
                        let r = result(&o);
                        self.note(c, &r)?;
                        r
                    }
                };
                push(m, &r);
            }
        }
        Ok((full, each))
    }

    /// A setting's result computed now: checked against the journal's where it has one (the
    /// journal's first check), else added.
    fn note(&mut self, cfg: &RequestConfig, r: &Value) -> anyhow::Result<()> {
        match self.journal.as_mut() {
            Some(j) if j.get(cfg).is_some() => j.verify(cfg, r),
            Some(j) => j.put(cfg, r.clone()),
            None => Ok(()),
        }
    }
}

/// The canvas side scenes are drawn for: the model's square image side (images), else the
/// built-in image size (unused).
pub(crate) fn side_of(engine: &Engine) -> anyhow::Result<usize> {
    let model = engine.model().name().to_string();
    match engine.model().image_size() {
        Some((w, h)) if w == h => Ok(w),
        Some((w, h)) => Err(anyhow!(
            "the study draws square scenes; {model} makes {w}x{h} images"
        )),
        None => Ok(scene::IMAGE),
    }
}

/// Runs the protocol on `engine`'s model: `methods` (name, what) with their candidates
/// `list`, `validation` validation prompts, then `cfg.prompts` test prompts (the seeds after
/// them); returns the study's document (see the module's description). `study` names the
/// study in its reports. With `journal`, every result is kept in that folder's journal as it
/// is measured and a stopped run continues from it ([`crate::journal`]).
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    study: &str,
    methods: &[Method],
    list: &[Candidate],
    (validation, journal): (u32, Option<&Path>),
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Value> {
    let most = methods
        .iter()
        .map(|(m, _)| list.iter().filter(|c| c.method == *m).count())
        .max()
        .unwrap_or(0);
    // Fewer steps may have fewer candidates than the others only when it tries every step
    // count there is below the request's.
    let every_count = fewer_steps(cfg.steps, usize::from(u16::MAX)).len();
    let counts: Vec<(&str, usize)> = methods
        .iter()
        .map(|(m, _)| {
            let n = list.iter().filter(|c| c.method == *m).count();
            let exhaustive = *m == "fewer-steps" && n == every_count && n < most;
            (*m, if exhaustive { most } else { n })
        })
        .collect();
    let per_method = protocol::equal_tries(&counts).map_err(Error::msg)?;
    let model = engine.model().name().to_string();
    let kind = engine.model().kind();
    let side = side_of(engine)?;
    let split = Split::consecutive(cfg.seed, validation, cfg.prompts).map_err(|e| {
        EngineError::Invalid {
            field: "prompts",
            reason: e,
        }
    })?;
    let warmup = list.first().map_or(cfg.base.warmup, |c| c.cfg.warmup);
    let workers = engine.workers();
    let journal = match journal {
        Some(dir) => {
            let j = Journal::open(dir, &model, &cfg.weights)?;
            if !j.is_empty() {
                progress(&format!(
                    "continuing from {} results in {}",
                    j.len(),
                    dir.join(crate::journal::FILE).display()
                ));
            }
            Some(j)
        }
        None => None,
    };
    let mut bench = Bench {
        engine,
        kind,
        side,
        steps: cfg.steps,
        journal,
    };
    // Validation: every candidate on every validation prompt.
    let all: Vec<&Candidate> = list.iter().collect();
    let (_, val) = bench.measure(&all, split.validation(), "validation", progress)?;
    // Each method's choice per target.
    let targets = targets(kind);
    let mut chosen: Vec<usize> = Vec::new();
    let mut choice: Vec<Vec<Option<usize>>> = Vec::new();
    for &t in targets {
        let mut row = Vec::new();
        for (m, _) in methods {
            let idx: Vec<usize> = (0..list.len()).filter(|&i| list[i].method == *m).collect();
            let scores: Vec<PerPrompt> = idx.iter().map(|&i| val[i].scores.clone()).collect();
            let pick = protocol::choose(&scores, t).map(|j| idx[j]);
            if let Some(i) = pick.filter(|i| !chosen.contains(i)) {
                chosen.push(i);
            }
            row.push(pick);
        }
        choice.push(row);
    }
    // Test: the chosen settings once each.
    let run_list: Vec<&Candidate> = chosen.iter().map(|&i| &list[i]).collect();
    let (full, test) = bench.measure(&run_list, split.test(), "test", progress)?;
    let tested = |i: usize| {
        let at = chosen.iter().position(|&c| c == i);
        &test[at.expect("every chosen setting ran on the test prompts")]
    };
    let boot_seed = split.test().start;
    let mut target_docs = Vec::new();
    for (ti, &t) in targets.iter().enumerate() {
        let mut rows = Vec::new();
        for (mi, (m, _)) in methods.iter().enumerate() {
            rows.push(match choice[ti][mi] {
                Some(i) => row(m, &list[i].label, &val[i].scores, tested(i)),
                None => json!({"method": m, "setting": Value::Null}),
            });
        }
        let mut pairs = Vec::new();
        for a in 0..methods.len() {
            for b in a + 1..methods.len() {
                let (Some(ia), Some(ib)) = (choice[ti][a], choice[ti][b]) else {
                    continue;
                };
                let (p, v) = protocol::compare(&tested(ia).scores, &tested(ib).scores, boot_seed)
                    .map_err(Error::msg)?;
                pairs.push(json!({
                    "a": methods[a].0, "b": methods[b].0, "mean": p.mean, "lo": p.lo,
                    "hi": p.hi, "worst": p.worst, "verdict": v.to_string(),
                }));
            }
        }
        target_docs.push(json!({"target": t, "rows": rows, "pairs": pairs}));
    }
    Ok(json!({
        "config": {
            "study": study, "model": model, "kind": kind.name(),
            "measure": measure_name(kind), "side": side, "steps": cfg.steps,
            "patches": cfg.patches, "warmup": warmup, "workers": workers,
            "validation_seeds": [split.validation().start, split.validation().end],
            "test_seeds": [split.test().start, split.test().end],
            "candidates_per_method": per_method, "bootstrap_seed": boot_seed,
            "resamples": protocol::RESAMPLES,
        },
        "methods": methods.iter().map(|(m, w)| json!({"name": m, "what": w})).collect::<Vec<_>>(),
        "prompts": {
            "validation": split.validation().map(|seed| json!([seed, prompt(kind, side, seed).0])).collect::<Vec<_>>(),
            "test": split.test().map(|seed| json!([seed, prompt(kind, side, seed).0])).collect::<Vec<_>>(),
        },
        "full": {
            "wall_ms": mean(&full.ms),
            "checker_right": full.full_right.iter().filter(|&&r| r).count(),
            "prompts": full.ms.len(),
        },
        "candidates": list.iter().zip(&val).map(|(c, v)| json!({
            "method": c.method, "setting": c.label,
            "validation_work": v.scores.mean_work(), "validation_db": v.scores.mean_db(),
        })).collect::<Vec<_>>(),
        "targets": target_docs,
    }))
}

/// One method's row at one target: its chosen setting's validation and test results.
fn row(method: &str, label: &str, val: &PerPrompt, r: &Measured) -> Value {
    let right: Vec<f64> = r
        .scores
        .db
        .iter()
        .zip(&r.full_right)
        .filter(|(_, &ok)| ok)
        .map(|(&db, _)| db)
        .collect();
    json!({
        "method": method, "setting": label,
        "validation_work": val.mean_work(), "validation_db": val.mean_db(),
        "work": r.scores.mean_work(), "max_work": r.scores.max_work(),
        "db": r.scores.mean_db(), "worst_db": r.scores.worst_db(),
        "worst_db_full_right": right.iter().copied().fold(f64::INFINITY, f64::min),
        "ssim": mean(&r.ssim),
        "agreement": r.agree.iter().filter(|&&a| a).count() as f64 / r.agree.len().max(1) as f64,
        "wall_ms": mean(&r.ms),
        "per_prompt_db": r.scores.db, "per_prompt_work": r.scores.work,
    })
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub(crate) fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// Writes `doc` as `<dir>/<file>`, its report as `report.md` and its picture as
/// `quality_vs_work.svg` and `.png`; returns the report.
pub fn write(dir: &Path, file: &str, doc: &Value) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let put = |name: &str, body: &str| {
        std::fs::write(dir.join(name), body)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))
    };
    put(file, &serde_json::to_string_pretty(doc).unwrap_or_default())?;
    let md = report(doc);
    put("report.md", &md)?;
    plot(dir, doc).map_err(|e| format!("plotting {}: {e}", dir.display()))?;
    Ok(md)
}

/// Reads a study's document back from `path`; the error says what is wrong with it.
pub fn read(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    if !doc["targets"].is_array() {
        return Err(format!(
            "{}: no targets (not a protocol study's document, or one written by an older \
             version: run the study again)",
            path.display()
        ));
    }
    Ok(doc)
}

fn methods_of(doc: &Value) -> Vec<(String, String)> {
    doc["methods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or("?").to_string(),
                m["what"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// A study's report from its document.
pub fn report(doc: &Value) -> String {
    let c = &doc["config"];
    let q = c["measure"].as_str().unwrap_or("PSNR");
    let size = match c["kind"].as_str() {
        Some("image") | None => format!(" ({} x {} pixels)", c["side"], c["side"]),
        _ => String::new(),
    };
    let prompts = c["test_seeds"][1]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(c["test_seeds"][0].as_u64().unwrap_or(0));
    let full = &doc["full"];
    let mut md = format!(
        "# {} study: {}{size}\n\n{} steps (warm-up {}), {} patches, {} worker(s). Settings chosen on validation seeds {}..{}, judged on test seeds {}..{} ({prompts} prompts; full computation passes the checker on {} of them); {} candidate settings per method. Work: the model FLOPs a request ran as a share of full computation's (the engine's count of its layers: the warm-up, every computed token and fixed row, every step's conditioning, and the signal a method reads). {q} against full computation from the same seed (capped at 99 dB). Verdicts: the paired per-prompt difference (A minus B), its 95% bootstrap interval ({} resamples), and the worst-prompt difference; \"ahead\" when the interval lies above +{} dB and the worst prompt is higher, \"behind\" symmetrically, else \"level\"; \"not matched\" when the mean work differs by more than {} and the cheaper one is not ahead. Full computation: {:.0} ms a request.\n\n| method | what it is |\n| --- | --- |\n",
        capitalised(c["study"].as_str().unwrap_or("protocol")),
        c["model"].as_str().unwrap_or("?"),
        c["steps"], c["warmup"], c["patches"], c["workers"],
        c["validation_seeds"][0], c["validation_seeds"][1], c["test_seeds"][0], c["test_seeds"][1],
        full["checker_right"], c["candidates_per_method"], protocol::RESAMPLES,
        protocol::MARGIN_DB, protocol::WORK_MATCH, num(full, "wall_ms"),
    );
    for (m, what) in methods_of(doc) {
        md.push_str(&format!("| {m} | {what} |\n"));
    }
    for t in doc["targets"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "\n## Work {}\n\n| method | setting (validation work, mean dB) | work mean / max | {q} mean dB | {q} worst dB | worst where full computation passes the checker | SSIM | agreement | wall ms |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
            t["target"]
        ));
        for r in t["rows"].as_array().into_iter().flatten() {
            let m = r["method"].as_str().unwrap_or("?");
            match r["setting"].as_str() {
                Some(s) => md.push_str(&format!(
                    "| {m} | {s} ({:.3}, {:.2}) | {:.3} / {:.3} | {:.2} | {:.2} | {:.2} | {:.4} | {:.0}% | {:.0} |\n",
                    num(r, "validation_work"), num(r, "validation_db"), num(r, "work"),
                    num(r, "max_work"), num(r, "db"), num(r, "worst_db"),
                    num(r, "worst_db_full_right"), num(r, "ssim"),
                    100.0 * num(r, "agreement"), num(r, "wall_ms"),
                )),
                None => md.push_str(&format!(
                    "| {m} | no candidate at or under this work on the validation prompts | - | - | - | - | - | - | - |\n"
                )),
            }
        }
        md.push_str("\n| A | B | mean A - B dB [95% interval] | worst A - worst B dB | verdict of A |\n| --- | --- | --- | --- | --- |\n");
        for p in t["pairs"].as_array().into_iter().flatten() {
            md.push_str(&format!(
                "| {} | {} | {:+.2} [{:+.2}, {:+.2}] | {:+.2} | {} |\n",
                p["a"].as_str().unwrap_or("?"),
                p["b"].as_str().unwrap_or("?"),
                num(p, "mean"),
                num(p, "lo"),
                num(p, "hi"),
                num(p, "worst"),
                p["verdict"].as_str().unwrap_or("?"),
            ));
        }
    }
    md
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Test-prompt quality against work: each method's chosen settings (mean solid, worst
/// dashed), every validation candidate as a faint dot; `quality_vs_work.svg` and `.png`.
fn plot(dir: &Path, doc: &Value) -> crate::plots::PlotResult {
    use plotters::prelude::*;
    let path = dir.join("quality_vs_work.svg");
    let root = SVGBackend::new(&path, (820, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let q = doc["config"]["measure"].as_str().unwrap_or("PSNR");
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: {q} against full computation vs work (test prompts)",
                doc["config"]["model"].as_str().unwrap_or("?")
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..0.7f64, 0f64..80f64)?;
    chart
        .configure_mesh()
        .x_desc("share of full computation's work")
        .y_desc(format!("{q} dB"))
        .draw()?;
    let colours = crate::colours();
    for (mi, (m, _)) in methods_of(doc).iter().enumerate() {
        let c = colours[mi % colours.len()];
        let rows: Vec<&Value> = doc["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| {
                t["rows"]
                    .as_array()?
                    .iter()
                    .find(|r| r["method"] == m.as_str() && r["setting"].is_string())
            })
            .collect();
        let points = |key: &str| {
            let mut v: Vec<(f64, f64)> = rows
                .iter()
                .map(|r| (num(r, "work"), num(r, key).min(80.0)))
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let (mean, worst) = (points("db"), points("worst_db"));
        // Lines join two chosen settings or more; a lone one is its marks alone.
        let line = |v: &[(f64, f64)]| if v.len() > 1 { v.to_vec() } else { Vec::new() };
        chart
            .draw_series(mean.iter().map(|&p| Circle::new(p, 4, c.filled())))?
            .label(m.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart.draw_series(LineSeries::new(line(&mean), c.stroke_width(2)))?;
        chart.draw_series(worst.iter().map(|&p| Cross::new(p, 4, c)))?;
        chart.draw_series(LineSeries::new(line(&worst), c))?;
        let cands = doc["candidates"].as_array().into_iter().flatten();
        chart.draw_series(
            cands
                .filter(|v| v["method"] == m.as_str())
                .map(|v| (num(v, "validation_work"), num(v, "validation_db").min(80.0)))
                .filter(|p| p.0.is_finite() && p.1.is_finite() && p.0 <= 0.7)
                .map(|p| Circle::new(p, 2, c.mix(0.3).filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    drop(chart);
    drop(root);
    crate::plots::svg_to_png(&path, &dir.join("quality_vs_work.png"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_steps_spreads_its_counts_below_the_steps() {
        let v = fewer_steps(50, 32);
        assert_eq!(v.len(), 32);
        assert!(v.windows(2).all(|w| w[0] < w[1]), "{v:?}");
        assert!(*v.last().unwrap() < 50 && v[0] > FINAL_FULL_STEPS);
        assert!(fewer_steps(2, 32).is_empty());
    }

    #[test]
    fn a_document_without_targets_is_refused_with_its_path() {
        let p = std::env::temp_dir().join(format!("fd-study-{}.json", std::process::id()));
        std::fs::write(&p, r#"{"points": []}"#).unwrap();
        let e = read(&p).unwrap_err();
        assert!(e.contains("no targets") && e.contains("fd-study-"), "{e}");
        std::fs::remove_file(&p).ok();
    }
}
