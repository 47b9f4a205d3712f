//! FLUX.1's transformer against candle-transformers' own, unmodified implementation, on
//! random weights of a small config with the real structure, and the
//! token-subset forward against the full one (5b).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::flux::model as reference;
use candle_transformers::models::flux::WithForward;
use flashdiff_models::families::flux::{Flux, FluxConfig, Rows};
use flashdiff_models::io::shards::var_builder_from;
use flashdiff_models::ModelError;

mod common;
use common::max_diff;

const TOL: f32 = 1e-4;

fn small(guidance: bool) -> (FluxConfig, reference::Config) {
    let ours = FluxConfig {
        in_channels: 8,
        vec_in_dim: 12,
        context_in_dim: 16,
        hidden: 64,
        mlp_ratio: 4.0,
        heads: 4,
        depth: 2,
        depth_single: 2,
        axes_dim: [4, 6, 6],
        theta: 10_000.0,
        qkv_bias: true,
        guidance_embed: guidance,
    };
    let theirs = reference::Config {
        in_channels: 8,
        vec_in_dim: 12,
        context_in_dim: 16,
        hidden_size: 64,
        mlp_ratio: 4.0,
        num_heads: 4,
        depth: 2,
        depth_single_blocks: 2,
        axes_dim: vec![4, 6, 6],
        theta: 10_000,
        qkv_bias: true,
        guidance_embed: guidance,
    };
    (ours, theirs)
}

/// The reference model on random weights (every tensor, norms and biases included, drawn
/// anew), and those weights by name.
fn random_pair(guidance: bool, seed: u64) -> (Flux, reference::Flux, FluxConfig) {
    let dev = Device::Cpu;
    let (cfg, rcfg) = small(guidance);
    let vm = VarMap::new();
    let theirs = reference::Flux::new(&rcfg, VarBuilder::from_varmap(&vm, DType::F32, &dev))
        .expect("the reference builds");
    let mut named: HashMap<String, Tensor> = HashMap::new();
    {
        let data = vm.data().lock().unwrap();
        let mut names: Vec<&String> = data.keys().collect();
        names.sort();
        for (i, name) in names.into_iter().enumerate() {
            let var = &data[name];
            let t = noise(var.dims(), seed * 1000 + i as u64, 0.2);
            var.set(&t).unwrap();
            named.insert(name.clone(), t);
        }
    }
    // The reference's LayerNorms are fixed ones, not weights: nothing more to share.
    let get = |name: &str, shape: &[usize]| -> Result<Tensor, ModelError> {
        let t = named
            .get(name)
            .ok_or_else(|| ModelError::Input(format!("no tensor {name}")))?;
        assert_eq!(t.dims(), shape, "{name}");
        Ok(t.clone())
    };
    let ours = Flux::load(cfg.clone(), &var_builder_from(get, &Device::Cpu))
        .expect("ours loads the same tensors");
    (ours, theirs, cfg)
}

/// Deterministic pseudo-normal values (sum of uniforms), scaled.
fn noise(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut acc = 0.0f32;
        for _ in 0..4 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            acc += ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
        }
        v.push(acc * scale * 1.7);
    }
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

struct Case {
    img: Tensor,
    txt: Tensor,
    pooled: Tensor,
    height: usize,
    width: usize,
    t: f32,
    g: f32,
}

fn case(cfg: &FluxConfig, seed: u64) -> Case {
    let (height, width, nt) = (3, 4, 5);
    Case {
        img: noise(&[height * width, cfg.in_channels], seed, 1.0),
        txt: noise(&[nt, cfg.context_in_dim], seed + 1, 1.0),
        pooled: noise(&[cfg.vec_in_dim], seed + 2, 1.0),
        height,
        width,
        t: 0.73,
        g: 3.5,
    }
}

fn reference_forward(m: &reference::Flux, c: &Case, guidance: bool) -> Tensor {
    let dev = Device::Cpu;
    let tokens = c.height * c.width;
    let mut ids = Vec::with_capacity(tokens * 3);
    for t in 0..tokens {
        ids.extend_from_slice(&[0f32, (t / c.width) as f32, (t % c.width) as f32]);
    }
    let img_ids = Tensor::from_vec(ids, (1, tokens, 3), &dev).unwrap();
    let nt = c.txt.dim(0).unwrap();
    let txt_ids = Tensor::zeros((1, nt, 3), DType::F32, &dev).unwrap();
    let g = Tensor::new(&[c.g], &dev).unwrap();
    m.forward(
        &c.img.unsqueeze(0).unwrap(),
        &img_ids,
        &c.txt.unsqueeze(0).unwrap(),
        &txt_ids,
        &Tensor::new(&[c.t], &dev).unwrap(),
        &c.pooled.unsqueeze(0).unwrap(),
        if guidance { Some(&g) } else { None },
    )
    .unwrap()
    .squeeze(0)
    .unwrap()
}

