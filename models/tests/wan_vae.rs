//! Wan2.1's VAE decoder against diffusers' `AutoencoderKLWan` on a small random
//! configuration with the released structure (golden file from
//! `models/reference/wan_vae_golden.py`): 3 latent frames to 9 video frames.

mod common;

use candle_core::Device;
use flashdiff_models::decoders::wan_vae::{WanVae, WanVaeConfig};

use common::{max_diff, t};

fn config() -> WanVaeConfig {
    serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("reference/wan_vae_golden.json"),
        )
        .unwrap(),
    )
    .unwrap()
}

#[test]
fn decoder_equals_diffusers_wan_vae() {
    let g = common::golden("wan_vae_golden");
    let m = WanVae::load(config(), &common::vb(&g)).unwrap();
    let want = t(&g, "golden.video");
    assert_eq!(
        want.dims(),
        [3, 9, 32, 40],
        "1 + 4 (3 - 1) frames, 8x the latent's pixels"
    );
    let got = m.decode(&t(&g, "golden.z")).unwrap();
    let d = max_diff(&got, &want);
    assert!(d <= 1e-4, "max |ours - diffusers| = {d}");
    let z =
        candle_core::Tensor::zeros((3, 2, 4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let e = m.decode(&z).unwrap_err().to_string();
    assert!(e.contains("4 x frames"), "{e}");
    let bad = WanVaeConfig {
        latents_std: vec![1.0; 3],
        ..config()
    };
    let e = WanVae::load(bad, &common::vb(&g)).unwrap_err().to_string();
    assert!(e.contains("one value per latent channel"), "{e}");
}
