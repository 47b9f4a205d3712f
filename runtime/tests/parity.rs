//! The Rust model against the reference implementation's golden outputs
//! (`models/tinydit/golden.py`): full forward, token-subset forward with a known K/V cache,
//! cross-attention maps and per-patch refinement importance, with explicit tolerances.

use std::path::PathBuf;

use flashdiff_runtime::model::{KvCache, StepStats, TinyDit, Weights};

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
    TinyDit::load(&root().join("models/tinydit/tinydit.safetensors")).expect("built-in weights")
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

#[test]
fn full_forward_cross_attention_and_importance_match() {
    let (m, g) = (model(), Golden::open());
    let cfg = m.config().clone();
    let ids = g.i("ids");
    let x = g.f("x");
    let t = g.f("t")[0];
    let text = m.encode_text(&ids);
    let cond = m.step_cond(&text, t);
    let all: Vec<u32> = (0..cfg.tokens() as u32).collect();
    let layout = g.i("layout");
    let mut cross = vec![0.0f32; cfg.tokens() * cfg.max_tokens];
    let mut mass = vec![0.0f32; cfg.tokens() * 4];
    let out = {
        let mut st = StepStats {
            cross: Some(&mut cross),
            patch_mass: Some((&layout, 4, &mut mass)),
        };
        m.forward(&x, &all, &cond, &text, m.new_cache().view(), &mut st)
    };
    assert_close(
        "velocity (full forward)",
        &out.velocity,
        &g.f("velocity"),
        2e-4,
    );

    // Cross-attention: golden has every layer; ours averages the saliency layers.
    let per_layer = g.f("cross_attn");
    let n = cfg.tokens() * cfg.max_tokens;
    let mut want = vec![0.0f32; n];
    for &l in m.saliency_layers() {
        for i in 0..n {
            want[i] += per_layer[l * n + i] / m.saliency_layers().len() as f32;
        }
    }
    assert_close("cross-attention (saliency layers)", &cross, &want, 1e-5);

    // R_i = (1/|A_i|^2) sum_{u in A_i} mass[u][i].
    let mut imp = [0.0f32; 4];
    let mut size = [0.0f32; 4];
    for u in 0..cfg.tokens() {
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
    let (d, depth) = (cfg.d, cfg.depth);
    let mut cache = KvCache::new(depth, cfg.tokens(), d);
    for l in 0..depth {
        let n = cfg.tokens() * d;
        cache.k[l * n..(l + 1) * n].copy_from_slice(&g.f(&format!("cache_k.{l}")));
        cache.v[l * n..(l + 1) * n].copy_from_slice(&g.f(&format!("cache_v.{l}")));
    }
    // The same cache from our own full forward at the earlier (x', t').
    let text = m.encode_text(&g.i("ids"));
    let all: Vec<u32> = (0..cfg.tokens() as u32).collect();
    let prev = m.forward(
        &g.f("x_prev"),
        &all,
        &m.step_cond(&text, g.f("t_prev")[0]),
        &text,
        m.new_cache().view(),
        &mut StepStats::default(),
    );
    let mut ours = m.new_cache();
    ours.update(&all, &prev);
    for l in 0..depth {
        assert_close(
            &format!("warm-up K/V block {l}"),
            ours.layer_k(l),
            cache.layer_k(l),
            2e-4,
        );
    }

    let active = g.i("active");
    let x = g.f("x");
    let pd = cfg.patch_dim();
    let x_active: Vec<f32> = active
        .iter()
        .flat_map(|&t| x[t as usize * pd..(t as usize + 1) * pd].to_vec())
        .collect();
    let out = m.forward(
        &x_active,
        &active,
        &m.step_cond(&text, g.f("t")[0]),
        &text,
        cache.view(),
        &mut StepStats::default(),
    );
    assert_close(
        "velocity (subset forward)",
        &out.velocity,
        &g.f("subset_velocity"),
        2e-4,
    );
    for l in 0..depth {
        assert_close(
            &format!("fresh K block {l}"),
            &out.k[l],
            &g.f(&format!("fresh_k.{l}")),
            2e-4,
        );
        assert_close(
            &format!("fresh V block {l}"),
            &out.v[l],
            &g.f(&format!("fresh_v.{l}")),
            2e-4,
        );
    }
}

#[test]
fn bad_weight_files_are_refused_clearly() {
    let dir = std::env::temp_dir().join(format!("flashdiff-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = TinyDit::load(&dir.join("nope.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("cannot read weights") && missing.contains("nope.safetensors"),
        "{missing}"
    );
    let full = std::fs::read(root().join("models/tinydit/tinydit.safetensors")).unwrap();
    let cut = dir.join("truncated.safetensors");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let e = TinyDit::load(&cut).unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\x7fhello").unwrap();
    let e = TinyDit::load(&garbage).unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    // A valid safetensors file that is not our model (the golden file): metadata is refused.
    let e = TinyDit::load(&root().join("models/tinydit/golden.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("metadata"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