fn all_rows<'a>(c: &'a Case, ids: &'a [u32]) -> Rows<'a> {
    Rows {
        x: &c.img,
        ids,
        width: c.width,
        tokens: c.height * c.width,
        cache: None,
        patches: None,
        saliency: true,
        text_cache: None,
    }
}

#[test]
fn full_forward_equals_candle_transformers_flux() {
    for guidance in [true, false] {
        let (ours, theirs, cfg) = random_pair(guidance, 7);
        let c = case(&cfg, 11);
        let want = reference_forward(&theirs, &c, guidance);
        let ctx = ours.context(&c.txt, &c.pooled).unwrap();
        let cond = ours.step_cond(&ctx, c.t, c.g).unwrap();
        let ids: Vec<u32> = (0..(c.height * c.width) as u32).collect();
        let got = ours.forward(all_rows(&c, &ids), &ctx, &cond).unwrap();
        let d = max_diff(&got.velocity, &want);
        assert!(
            d <= TOL,
            "guidance {guidance}: max |ours - reference| = {d}"
        );
        // The output is not trivially small: the comparison means something.
        let scale = want
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            scale > 0.1,
            "reference output too small to compare: {scale}"
        );
        let sal = got.saliency.expect("saliency was asked for");
        assert_eq!(sal.dims(), [12, 5]);
        let sum: f32 = sal.sum_all().unwrap().to_scalar().unwrap();
        assert!(
            sum > 0.0 && sum < 12.0,
            "image->text mass per row is in (0, 1): {sum}"
        );
    }
}

#[test]
fn subset_forward_with_current_cache_equals_the_full_forward_on_its_rows() {
    let (ours, _, cfg) = random_pair(true, 3);
    let c = case(&cfg, 5);
    let ctx = ours.context(&c.txt, &c.pooled).unwrap();
    let cond = ours.step_cond(&ctx, c.t, c.g).unwrap();
    let tokens = c.height * c.width;
    let ids: Vec<u32> = (0..tokens as u32).collect();
    let patch_of: Vec<u32> = (0..tokens as u32)
        .map(|t| t % 4 / 2 + 2 * (t / 8))
        .collect();
    let full = ours
        .forward(
            Rows {
                patches: Some((&patch_of, 4)),
                ..all_rows(&c, &ids)
            },
            &ctx,
            &cond,
        )
        .unwrap();
    let active: Vec<u32> = vec![1, 2, 5, 6, 11];
    let at = Tensor::new(active.as_slice(), &Device::Cpu).unwrap();
    let x = c.img.index_select(&at, 0).unwrap();
    let sub = ours
        .forward(
            Rows {
                x: &x,
                ids: &active,
                width: c.width,
                tokens,
                cache: Some((&full.k, &full.v)),
                patches: Some((&patch_of, 4)),
                saliency: false,
                text_cache: None,
            },
            &ctx,
            &cond,
        )
        .unwrap();
    let d = max_diff(&sub.velocity, &full.velocity.index_select(&at, 0).unwrap());
    assert!(d <= TOL, "velocity rows differ by {d}");
    let d = max_diff(&sub.k, &full.k.index_select(&at, 1).unwrap());
    assert!(d <= TOL, "fresh keys differ by {d}");
    let d = max_diff(&sub.v, &full.v.index_select(&at, 1).unwrap());
    assert!(d <= TOL, "fresh values differ by {d}");
    let fm = full.patch_mass.unwrap().index_select(&at, 0).unwrap();
    let d = max_diff(&sub.patch_mass.unwrap(), &fm);
    assert!(d <= TOL, "patch masses differ by {d}");

    // A stale cache changes the active rows: the cache is really read.
    let stale_k = (&full.k * 1.5).unwrap();
    let stale = ours
        .forward(
            Rows {
                x: &x,
                ids: &active,
                width: c.width,
                tokens,
                cache: Some((&stale_k, &full.v)),
                patches: None,
                saliency: false,
                text_cache: None,
            },
            &ctx,
            &cond,
        )
        .unwrap();
    let d = max_diff(&stale.velocity, &sub.velocity);
    assert!(
        d > 1e-3,
        "a different cache left the output unchanged ({d})"
    );
}

