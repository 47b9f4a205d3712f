//! The Rust model against the reference implementation's golden outputs
//! (`models/tinydit/golden.py`): full forward, token-subset forward with a known K/V cache,
//! cross-attention maps and per-patch refinement importance, with explicit tolerances.

use std::path::PathBuf;

use flashdiff_models::families::tinydit::TinyDit;
use flashdiff_models::io::weights::Weights;
use flashdiff_models::{Denoiser, Device, KvCache, Patches, StepInput, Tensor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Golden {
    g: Weights,
}

impl Golden {
    fn open() -> Self {
        Self {
            g: Weights::open(&root().join("models/tinydit/golden.safetensors"))
                .expect("golden file"),
        }
    }
    fn f(&self, name: &str) -> Vec<f32> {
        self.g
            .get_any(name)
            .unwrap_or_else(|e| panic!("{e}"))
            .1
            .to_vec()
    }
    fn i(&self, name: &str) -> Vec<u32> {
        self.g
            .get_i64(name)
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|&v| v as u32)
            .collect()
    }
}

fn model() -> TinyDit {
    TinyDit::load(
        &root().join("models/tinydit/tinydit.safetensors"),
        &Device::Cpu,
    )
    .expect("built-in weights")
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0.0f32, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / (1.0 + w.abs());
        if e > worst.0 {
            worst = (e, i);
        }
    }
    assert!(
        worst.0 <= tol,
        "{what} f32: index {}: got {} want {} (relative error {:.2e} > {tol:.0e})",
        worst.1,
        got[worst.1],
        want[worst.1],
        worst.0
    );
}

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
}

/// The golden prompt's context and its step's conditioning.
fn golden_step(m: &TinyDit, g: &Golden) -> (Tensor, Tensor) {
    let context = m.encode_ids(&g.i("ids")).unwrap();
    let context = t(&context, &[context.len()]);
    let cond = m.step_cond(&context, g.f("t")[0]).unwrap();
    (context, cond)
}

fn flat(x: &Tensor) -> Vec<f32> {
    x.flatten_all().unwrap().to_vec1().unwrap()
}

// Tolerances: relative to 1 + |want|, 2e-4 for outputs through all six blocks (our f32 GEMM
// and the reference's differ in summation order), 1e-5 for attention statistics.
#[test]
fn full_forward_cross_attention_and_importance_match() {
    let (m, g) = (model(), Golden::open());
    let cfg = m.config().clone();
    let tokens = cfg.tokens();
    let (context, cond) = golden_step(&m, &g);
    let step = StepInput {
        context: &context,
        cond: &cond,
    };
    let x = t(&g.f("x"), &[tokens, cfg.patch_dim()]);
    let out = m.full_forward(&x, step, true).unwrap();
    assert_close(
        "velocity (full forward)",
        &flat(&out.velocity),
        &g.f("velocity"),
        2e-4,
    );

    // Cross-attention: golden has every layer; ours averages the saliency layers.
    let per_layer = g.f("cross_attn");
    let n = tokens * cfg.max_tokens;
    let mut want = vec![0.0f32; n];
    for &l in m.saliency_layers() {
        for i in 0..n {
            want[i] += per_layer[l * n + i] / m.saliency_layers().len() as f32;
        }
    }
    assert_close(
        "cross-attention (saliency layers)",
        &flat(out.saliency.as_ref().unwrap()),
        &want,
        1e-5,
    );

    // The subset forward with every token active and a cache equals the full forward, and
    // gives the patch mass: R_i = (1/|A_i|^2) sum_{u in A_i} mass[u][i].
    let layout = g.i("layout");
    let all: Vec<u32> = (0..tokens as u32).collect();
    let cache = KvCache {
        k: &out.k,
        v: &out.v,
    };
    let patches = Patches {
        of_token: &layout,
        patches: 4,
    };
    let sub = m
        .subset_forward(&x, &all, step, Some(cache), patches)
        .unwrap();
    assert_close(
        "velocity (subset forward, every token active)",
        &flat(&sub.velocity),
        &flat(&out.velocity),
        1e-6,
    );
    let mass = flat(&sub.patch_mass);
    let mut imp = [0.0f32; 4];
    let mut size = [0.0f32; 4];
    for u in 0..tokens {
        let p = layout[u] as usize;
        imp[p] += mass[u * 4 + p];
        size[p] += 1.0;
    }
    for p in 0..4 {
        imp[p] /= size[p] * size[p];
    }
    assert_close("refinement importance", &imp, &g.f("importance"), 1e-5);
}

