//! Stable Audio Open's VAE decoder (Oobleck) against diffusers' `AutoencoderOobleck` on a
//! small random configuration with the released structure (golden files written by
//! `models/reference/oobleck_golden.py`), in diffusers' layout and in stable-audio-tools'.

mod common;

use candle_core::Device;
use flashdiff_models::decoders::oobleck::{official_name, Oobleck, OobleckConfig};
use flashdiff_models::io::shards::var_builder_from;
use flashdiff_models::io::weights::Weights;

use common::{max_abs, max_diff, t};

fn config() -> OobleckConfig {
    OobleckConfig {
        decoder_channels: 4,
        decoder_input_channels: 6,
        audio_channels: 2,
        downsampling_ratios: vec![2, 2, 4, 2, 2],
        channel_multiples: vec![1, 2, 2, 3, 4],
        sampling_rate: 8000,
    }
}

type Names<'a> = dyn Fn(&str, &[usize]) -> (String, Vec<usize>) + Sync + 'a;

fn load(w: &Weights, name: &Names) -> Oobleck {
    Oobleck::load(
        config(),
        &var_builder_from(
            |n: &str, s: &[usize]| {
                let (key, shape) = name(n, s);
                Ok(w.tensor(&key, &shape, &Device::Cpu)?.reshape(s)?)
            },
            &Device::Cpu,
        ),
    )
    .unwrap()
}

#[test]
fn decoder_equals_diffusers_in_both_layouts() {
    let g = common::golden("oobleck_golden");
    let z = t(&g, "golden.z");
    let want = t(&g, "golden.audio");
    assert_eq!(want.dims(), [2, 5 * 64], "hop 64 samples a frame");
    let m = load(&g, &|n, s| (n.to_string(), s.to_vec()));
    assert_eq!(m.config().hop(), 64);
    let got = m.decode(&z).unwrap();
    let d = max_diff(&got, &want);
    assert!(
        d <= 1e-4 * max_abs(&want),
        "max |ours - diffusers| = {d} (scale {})",
        max_abs(&want)
    );
    // The released single file's names, Snake parameters 1-D there.
    let o = common::golden("oobleck_official");
    let m = load(&o, &|n, s| {
        let key = official_name(n, 5);
        let shape = if n.ends_with(".alpha") || n.ends_with(".beta") {
            vec![s[1]]
        } else {
            s.to_vec()
        };
        (key, shape)
    });
    let d = max_diff(&m.decode(&z).unwrap(), &want);
    assert!(d <= 1e-4 * max_abs(&want), "official layout: {d}");
}

#[test]
fn official_names_follow_stable_audio_tools() {
    assert_eq!(
        official_name("decoder.conv1.weight_g", 5),
        "pretransform.model.decoder.layers.0.weight_g"
    );
    assert_eq!(
        official_name("decoder.block.0.conv_t1.bias", 5),
        "pretransform.model.decoder.layers.1.layers.1.bias"
    );
    assert_eq!(
        official_name("decoder.block.4.res_unit3.snake2.alpha", 5),
        "pretransform.model.decoder.layers.5.layers.4.layers.2.alpha"
    );
    assert_eq!(
        official_name("decoder.snake1.beta", 5),
        "pretransform.model.decoder.layers.6.beta"
    );
    assert_eq!(
        official_name("decoder.conv2.weight_v", 5),
        "pretransform.model.decoder.layers.7.weight_v"
    );
}

#[test]
fn bad_latents_and_configs_are_errors() {
    let g = common::golden("oobleck_golden");
    let m = load(&g, &|n, s| (n.to_string(), s.to_vec()));
    let z = candle_core::Tensor::zeros((5, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let e = m.decode(&z).unwrap_err().to_string();
    assert!(e.contains("6 x frames"), "{e}");
    let bad = OobleckConfig {
        channel_multiples: vec![1, 2],
        ..config()
    };
    let e = Oobleck::load(bad, &common::vb(&g)).unwrap_err().to_string();
    assert!(e.contains("as many strides"), "{e}");
    // A missing tensor names itself.
    let e = Oobleck::load(
        config(),
        &var_builder_from(
            |n: &str, s: &[usize]| {
                if n.contains("res_unit2.conv1.weight_g") {
                    Err(flashdiff_models::io::weights::WeightsError::Missing(n.into()).into())
                } else {
                    Ok(g.tensor(n, s, &Device::Cpu)?)
                }
            },
            &Device::Cpu,
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("res_unit2.conv1.weight_g"), "{e}");
}