#[test]
fn bad_inputs_are_errors_that_say_what_is_wrong() {
    let (ours, _, cfg) = random_pair(true, 1);
    let c = case(&cfg, 2);
    let ctx = ours.context(&c.txt, &c.pooled).unwrap();
    let cond = ours.step_cond(&ctx, c.t, c.g).unwrap();
    let tokens = c.height * c.width;
    let err = |rows: Rows<'_>| ours.forward(rows, &ctx, &cond).unwrap_err().to_string();
    let ids = [3u32, 1];
    let x = c.img.narrow(0, 0, 2).unwrap();
    let base = Rows {
        x: &x,
        ids: &ids,
        width: c.width,
        tokens,
        cache: None,
        patches: None,
        saliency: false,
        text_cache: None,
    };
    assert!(err(base).contains("ascend"));
    let ids = [1u32, 12];
    assert!(err(Rows { ids: &ids, ..base }).contains("below 12"));
    let ids = [1u32, 2];
    let short = c.img.narrow(0, 0, 1).unwrap();
    assert!(err(Rows {
        ids: &ids,
        x: &short,
        ..base
    })
    .contains("2 x 8"));
    let k = Tensor::zeros((4, tokens, 32), DType::F32, &Device::Cpu).unwrap();
    assert!(err(Rows {
        ids: &ids,
        cache: Some((&k, &k)),
        ..base
    })
    .contains("K/V cache"));
    assert!(ours
        .context(&c.pooled.unsqueeze(0).unwrap(), &c.pooled)
        .unwrap_err()
        .to_string()
        .contains("text states"));
    let bad = FluxConfig {
        axes_dim: [4, 4, 4],
        ..cfg
    };
    let none = |_: &str, _: &[usize]| -> Result<Tensor, ModelError> { unreachable!() };
    assert!(Flux::load(bad, &var_builder_from(none, &Device::Cpu))
        .unwrap_err()
        .to_string()
        .contains("sum to the head width 16"));
}

// ---- checkpoints ----

use flashdiff_models::families::flux::{FluxCheckpoint, FluxLayout};
use flashdiff_models::io::weights::Weights;
use std::path::{Path, PathBuf};

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/flux_golden.safetensors")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-flux-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The golden file's inputs prepared for `model`: (image rows, context, step conditioning,
/// grid width, diffusers' output).
fn golden_inputs(model: &Flux) -> (Tensor, Tensor, Tensor, usize, Tensor) {
    let g = Weights::open(&golden_path()).unwrap();
    let t = |n: &str| {
        let (s, v) = g.get_any(n).unwrap();
        Tensor::from_slice(v, s, &Device::Cpu).unwrap()
    };
    let grid = t("golden.grid").to_vec1::<f32>().unwrap();
    let width = grid[1] as usize;
    let ctx = model
        .context(&t("golden.txt"), &t("golden.pooled"))
        .unwrap();
    let time = t("golden.t").to_vec1::<f32>().unwrap()[0];
    let guid = t("golden.guidance").to_vec1::<f32>().unwrap()[0];
    let cond = model.step_cond(&ctx, time, guid).unwrap();
    (t("golden.img"), ctx, cond, width, t("golden.out"))
}

/// Runs a loaded model on the golden file's inputs; returns (ours, diffusers' output).
fn run_golden(model: &Flux) -> (Tensor, Tensor) {
    let (img, ctx, cond, width, want) = golden_inputs(model);
    let tokens = img.dim(0).unwrap();
    let ids: Vec<u32> = (0..tokens as u32).collect();
    let rows = Rows {
        x: &img,
        ids: &ids,
        width,
        tokens,
        cache: None,
        patches: None,
        saliency: false,
        text_cache: None,
    };
    let got = model.forward(rows, &ctx, &cond).unwrap().velocity;
    (got, want)
}