#[test]
fn subset_forward_with_a_known_cache_matches() {
    let (m, g) = (model(), Golden::open());
    let cfg = m.config().clone();
    let (d, depth, tokens) = (cfg.d, cfg.depth, cfg.tokens());
    let (mut ck, mut cv) = (Vec::new(), Vec::new());
    for l in 0..depth {
        ck.extend(g.f(&format!("cache_k.{l}")));
        cv.extend(g.f(&format!("cache_v.{l}")));
    }
    let (ck, cv) = (t(&ck, &[depth, tokens, d]), t(&cv, &[depth, tokens, d]));
    // The same cache from our own full forward at the earlier (x', t').
    let context = m.encode_ids(&g.i("ids")).unwrap();
    let context = t(&context, &[context.len()]);
    let cond_prev = m.step_cond(&context, g.f("t_prev")[0]).unwrap();
    let prev = m
        .full_forward(
            &t(&g.f("x_prev"), &[tokens, cfg.patch_dim()]),
            StepInput {
                context: &context,
                cond: &cond_prev,
            },
            false,
        )
        .unwrap();
    assert_close("warm-up K", &flat(&prev.k), &flat(&ck), 2e-4);
    assert_close("warm-up V", &flat(&prev.v), &flat(&cv), 2e-4);

    let active = g.i("active");
    let x = g.f("x");
    let pd = cfg.patch_dim();
    let x_active: Vec<f32> = active
        .iter()
        .flat_map(|&t| x[t as usize * pd..(t as usize + 1) * pd].to_vec())
        .collect();
    let cond = m.step_cond(&context, g.f("t")[0]).unwrap();
    let one_patch = vec![0u32; tokens];
    let out = m
        .subset_forward(
            &t(&x_active, &[active.len(), pd]),
            &active,
            StepInput {
                context: &context,
                cond: &cond,
            },
            Some(KvCache { k: &ck, v: &cv }),
            Patches {
                of_token: &one_patch,
                patches: 1,
            },
        )
        .unwrap();
    assert_close(
        "velocity (subset forward)",
        &flat(&out.velocity),
        &g.f("subset_velocity"),
        2e-4,
    );
    for l in 0..depth {
        assert_close(
            &format!("fresh K block {l}"),
            &flat(&out.k.get(l).unwrap()),
            &g.f(&format!("fresh_k.{l}")),
            2e-4,
        );
        assert_close(
            &format!("fresh V block {l}"),
            &flat(&out.v.get(l).unwrap()),
            &g.f(&format!("fresh_v.{l}")),
            2e-4,
        );
    }
}

