//! Stable Audio Open's DiT against diffusers' own StableAudioDiTModel (golden file written by
//! `models/reference/sao_golden.py` on random weights of a small config with the real
//! structure), and its token-subset forward against the full one.

use candle_core::{Device, Tensor};
use flashdiff_models::families::sao::{Rows, Sao, SaoConfig};
use flashdiff_models::io::shards::var_builder_from;

mod common;
use common::{max_abs, max_diff, t};

const TOL: f32 = 1e-4;

fn config() -> SaoConfig {
    SaoConfig {
        in_channels: 8,
        out_channels: 8,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        depth: 2,
        cross_dim: 24,
        cross_in: 12,
        global_in: 20,
        time_proj_dim: 32,
    }
}

#[test]
fn full_forward_equals_diffusers_and_the_subset_forward_equals_its_rows() {
    let w = common::golden("sao_golden");
    let m = Sao::load(config(), &common::vb(&w)).unwrap();
    let ctx = m
        .context(&t(&w, "golden.enc"), &t(&w, "golden.global"))
        .unwrap();
    let time = t(&w, "golden.t").to_vec1::<f32>().unwrap()[0];
    let cond = m.step_cond(&ctx, time).unwrap();
    let x = t(&w, "golden.x");
    let frames = x.dim(0).unwrap();
    let ids: Vec<u32> = (0..frames as u32).collect();
    let patch_of: Vec<u32> = (0..frames as u32).map(|f| f / 3).collect();
    let base = Rows {
        x: &x,
        ids: &ids,
        width: frames,
        tokens: frames,
        cache: None,
        patches: Some((&patch_of, 4)),
        saliency: true,
        text_cache: None,
    };
    let full = m.forward(base, &ctx, &cond).unwrap();
    let want = t(&w, "golden.out");
    let scale = max_abs(&want);
    let d = max_diff(&full.velocity, &want);
    assert!(scale > 1.0, "output too small to compare ({scale})");
    assert!(
        d <= TOL * scale,
        "max |ours - diffusers| = {d} (largest output {scale})"
    );
    let sal = full.saliency.as_ref().unwrap();
    assert_eq!(sal.dims(), [frames, 5]);
    let sum: f32 = sal.sum_all().unwrap().to_scalar().unwrap();
    assert!(
        (sum - frames as f32).abs() < 1e-3,
        "cross-attention rows sum to 1: {sum}"
    );

    let active = vec![1u32, 2, 6, 9];
    let at = Tensor::new(active.as_slice(), &Device::Cpu).unwrap();
    let xs = x.index_select(&at, 0).unwrap();
    let rows = Rows {
        x: &xs,
        ids: &active,
        cache: Some((&full.k, &full.v)),
        saliency: false,
        ..base
    };
    let sub = m.forward(rows, &ctx, &cond).unwrap();
    let d = max_diff(&sub.velocity, &full.velocity.index_select(&at, 0).unwrap());
    assert!(d <= TOL * scale, "velocity rows differ by {d}");
    assert!(max_diff(&sub.k, &full.k.index_select(&at, 1).unwrap()) <= TOL * max_abs(&full.k));
    let fm = full.patch_mass.unwrap().index_select(&at, 0).unwrap();
    assert!(max_diff(&sub.patch_mass.unwrap(), &fm) <= TOL);
    let stale = (&full.v * 0.5).unwrap();
    let moved = m
        .forward(
            Rows {
                cache: Some((&full.k, &stale)),
                ..rows
            },
            &ctx,
            &cond,
        )
        .unwrap();
    assert!(
        max_diff(&moved.velocity, &sub.velocity) > 1e-3,
        "the cache is read"
    );
}

