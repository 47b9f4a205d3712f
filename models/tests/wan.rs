//! Wan2.1's transformer against diffusers' own WanTransformer3DModel (golden file written by
//! `models/reference/wan_golden.py` on random weights of a small config with the real
//! structure), and its token-subset forward against the full one.

use std::path::Path;

use candle_core::{Device, Tensor};
use flashdiff_models::families::wan::{Rows, Wan, WanConfig};
use flashdiff_models::io::shards::var_builder_from;
use flashdiff_models::io::weights::Weights;

mod common;
use common::{max_abs, max_diff, t};

const TOL: f32 = 1e-4;

fn config() -> WanConfig {
    WanConfig {
        patch: [1, 2, 2],
        in_channels: 4,
        out_channels: 4,
        heads: 2,
        head_dim: 12,
        depth: 2,
        ffn_dim: 64,
        text_dim: 16,
        freq_dim: 32,
        cross_attn_norm: true,
    }
}

#[test]
fn full_forward_equals_diffusers_and_the_subset_forward_equals_its_rows() {
    let w = common::golden("wan_golden");
    let m = Wan::load(config(), &common::vb(&w)).unwrap();
    assert_eq!(m.config().axes_dim(), [4, 4, 4]);
    let ctx = m.context(&t(&w, "golden.txt")).unwrap();
    let time = t(&w, "golden.t").to_vec1::<f32>().unwrap()[0];
    let cond = m.step_cond(time, &Device::Cpu).unwrap();
    let grid = t(&w, "golden.grid").to_vec1::<f32>().unwrap();
    let (frames, width) = (grid[0] as usize, grid[2] as usize);
    let x = t(&w, "golden.x");
    let tokens = x.dim(0).unwrap();
    let ids: Vec<u32> = (0..tokens as u32).collect();
    let patch_of: Vec<u32> = (0..tokens as u32).map(|i| i / 6).collect();
    let base = Rows {
        x: &x,
        ids: &ids,
        width,
        tokens,
        cache: None,
        patches: Some((&patch_of, 3)),
        saliency: true,
        text_cache: None,
    };
    let full = m.forward(base, frames, &ctx, &cond).unwrap();
    let want = t(&w, "golden.out");
    let scale = max_abs(&want);
    let d = max_diff(&full.velocity, &want);
    assert!(scale > 1.0, "output too small to compare ({scale})");
    assert!(
        d <= TOL * scale,
        "max |ours - diffusers| = {d} (largest output {scale})"
    );
    assert_eq!(full.saliency.as_ref().unwrap().dims(), [tokens, 5]);

    // Tokens of the middle frame and one of the last: positions in all three axes matter.
    let active = vec![6u32, 7, 10, 16];
    let at = Tensor::new(active.as_slice(), &Device::Cpu).unwrap();
    let xs = x.index_select(&at, 0).unwrap();
    let rows = Rows {
        x: &xs,
        ids: &active,
        cache: Some((&full.k, &full.v)),
        saliency: false,
        ..base
    };
    let sub = m.forward(rows, frames, &ctx, &cond).unwrap();
    let d = max_diff(&sub.velocity, &full.velocity.index_select(&at, 0).unwrap());
    assert!(d <= TOL * scale, "velocity rows differ by {d}");
    let fm = full.patch_mass.unwrap().index_select(&at, 0).unwrap();
    assert!(max_diff(&sub.patch_mass.unwrap(), &fm) <= TOL);
    let stale = (&full.k * 1.5).unwrap();
    let moved = m
        .forward(
            Rows {
                cache: Some((&stale, &full.v)),
                ..rows
            },
            frames,
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
fn bad_configs_and_inputs_are_errors_that_say_why() {
    let w = common::golden("wan_golden");
    let get = |n: &str, s: &[usize]| Ok(w.tensor(n, s, &Device::Cpu)?);
    let e = Wan::load(
        WanConfig {
            head_dim: 9,
            ..config()
        },
        &var_builder_from(get, &Device::Cpu),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("odd RoPE axes"), "{e}");
    let e = Wan::load(
        WanConfig {
            ffn_dim: 32,
            ..config()
        },
        &var_builder_from(get, &Device::Cpu),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("blocks.0.ffn.net.0.proj.weight"), "{e}");
    let m = Wan::load(config(), &var_builder_from(get, &Device::Cpu)).unwrap();
    let e = m.context(&t(&w, "golden.t")).unwrap_err().to_string();
    assert!(e.contains("text states must be n x 16"), "{e}");
    let ctx = m.context(&t(&w, "golden.txt")).unwrap();
    let cond = m.step_cond(500.0, &Device::Cpu).unwrap();
    let x = t(&w, "golden.x");
    let ids: Vec<u32> = (0..18).collect();
    let rows = Rows {
        x: &x,
        ids: &ids,
        width: 3,
        tokens: 18,
        cache: None,
        patches: None,
        saliency: false,
        text_cache: None,
    };
    let e = m.forward(rows, 4, &ctx, &cond).unwrap_err().to_string();
    assert!(e.contains("not 4 equal frames"), "{e}");
    let e = m.forward(rows, 3, &ctx, &ctx).unwrap_err().to_string();
    assert!(e.contains("step conditioning"), "{e}");
}

/// Both layouts through `WanCheckpoint`, sizes read from the shapes (heads said): diffusers'
/// files, and Wan-AI's own (written by `wan_golden.py` and checked there by converting it
/// back with diffusers' own converter), also under ComfyUI's prefix.
#[test]
fn both_checkpoint_layouts_reproduce_diffusers() {
    use flashdiff_models::families::wan::{WanCheckpoint, WanLayout};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference");
    let tmp =
        std::env::temp_dir().join(format!("flashdiff-wan-{}.safetensors", std::process::id()));
    let off = Weights::open(&dir.join("wan_official.safetensors")).unwrap();
    let prefixed: std::collections::HashMap<String, Tensor> = off
        .names()
        .map(|n| (format!("model.diffusion_model.{n}"), t(&off, n)))
        .collect();
    candle_core::safetensors::save(&prefixed, &tmp).unwrap();
    let w = common::golden("wan_golden");
    let want = t(&w, "golden.out");
    for (path, layout) in [
        (dir.join("wan_golden.safetensors"), WanLayout::Diffusers),
        (
            dir.join("wan_official.safetensors"),
            WanLayout::Official {
                prefix: String::new(),
            },
        ),
        (
            tmp.clone(),
            WanLayout::Official {
                prefix: "model.diffusion_model.".into(),
            },
        ),
    ] {
        let ck = WanCheckpoint::open(&path).unwrap();
        assert_eq!(ck.layout(), &layout);
        assert_eq!(ck.config(Some(2)).unwrap(), config(), "{layout:?}");
        let m = ck.load(Some(2), &Device::Cpu).unwrap();
        let ctx = m.context(&t(&w, "golden.txt")).unwrap();
        let cond = m.step_cond(730.0, &Device::Cpu).unwrap();
        let x = t(&w, "golden.x");
        let ids: Vec<u32> = (0..18).collect();
        let rows = Rows {
            x: &x,
            ids: &ids,
            width: 3,
            tokens: 18,
            cache: None,
            patches: None,
            saliency: false,
            text_cache: None,
        };
        let got = m.forward(rows, 3, &ctx, &cond).unwrap().velocity;
        let d = max_diff(&got, &want);
        assert!(
            d <= TOL * max_abs(&want),
            "{layout:?}: max |ours - diffusers| = {d}"
        );
    }
    std::fs::remove_file(&tmp).ok();
    let e = WanCheckpoint::open(&dir.join("sd3_golden.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a Wan checkpoint"), "{e}");
    let e = WanCheckpoint::open(&dir.join("wan_golden.safetensors"))
        .unwrap()
        .config(Some(5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a multiple of 5 heads"), "{e}");
}