/// bf16 compute (the path the GPU check runs on CUDA): a bf16
/// checkpoint loaded for bf16 keeps its linear layers in bf16, stays near the same weights
/// computed in f32, and its subset forward with current K/V still equals its full forward.
#[test]
fn bf16_compute_stays_near_f32_and_keeps_the_subset_forward_exact() {
    let p = tmp("golden-bf16-compute.safetensors");
    rewrite(&golden_path(), &p, safetensors::Dtype::BF16, "", None);
    let ck = FluxCheckpoint::open(&p).unwrap();
    let wide = ck.load(Some([4, 6, 6]), &Device::Cpu).unwrap();
    let half = ck
        .load_in(Some([4, 6, 6]), DType::BF16, &Device::Cpu)
        .unwrap();
    assert_eq!(wide.compute_dtype(), DType::F32);
    assert_eq!(half.compute_dtype(), DType::BF16);
    let (w, _) = run_golden(&wide);
    let (h, _) = run_golden(&half);
    let scale = common::max_abs(&w);
    let d = max_diff(&h, &w);
    assert!(
        d > 0.0,
        "bf16 compute gave f32's output bit for bit: not bf16?"
    );
    assert!(
        d <= 0.03 * scale,
        "bf16 compute is {d} from f32 compute (scale {scale})"
    );

    let (img, ctx, cond, width, _) = golden_inputs(&half);
    let tokens = img.dim(0).unwrap();
    let ids: Vec<u32> = (0..tokens as u32).collect();
    let patch_of: Vec<u32> = (0..tokens as u32).map(|t| t % 4).collect();
    let all = Rows {
        x: &img,
        ids: &ids,
        width,
        tokens,
        cache: None,
        patches: Some((&patch_of, 4)),
        saliency: false,
        text_cache: None,
    };
    let full = half.forward(all, &ctx, &cond).unwrap();
    let active: Vec<u32> = vec![0, 3, 4, 9];
    let at = Tensor::new(active.as_slice(), &Device::Cpu).unwrap();
    let x = img.index_select(&at, 0).unwrap();
    let sub = half
        .forward(
            Rows {
                x: &x,
                ids: &active,
                width,
                tokens,
                cache: Some((&full.k, &full.v)),
                patches: Some((&patch_of, 4)),
                saliency: false,
                text_cache: None,
            },
            &ctx,
            &cond,
        )
        .unwrap();
    let d = max_diff(&sub.velocity, &full.velocity.index_select(&at, 0).unwrap());
    assert!(
        d <= TOL * scale.max(1.0),
        "bf16 velocity rows differ by {d}"
    );
    let d = max_diff(&sub.k, &full.k.index_select(&at, 1).unwrap());
    assert!(d <= TOL * scale.max(1.0), "bf16 fresh keys differ by {d}");
    std::fs::remove_file(&p).ok();
}

/// diffusers' own FluxTransformer2DModel (golden file written by
/// `models/reference/flux_golden.py`), loaded through our diffusers-layout mapping.
#[test]
fn diffusers_layout_reproduces_diffusers_flux() {
    let ck = FluxCheckpoint::open(&golden_path()).unwrap();
    assert_eq!(ck.layout(), &FluxLayout::Diffusers);
    let cfg = ck.config(Some([4, 6, 6])).unwrap();
    assert_eq!(
        (cfg.hidden, cfg.heads, cfg.depth, cfg.depth_single),
        (64, 4, 2, 2)
    );
    assert!(cfg.guidance_embed && cfg.qkv_bias);
    let model = ck.load(Some([4, 6, 6]), &Device::Cpu).unwrap();
    let (got, want) = run_golden(&model);
    let scale = want
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let d = max_diff(&got, &want);
    // Outputs reach ~32 here: 1e-4 relative to the largest value.
    assert!(
        d <= TOL * scale.max(1.0),
        "max |ours - diffusers| = {d} (scale {scale})"
    );
}

