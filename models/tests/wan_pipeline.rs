//! Wan2.1 as a pipeline: umT5 with its padding masked, the video grid the VAE's
//! packing implies, the shifted schedule and guidance, on the small random pipeline.

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device};
use flashdiff_models::encoders::text::TextTokenizer;
use flashdiff_models::encoders::umt5::Umt5Encoder;
use flashdiff_models::families::flux::PromptEncoder;
use flashdiff_models::families::joint::denoiser::Schedule;
use flashdiff_models::pipelines::wan::{WanText, WAN_TOKENS};
use flashdiff_models::pipelines::{self as pipeline, tiny, PipelineOptions, VIDEO};
use flashdiff_models::Kind;

use common::{max_abs, max_diff};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-wan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    tiny::write_wan(&d).unwrap();
    d
}

#[test]
fn umt5_states_mask_the_padding() {
    let d = scratch("text");
    let text = WanText::load(&d, DType::F32, &Device::Cpu).unwrap();
    let e = text.encode("a red fox running in the snow").unwrap();
    assert_eq!(e.states.dims(), [WAN_TOKENS, 16]);
    assert_eq!(text.tokens(), WAN_TOKENS);
    let tok = TextTokenizer::open(&d.join("tokenizer"), WAN_TOKENS, "<pad>").unwrap();
    let (ids, _) = tok
        .encode_unpadded("a red fox running in the snow")
        .unwrap();
    let k = ids.len();
    let enc = Umt5Encoder::open(&d.join("text_encoder"), DType::F32, &Device::Cpu).unwrap();
    let alone = enc.forward(&ids).unwrap();
    assert!(max_abs(&alone) > 0.0);
    assert_eq!(max_diff(&e.states.narrow(0, 0, k).unwrap(), &alone), 0.0);
    let pad = e.states.narrow(0, k, WAN_TOKENS - k).unwrap();
    assert_eq!(max_abs(&pad), 0.0, "padding rows must be zero");
    std::fs::remove_dir_all(&d).ok();
}

fn opts(w: usize, h: usize, frames: Option<usize>) -> PipelineOptions {
    PipelineOptions {
        frames,
        ..PipelineOptions::new((h, w))
    }
}

#[test]
fn the_pipeline_is_a_video_denoiser_on_the_latent_grid() {
    let d = scratch("pipe");
    let m = pipeline::load(VIDEO, &d, &opts(64, 48, Some(9)), &Device::Cpu).unwrap();
    assert_eq!(m.kind(), Kind::Video);
    let g = m.dims().grid;
    assert_eq!(
        (g.frames, g.height, g.width),
        (3, 3, 4),
        "9 frames -> 3 latent frames; 48 x 64 pixels -> 3 x 4 tokens"
    );
    // Guided at 5.0 by default: the step conditioning holds both passes (7 rows of 24 each).
    assert_eq!(m.dims().cond_len, 2 * 7 * 24);
    let s = Schedule::Shift(3.0);
    for n in [0, 5, 11, 12] {
        assert_eq!(m.time(n, 12), s.time(n, 12, 36), "step {n}: flow_shift 3");
    }
    let c = m.condition("a red fox running in the snow").unwrap();
    assert_eq!(c.words, ["a", "red", "fox", "running", "in", "the", "snow"]);
    // Wan's VAE: 1 + 4 (3 - 1) frames of 8 pixels a latent pixel, RGB in [0, 1].
    let sample = m.decode(&vec![0.3; 36 * 16]).unwrap();
    assert_eq!((sample.frames, sample.width, sample.height), (9, 64, 48));
    assert!(sample.rgb.iter().all(|v| (0.0..=1.0).contains(v)));
    // Without vae/ the latent preview: one frame a latent frame, 2 x 2 pixels a token.
    let vae = d.join("vae");
    std::fs::rename(&vae, d.join("vae.off")).unwrap();
    let preview = pipeline::load(VIDEO, &d, &opts(64, 48, Some(9)), &Device::Cpu)
        .unwrap()
        .decode(&vec![0.3; 36 * 16])
        .unwrap();
    assert_eq!((preview.frames, preview.width, preview.height), (3, 8, 6));
    std::fs::rename(d.join("vae.off"), &vae).unwrap();
    let err = |o: PipelineOptions| {
        pipeline::load(VIDEO, &d, &o, &Device::Cpu)
            .unwrap_err()
            .to_string()
    };
    assert!(err(opts(64, 48, Some(10))).contains("1 + 4k frames"));
    assert!(err(opts(60, 48, None)).contains("multiple of 16"));
    assert!(err(PipelineOptions {
        seconds: Some(1.0),
        ..opts(64, 48, None)
    })
    .contains("makes video"));
    // The scheduler's flow_shift is read; a broken file is an error naming it.
    let sched = d.join("scheduler/scheduler_config.json");
    std::fs::write(&sched, r#"{"flow_shift": 5.0}"#).unwrap();
    let m5 = pipeline::load(VIDEO, &d, &opts(64, 48, Some(9)), &Device::Cpu).unwrap();
    assert_eq!(m5.time(4, 12), Schedule::Shift(5.0).time(4, 12, 36));
    assert_ne!(m5.time(4, 12), m.time(4, 12));
    std::fs::write(&sched, "{flow_shift").unwrap();
    assert!(err(opts(64, 48, None)).contains("scheduler_config.json"));
    std::fs::remove_file(&sched).unwrap();
    assert_eq!(
        pipeline::load(VIDEO, &d, &opts(64, 48, Some(9)), &Device::Cpu)
            .unwrap()
            .time(4, 12),
        m.time(4, 12),
        "no scheduler config: flow_shift 3"
    );
    let e = pipeline::load("sd3", &d, &opts(64, 48, Some(9)), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a frame count applies to wan2.1"), "{e}");
    std::fs::remove_dir_all(&d).ok();
}
