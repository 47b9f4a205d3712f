//! FLUX.1's transformer against candle-transformers' own, unmodified implementation, on
//! random weights of a small config with the real structure (#12 item 5a), and the
//! token-subset forward against the full one (5b).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::flux::model as reference;
use candle_transformers::models::flux::WithForward;
use flashdiff_models::flux::{Flux, FluxConfig, Rows};
use flashdiff_models::ModelError;

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
    let ours = Flux::load(cfg.clone(), &get).expect("ours loads the same tensors");
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

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
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
    assert!(Flux::load(bad, &none)
        .unwrap_err()
        .to_string()
        .contains("sum to the head width 16"));
}