#[test]
fn bad_configs_weights_and_inputs_are_errors_that_say_why() {
    let w = common::golden("sao_golden");
    let get = |n: &str, s: &[usize]| Ok(w.tensor(n, s, &Device::Cpu)?);
    let e = Sao::load(
        SaoConfig {
            kv_heads: 3,
            ..config()
        },
        &var_builder_from(get, &Device::Cpu),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("4 heads cannot share 3"), "{e}");
    let e = Sao::load(
        SaoConfig {
            cross_dim: 16,
            ..config()
        },
        &var_builder_from(get, &Device::Cpu),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("transformer_blocks.0.attn2.to_k.weight") || e.contains("cross_attention_proj"),
        "{e}"
    );
    let m = Sao::load(config(), &var_builder_from(get, &Device::Cpu)).unwrap();
    let g = t(&w, "golden.global");
    let e = m
        .context(&g.unsqueeze(0).unwrap(), &g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("text states"), "{e}");
    let ctx = m.context(&t(&w, "golden.enc"), &g).unwrap();
    let x = t(&w, "golden.x");
    let ids: Vec<u32> = (0..10).collect();
    let rows = Rows {
        x: &x,
        ids: &ids,
        width: 10,
        tokens: 10,
        cache: None,
        patches: None,
        saliency: false,
        text_cache: None,
    };
    let e = m.forward(rows, &ctx, &g).unwrap_err().to_string();
    assert!(e.contains("step conditioning"), "{e}");
}

/// Runs a loaded DiT on the golden inputs (every frame); its velocity.
fn golden_velocity(m: &Sao, w: &flashdiff_models::io::weights::Weights) -> Tensor {
    let ctx = m
        .context(&t(w, "golden.enc"), &t(w, "golden.global"))
        .unwrap();
    let time = t(w, "golden.t").to_vec1::<f32>().unwrap()[0];
    let cond = m.step_cond(&ctx, time).unwrap();
    let x = t(w, "golden.x");
    let frames = x.dim(0).unwrap();
    let ids: Vec<u32> = (0..frames as u32).collect();
    let rows = Rows {
        x: &x,
        ids: &ids,
        width: frames,
        tokens: frames,
        cache: None,
        patches: None,
        saliency: false,
        text_cache: None,
    };
    m.forward(rows, &ctx, &cond).unwrap().velocity
}

/// `SaoCheckpoint` reads diffusers' names and stable-audio-tools' (`sao_official.safetensors`,
/// written from the golden weights by `models/reference/sao_official.py`: fused Q/K/V and
/// K/V, `gamma`/`beta` norms, an n x 1 Fourier matrix), sizes from the shapes, and both
/// reproduce diffusers' output; bf16 compute stays near it.
#[test]
fn both_checkpoint_layouts_reproduce_diffusers() {
    use flashdiff_models::families::sao::{SaoCheckpoint, SaoLayout};
    let w = common::golden("sao_golden");
    let want = t(&w, "golden.out");
    for (file, layout) in [
        ("sao_golden", SaoLayout::Diffusers),
        ("sao_official", SaoLayout::Official),
    ] {
        let ck = SaoCheckpoint::open(&common::reference(file)).unwrap();
        assert_eq!(ck.layout(), &layout);
        assert_eq!(
            ck.config(16).unwrap(),
            config(),
            "{file}: sizes from the shapes"
        );
        let m = ck.load(16, candle_core::DType::F32, &Device::Cpu).unwrap();
        let d = max_diff(&golden_velocity(&m, &w), &want);
        assert!(d <= TOL * max_abs(&want), "{file}: {d}");
        let h = ck.load(16, candle_core::DType::BF16, &Device::Cpu).unwrap();
        let d = max_diff(&golden_velocity(&h, &w), &want);
        assert!(d > 0.0 && d <= 0.03 * max_abs(&want), "{file} in bf16: {d}");
    }
    let e = SaoCheckpoint::open(&common::reference("flux_golden"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a Stable Audio DiT checkpoint"), "{e}");
    let ck = SaoCheckpoint::open(&common::reference("sao_official")).unwrap();
    let e = ck.config(7).unwrap_err().to_string();
    assert!(e.contains("whole heads of 7"), "{e}");
}
