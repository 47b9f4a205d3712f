//! Wan2.1's text encoder (umT5) against transformers' `UMT5EncoderModel` on a small random
//! configuration (golden file from `models/reference/umt5_golden.py`).

mod common;

use candle_core::{DType, Device};
use flashdiff_models::encoders::umt5::{Umt5Config, Umt5Encoder};
use flashdiff_models::io::shards::var_builder_from;

use common::{max_abs, max_diff, t};

fn config() -> Umt5Config {
    serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/umt5_golden.json"),
        )
        .unwrap(),
    )
    .unwrap()
}

#[test]
fn encoder_equals_transformers_umt5() {
    let g = common::golden("umt5_golden");
    let cfg = config();
    assert_eq!(
        (cfg.num_layers, cfg.relative_attention_num_buckets),
        (3, 16)
    );
    let m = Umt5Encoder::load(cfg, &common::vb(&g), &Device::Cpu).unwrap();
    let ids: Vec<u32> = g
        .get_i64("golden.ids")
        .unwrap()
        .iter()
        .map(|&i| i as u32)
        .collect();
    assert_eq!(ids.len(), 41, "positions reach the logarithmic buckets");
    let want = t(&g, "golden.out");
    let got = m.forward(&ids).unwrap();
    let d = max_diff(&got, &want);
    assert!(
        d <= 1e-4 * max_abs(&want),
        "max |ours - transformers| = {d} (scale {})",
        max_abs(&want)
    );
    let e = m.forward(&[3, 64]).unwrap_err().to_string();
    assert!(
        e.contains("token id 64") && e.contains("vocabulary of 64"),
        "{e}"
    );
}

/// In bf16 (the released umT5-XXL's dtype) the states stay close.
#[test]
fn bf16_encoder_stays_near_f32() {
    let g = common::golden("umt5_golden");
    let get = |dtype: DType| {
        Umt5Encoder::load(
            config(),
            &var_builder_from(
                |n: &str, s: &[usize]| {
                    let w = g.tensor(n, s, &Device::Cpu)?;
                    let lin = s.len() == 2 && !n.contains("relative") && n != "shared.weight";
                    Ok(if lin { w.to_dtype(dtype)? } else { w })
                },
                &Device::Cpu,
            ),
            &Device::Cpu,
        )
        .unwrap()
    };
    let ids: Vec<u32> = (0..30).map(|i| (i * 7 % 64) as u32).collect();
    let (a, b) = (
        get(DType::F32).forward(&ids).unwrap(),
        get(DType::BF16).forward(&ids).unwrap(),
    );
    let d = max_diff(&a, &b);
    assert!(d > 0.0 && d <= 0.05 * max_abs(&a), "bf16 is {d} from f32");
}