/// Writes every float tensor of `src` except `drop` to `dst` in `dtype`, reshaping `reshape`.
fn rewrite(
    src: &Path,
    dst: &Path,
    dtype: safetensors::Dtype,
    drop: &str,
    reshape: Option<(&str, Vec<usize>)>,
) {
    let w = Weights::open(src).unwrap();
    let mut names: Vec<&str> = w.names().filter(|n| *n != drop).collect();
    names.sort();
    let mut bufs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for n in names {
        let (s, v) = w.get_any(n).unwrap();
        let mut shape = s.to_vec();
        if let Some((r, to)) = &reshape {
            if n == *r {
                shape = to.clone();
            }
        }
        let bytes: Vec<u8> = match dtype {
            safetensors::Dtype::BF16 => v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
            safetensors::Dtype::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        bufs.push((n.to_string(), shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bufs
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, &None, dst).unwrap();
}

#[test]
fn half_precision_checkpoints_load_in_both_layouts() {
    for (dtype, tol) in [
        (safetensors::Dtype::BF16, 0.05),
        (safetensors::Dtype::F16, 0.01),
    ] {
        let p = tmp(&format!("golden-{dtype:?}.safetensors"));
        rewrite(&golden_path(), &p, dtype, "", None);
        let model = FluxCheckpoint::open(&p)
            .unwrap()
            .load(Some([4, 6, 6]), &Device::Cpu)
            .unwrap();
        let (got, want) = run_golden(&model);
        let scale = want
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let d = max_diff(&got, &want);
        assert!(
            d <= tol * scale,
            "{dtype:?}: max difference {d} against f32's output (scale {scale})"
        );
        assert!(
            d > 0.0,
            "{dtype:?}: rounding the weights changed nothing: not read as {dtype:?}?"
        );
        std::fs::remove_file(&p).ok();
    }
}

/// Black Forest Labs' layout, with and without ComfyUI's `model.diffusion_model.` prefix,
/// equals the model built from the same tensors in memory.
#[test]
fn bfl_layout_loads_with_and_without_prefix() {
    let (ours, _, cfg) = random_pair(true, 9);
    let named = bfl_tensors(true, 9);
    let c = case(&cfg, 4);
    let ctx = ours.context(&c.txt, &c.pooled).unwrap();
    let cond = ours.step_cond(&ctx, c.t, c.g).unwrap();
    let ids: Vec<u32> = (0..12).collect();
    let want = ours
        .forward(all_rows(&c, &ids), &ctx, &cond)
        .unwrap()
        .velocity;
    for prefix in ["", "model.diffusion_model."] {
        let p = tmp(&format!("bfl{}.safetensors", prefix.len()));
        let prefixed: HashMap<String, Tensor> = named
            .iter()
            .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
            .collect();
        candle_core::safetensors::save(&prefixed, &p).unwrap();
        let ck = FluxCheckpoint::open(&p).unwrap();
        assert_eq!(
            ck.layout(),
            &FluxLayout::Bfl {
                prefix: prefix.into()
            }
        );
        let m = ck.load(Some([4, 6, 6]), &Device::Cpu).unwrap();
        let ctx = m.context(&c.txt, &c.pooled).unwrap();
        let cond = m.step_cond(&ctx, c.t, c.g).unwrap();
        let got = m.forward(all_rows(&c, &ids), &ctx, &cond).unwrap().velocity;
        assert_eq!(max_diff(&got, &want), 0.0, "prefix {prefix:?}");
        std::fs::remove_file(&p).ok();
    }
}

/// The tensors `random_pair(guidance, seed)` builds, by Black Forest Labs' name.
fn bfl_tensors(guidance: bool, seed: u64) -> HashMap<String, Tensor> {
    let (_, rcfg) = small(guidance);
    let vm = VarMap::new();
    reference::Flux::new(
        &rcfg,
        VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu),
    )
    .unwrap();
    let data = vm.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.clone(),
                noise(data[n].dims(), seed * 1000 + i as u64, 0.2),
            )
        })
        .collect()
}

#[test]
fn broken_checkpoints_are_errors_that_name_the_problem() {
    let load =
        |p: &Path| FluxCheckpoint::open(p).and_then(|c| c.load(Some([4, 6, 6]), &Device::Cpu));
    // A missing tensor names its key.
    let p = tmp("missing.safetensors");
    rewrite(
        &golden_path(),
        &p,
        safetensors::Dtype::F32,
        "transformer_blocks.1.attn.add_k_proj.weight",
        None,
    );
    let e = load(&p).unwrap_err().to_string();
    assert!(
        e.contains("transformer_blocks.1.attn.add_k_proj.weight"),
        "{e}"
    );
    // A mis-shaped one names its key, the shape found and the shape needed.
    rewrite(
        &golden_path(),
        &p,
        safetensors::Dtype::F32,
        "",
        Some(("proj_out.weight", vec![4, 128])),
    );
    let e = load(&p).unwrap_err().to_string();
    assert!(
        e.contains("proj_out.weight") && e.contains("[4, 128]") && e.contains("[8, 64]"),
        "{e}"
    );
    // A truncated file, a file of garbage, a file that is not FLUX, a missing file.
    let bytes = std::fs::read(golden_path()).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = load(&p).unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    std::fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x7fjunk").unwrap();
    let e = load(&p).unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tinydit/tinydit.safetensors");
    let e = load(&tiny).unwrap_err().to_string();
    assert!(e.contains("is not a FLUX checkpoint"), "{e}");
    let e = load(Path::new("/nonexistent/flux.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read weights"), "{e}");
    // Heads other than 128 need the RoPE axes said.
    let e = FluxCheckpoint::open(&golden_path())
        .unwrap()
        .config(None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("RoPE axes"), "{e}");
    std::fs::remove_file(&p).ok();
}