#[test]
fn bad_calls_are_errors_that_say_what_was_wrong() {
    let m = model();
    let cfg = m.config().clone();
    let c = m
        .condition("a red circle left on a white background")
        .unwrap();
    let context = t(&c.context, &[c.context.len()]);
    let cond = m.step_cond(&context, 0.5).unwrap();
    let step = StepInput {
        context: &context,
        cond: &cond,
    };
    let x = t(&vec![0.0; 3 * cfg.patch_dim()], &[3, cfg.patch_dim()]);
    let of = vec![0u32; cfg.tokens()];
    let p = Patches {
        of_token: &of,
        patches: 1,
    };
    for (ids, why) in [
        (vec![2u32, 1, 3], "ascending"),
        (vec![1, 2, 64], "below 64"),
    ] {
        let e = m.subset_forward(&x, &ids, step, None, p).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
    let e = m.subset_forward(&x, &[1, 2], step, None, p).unwrap_err();
    assert!(e.to_string().contains("x_active"), "{e}");
    let bad = Patches {
        of_token: &of[1..],
        patches: 1,
    };
    let e = m
        .subset_forward(&x, &[1, 2, 3], step, None, bad)
        .unwrap_err();
    assert!(e.to_string().contains("patch map"), "{e}");
    let e = m.step_cond(&cond, 0.5).unwrap_err();
    assert!(e.to_string().contains("context"), "{e}");
    let e = m.condition("a zebra").unwrap_err();
    assert!(e.to_string().contains("zebra"), "{e}");
    for blank in ["", "   ", " , . "] {
        let e = m.condition(blank).unwrap_err();
        assert!(e.to_string().contains("has no words"), "{blank:?}: {e}");
    }
}

#[test]
fn bad_weight_files_are_refused_clearly() {
    let dir = std::env::temp_dir().join(format!("flashdiff-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = TinyDit::load(&dir.join("nope.safetensors"), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("cannot read weights") && missing.contains("nope.safetensors"),
        "{missing}"
    );
    // A folder is not mapped (which fails with an obscure "No such device").
    let folder = TinyDit::load(&dir, &Device::Cpu).unwrap_err().to_string();
    assert!(folder.contains("not a file"), "{folder}");
    let full = std::fs::read(root().join("models/tinydit/tinydit.safetensors")).unwrap();
    let cut = dir.join("truncated.safetensors");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let e = TinyDit::load(&cut, &Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\x7fhello").unwrap();
    let e = TinyDit::load(&garbage, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    // A valid safetensors file that is not our model (the golden file): metadata is refused.
    let e = TinyDit::load(
        &root().join("models/tinydit/golden.safetensors"),
        &Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("metadata"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn batched_step_conditioning_equals_one_time_at_a_time_bit_for_bit() {
    let m = model();
    let c = m
        .condition("a blue triangle top on a red background")
        .unwrap();
    let context = t(&c.context, &[c.context.len()]);
    let ts: Vec<f32> = (0..50).map(|n| 1.0 - n as f32 / 50.0).collect();
    let all = m.step_conds(&context, &ts).unwrap();
    assert_eq!(all.dims(), [ts.len(), m.dims().cond_len]);
    for (i, &t1) in ts.iter().enumerate() {
        let one = m.step_cond(&context, t1).unwrap().to_vec1::<f32>().unwrap();
        let row = all.get(i).unwrap().to_vec1::<f32>().unwrap();
        assert!(
            one.iter()
                .zip(&row)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {i} (t = {t1}) differs from its single-time conditioning"
        );
    }
    let e = m.step_conds(&context, &[]).unwrap_err();
    assert!(e.to_string().contains("at least one"), "{e}");
    let e = m.step_conds(&context, &[f32::NAN]).unwrap_err();
    assert!(e.to_string().contains("finite"), "{e}");
}

/// The video weights load as a 3-D grid and decode to frames, each frame the image
/// unpatchify of its own tokens (frame-major order, as `video_model.py` patchifies).
#[test]
fn video_weights_load_as_frames() {
    use flashdiff_models::{families::tinydit::TinyDit, Denoiser, Kind};
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tinyvideo/tinyvideo.safetensors");
    let m = TinyDit::load(&path, &candle_core::Device::Cpu).unwrap();
    assert_eq!(m.kind(), Kind::Video);
    let d = m.dims();
    assert_eq!(
        (d.grid.frames, d.grid.height, d.grid.width, d.channels),
        (8, 4, 4, 192)
    );
    let latent: Vec<f32> = (0..128 * 192)
        .map(|i| ((i % 97) as f32 / 48.0) - 1.0)
        .collect();
    let s = m.decode(&latent).unwrap();
    assert_eq!((s.frames, s.width, s.height), (8, 32, 32));
    for f in [0usize, 5] {
        let want = flashdiff_models::families::tinydit::unpatchify(
            &latent[f * 16 * 192..(f + 1) * 16 * 192],
            4,
            8,
        );
        assert_eq!(s.frame(f), &want[..]);
    }
    // Salient words: the model's own function words ("moving") are not.
    let c = m
        .condition("a red circle top left moving right on a blue background")
        .unwrap();
    let salient: Vec<&str> = c
        .words
        .iter()
        .zip(&c.salient)
        .filter(|(_, &s)| s)
        .map(|(w, _)| w.as_str())
        .collect();
    assert_eq!(salient, ["red", "circle", "top", "left", "right", "blue"]);
}

/// A copy of the shipped image model with the metadata entry `key` set to `value`.
fn with_metadata(key: &str, value: &str, name: &str) -> PathBuf {
    let bytes = std::fs::read(root().join("models/tinydit/tinydit.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta = header["__metadata__"].as_object_mut().unwrap();
    meta.insert(key.into(), value.into());
    let mut text = serde_json::to_vec(&header).unwrap();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    let dir = std::env::temp_dir().join(format!("flashdiff-shift-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    path
}

/// The sampling schedule is the weights' `sample_shift` (u -> s u / (1 + (s - 1) u)), uniform
/// without it; a shift out of range is refused by name.
#[test]
fn the_sampling_schedule_is_the_weights_shift() {
    use flashdiff_models::Denoiser;
    let shifted = |s: f64, n: u32| {
        let u = 1.0 - n as f64 / 50.0;
        (s * u / (1.0 + (s - 1.0) * u)) as f32
    };
    let audio = TinyDit::load(
        &root().join("models/tinyaudio/tinyaudio.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let image = model();
    let half_path = with_metadata("sample_shift", "0.5", "half.st");
    let half = TinyDit::load(&half_path, &Device::Cpu).unwrap();
    for n in [0, 1, 12, 25, 49, 50] {
        let uniform = 1.0 - n as f32 / 50.0;
        assert!((image.time(n, 50) - uniform).abs() < 1e-6, "image step {n}");
        for m in [&audio, &half] {
            let (got, want) = (m.time(n, 50), shifted(0.5, n));
            assert!(
                (got - want).abs() < 1e-6,
                "{} step {n}: {got} vs {want}",
                m.name()
            );
        }
    }
    // Halfway through the steps the shifted schedule is a third of the way from data.
    assert!((half.time(25, 50) - 1.0 / 3.0).abs() < 1e-6);
    for bad in ["0", "-1", "1000", "\"fast\""] {
        let path = with_metadata("sample_shift", bad, "bad.st");
        let e = TinyDit::load(&path, &Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("sample_shift"), "{bad}: {e}");
    }
    std::fs::remove_dir_all(half_path.parent().unwrap()).ok();
}

/// The split forward DBCache runs: the first n blocks, the rest, the output layer, at every
/// split point, give the full forward's velocity bit for bit; a split outside the stack or
/// hidden rows of the wrong shape are refused with what was wrong.
#[test]
fn the_split_forward_is_the_full_forward() {
    let (m, g) = (model(), Golden::open());
    let cfg = m.config().clone();
    let (context, cond) = golden_step(&m, &g);
    let step = StepInput {
        context: &context,
        cond: &cond,
    };
    let x = t(&g.f("x"), &[cfg.tokens(), cfg.patch_dim()]);
    let want = flat(&m.full_forward(&x, step, false).unwrap().velocity);
    assert_eq!(m.depth(), cfg.depth);
    for n in 0..=cfg.depth {
        let front = m.front(&x, step, n).unwrap();
        assert_eq!(front.dims(), [cfg.tokens(), cfg.d]);
        let hidden = m.rest(&front, step, n).unwrap();
        let got = flat(&m.output(&hidden, step).unwrap());
        assert!(
            got == want,
            "split after {n} blocks differs from the full forward"
        );
    }
    let err = m.front(&x, step, cfg.depth + 1).unwrap_err().to_string();
    assert!(err.contains("blocks"), "{err}");
    let err = m.rest(&x, step, 1).unwrap_err().to_string();
    assert!(err.contains("hidden rows"), "{err}");
    let front = m.front(&x, step, 1).unwrap();
    assert!(m.rest(&front, step, cfg.depth + 1).is_err());
}