/// A diffusers model folder: `transformer/` with the weights in two shards.
#[test]
fn a_sharded_diffusers_folder_loads() {
    let dir = tmp("folder");
    let tdir = dir.join("transformer");
    std::fs::create_dir_all(&tdir).unwrap();
    let w = Weights::open(&golden_path()).unwrap();
    let mut names: Vec<&str> = w.names().filter(|n| !n.starts_with("golden.")).collect();
    names.sort();
    for (i, half) in names.chunks(names.len() / 2 + 1).enumerate() {
        let map: HashMap<String, Tensor> = half
            .iter()
            .map(|n| {
                let (s, v) = w.get_any(n).unwrap();
                (
                    n.to_string(),
                    Tensor::from_slice(v, s, &Device::Cpu).unwrap(),
                )
            })
            .collect();
        candle_core::safetensors::save(
            &map,
            tdir.join(format!(
                "diffusion_pytorch_model-0000{i}-of-00002.safetensors"
            )),
        )
        .unwrap();
    }
    let m = FluxCheckpoint::open(&dir)
        .unwrap()
        .load(Some([4, 6, 6]), &Device::Cpu)
        .unwrap();
    let (got, want) = run_golden(&m);
    let scale = want
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(max_diff(&got, &want) <= TOL * scale.max(1.0));
    std::fs::remove_dir_all(&dir).ok();
}

/// With the text stream's K/V cached from a forward at the same step, a subset forward
/// computes no text rows and still equals the full forward on its rows; a cache from
/// another time changes them (the cache is what the text contributes).
#[test]
fn a_current_text_cache_leaves_the_subset_forward_exact() {
    let (ours, _, cfg) = random_pair(true, 21);
    let c = case(&cfg, 22);
    let ctx = ours.context(&c.txt, &c.pooled).unwrap();
    let cond = ours.step_cond(&ctx, c.t, c.g).unwrap();
    let ids: Vec<u32> = (0..12).collect();
    let full = ours.forward(all_rows(&c, &ids), &ctx, &cond).unwrap();
    let (tk, tv) = full
        .text_kv
        .as_ref()
        .expect("the full forward computed the text");
    assert_eq!(tk.dims(), [cfg.kv_layers(), 5, cfg.hidden]);
    let active = vec![0u32, 7, 8];
    let at = Tensor::new(active.as_slice(), &Device::Cpu).unwrap();
    let x = c.img.index_select(&at, 0).unwrap();
    let rows = Rows {
        x: &x,
        ids: &active,
        width: c.width,
        tokens: 12,
        cache: Some((&full.k, &full.v)),
        patches: None,
        saliency: true,
        text_cache: Some((tk, tv)),
    };
    let sub = ours.forward(rows, &ctx, &cond).unwrap();
    assert!(
        sub.text_kv.is_none(),
        "a cached text stream is not recomputed"
    );
    let d = max_diff(&sub.velocity, &full.velocity.index_select(&at, 0).unwrap());
    assert!(d <= TOL, "velocity rows differ by {d}");
    let fs = full.saliency.unwrap().index_select(&at, 0).unwrap();
    assert!(max_diff(&sub.saliency.unwrap(), &fs) <= TOL);
    let later = ours.step_cond(&ctx, 0.2, c.g).unwrap();
    let other = ours.forward(all_rows(&c, &ids), &ctx, &later).unwrap();
    let (ok, ov) = other.text_kv.as_ref().unwrap();
    let stale = ours
        .forward(
            Rows {
                text_cache: Some((ok, ov)),
                ..rows
            },
            &ctx,
            &cond,
        )
        .unwrap();
    assert!(max_diff(&stale.velocity, &sub.velocity) > 1e-3);
    let short = tk.narrow(1, 0, 4).unwrap();
    let e = ours
        .forward(
            Rows {
                text_cache: Some((&short, &short)),
                ..rows
            },
            &ctx,
            &cond,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("text K/V cache must be [4, 5, 64]"), "{e}");
}
