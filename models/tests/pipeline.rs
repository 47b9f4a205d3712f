//! The FLUX pipeline (#12 items 3 and 5d): tokenizer files, candle-transformers' text
//! encoders and VAE read through our checkpoint reader, the sampling schedules, decoding, and
//! the errors a wrong folder gets. On the small random pipeline `pipeline::tiny` writes.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::t5;
use flashdiff_models::joint_denoiser::Schedule;
use flashdiff_models::pieces::words_from_pieces;
use flashdiff_models::pipeline::{self, tiny, PipelineOptions, TextTokenizer, Vae};
use flashdiff_models::Denoiser;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-pipe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(w: usize, h: usize) -> PipelineOptions {
    PipelineOptions {
        size: (h, w),
        guidance: None,
    }
}

#[test]
fn t5_pieces_become_words_and_clip_bpe_applies_its_merges() {
    let d = scratch("tok");
    tiny::write_flux(&d, true).unwrap();
    let t5 = TextTokenizer::open(&d.join("tokenizer_2"), 12, "<pad>").unwrap();
    let (ids, pieces) = t5.encode("a red dishwasher").unwrap();
    assert_eq!(ids.len(), 12);
    assert_eq!(
        &pieces[..6],
        &[
            "\u{2581}a",
            "\u{2581}red",
            "\u{2581}dish",
            "washer",
            "</s>",
            "<pad>"
        ]
    );
    let w = words_from_pieces(&pieces);
    assert_eq!(w.words, ["a", "red", "dishwasher"]);
    assert_eq!(ids[5], 0, "padding is <pad>, id 0");
    // CLIP from vocab.json + merges.txt: lower case, merges, `</w>` at word ends.
    let clip = TextTokenizer::open(&d.join("tokenizer"), 10, "<|endoftext|>").unwrap();
    let (_, pieces) = clip.encode("A  Red blue!").unwrap();
    assert_eq!(
        &pieces[..7],
        &[
            "<|startoftext|>",
            "a</w>",
            "red</w>",
            "blue</w>",
            "!</w>",
            "<|endoftext|>",
            "<|endoftext|>"
        ]
    );
    let e = t5.encode(&["a"; 20].join(" ")).unwrap_err().to_string();
    assert!(e.contains("21 tokens") && e.contains("at most 12"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn encoders_read_through_our_checkpoint_reader_equal_candles_own_loader() {
    let d = scratch("enc");
    tiny::write_flux(&d, true).unwrap();
    let m = pipeline::load("flux-dev", &d, &opts(64, 48), &Device::Cpu).unwrap();
    let c = m.condition("a red dishwasher").unwrap();
    assert_eq!(c.words, ["a", "red", "dishwasher"]);
    // T5 through candle's own safetensors loader, on the same ids.
    let dir = d.join("text_encoder_2");
    let cfg: t5::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    // SAFETY: the file was written above and nothing modifies it while it is mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap();
    let mut reference = t5::T5EncoderModel::load(vb, &cfg).unwrap();
    let t5 = TextTokenizer::open(&d.join("tokenizer_2"), 512, "<pad>").unwrap();
    let (ids, _) = t5.encode("a red dishwasher").unwrap();
    let want = reference
        .forward(&Tensor::from_vec(ids, (1, 512), &Device::Cpu).unwrap())
        .unwrap()
        .squeeze(0)
        .unwrap();
    // The context's first rows are txt_in(T5 states): compare the states themselves through
    // the encoder the pipeline built.
    let enc = flashdiff_models::pipeline::FluxText::load(&d, 512, &Device::Cpu).unwrap();
    let got = flashdiff_models::flux::PromptEncoder::encode(&enc, "a red dishwasher").unwrap();
    let diff = (got.states - &want)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff == 0.0, "T5 states differ by {diff}");
    assert_eq!(got.pooled.dims(), [32]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_pooled_vector_is_the_end_of_text_state_and_depends_on_the_prompt() {
    let d = scratch("pool");
    tiny::write_flux(&d, true).unwrap();
    let enc = flashdiff_models::pipeline::FluxText::load(&d, 64, &Device::Cpu).unwrap();
    let e = |p: &str| flashdiff_models::flux::PromptEncoder::encode(&enc, p).unwrap();
    let (a, b) = (e("a red cat"), e("a blue cat"));
    let d2 = (a.pooled - b.pooled)
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap();
    assert!(
        d2.to_scalar::<f32>().unwrap() > 1e-3,
        "pooled ignores the prompt"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn schedules_follow_the_released_schedulers() {
    for s in [
        Schedule::Uniform,
        Schedule::Shift(3.0),
        Schedule::Resolution,
    ] {
        assert_eq!(s.time(0, 28, 4096), 1.0);
        assert_eq!(s.time(28, 28, 4096), 0.0);
        for n in 0..28 {
            assert!(
                s.time(n + 1, 28, 4096) < s.time(n, 28, 4096),
                "{s:?} not decreasing"
            );
        }
    }
    // SD3's shift 3 at u = 1/2: 1.5 / 2 = 0.75.
    assert!((Schedule::Shift(3.0).time(1, 2, 0) - 0.75).abs() < 1e-6);
    // FLUX.1 dev at 4096 tokens: mu = 1.15, t(1/2) = e^1.15 / (e^1.15 + 1).
    let e = 1.15f64.exp();
    assert!((Schedule::Resolution.time(1, 2, 4096) as f64 - e / (e + 1.0)).abs() < 1e-6);
    // At 256 tokens mu = 0.5.
    let e = 0.5f64.exp();
    assert!((Schedule::Resolution.time(3, 4, 256) as f64 - e / (e + 3.0)).abs() < 1e-6);
    assert!((Schedule::Uniform.time(1, 4, 9) - 0.75).abs() < 1e-7);
}

#[test]
fn decoding_unpacks_flux_tokens_into_the_vae_latent() {
    let d = scratch("vae");
    tiny::write_flux(&d, false).unwrap();
    let m = pipeline::load("flux-schnell", &d, &opts(64, 32), &Device::Cpu).unwrap();
    let dims = m.dims().clone();
    assert_eq!(
        (dims.grid.height, dims.grid.width, dims.channels),
        (2, 4, 64)
    );
    // A latent image z (16 x 4 x 8), packed as FLUX packs it: token (ty, tx) holds latent
    // pixels (2ty + dy, 2tx + dx) of channel k at (k * 2 + dy) * 2 + dx.
    let z: Vec<f32> = (0..16 * 4 * 8)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let mut tokens = vec![0f32; 8 * 64];
    for ty in 0..2 {
        for tx in 0..4 {
            for k in 0..16 {
                for dy in 0..2 {
                    for dx in 0..2 {
                        tokens[(ty * 4 + tx) * 64 + (k * 2 + dy) * 2 + dx] =
                            z[(k * 4 + 2 * ty + dy) * 8 + 2 * tx + dx];
                    }
                }
            }
        }
    }
    let s = m.decode(&tokens).unwrap();
    assert_eq!((s.width, s.height, s.frames), (64, 32, 1));
    let vae = Vae::load(&d, &Device::Cpu).unwrap();
    let want = vae
        .decode(&Tensor::from_vec(z, (16, 4, 8), &Device::Cpu).unwrap())
        .unwrap()
        .permute((1, 2, 0))
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(s.rgb, want);
    assert!(s.rgb.iter().all(|v| (0.0..=1.0).contains(v)));
    std::fs::remove_dir_all(&d).unwrap();
}

fn load_err(name: &str, dir: &Path, o: &PipelineOptions) -> String {
    pipeline::load(name, dir, o, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

#[test]
fn a_wrong_folder_gets_an_error_that_says_what_is_wrong() {
    let d = scratch("err");
    tiny::write_flux(&d, false).unwrap();
    let o = opts(64, 64);
    let e = load_err("flux-dev", &d, &o);
    assert!(
        e.contains("has no a guidance embedding") || e.contains("is flux-schnell"),
        "{e}"
    );
    let e = load_err(
        "flux-schnell",
        &d,
        &PipelineOptions {
            guidance: Some(3.5),
            ..o.clone()
        },
    );
    assert!(e.contains("takes no guidance"), "{e}");
    let e = load_err("flux-schnell", &d, &opts(100, 64));
    assert!(
        e.contains("width 100") && e.contains("multiple of 16"),
        "{e}"
    );
    let e = load_err("flux-pro", &d, &o);
    assert!(e.contains("unknown pipeline"), "{e}");
    let e = load_err("flux-schnell", &d.join("nothing"), &o);
    assert!(e.contains("is not a folder"), "{e}");
    // A truncated text encoder, a missing tokenizer, a VAE of the wrong width.
    let te = d.join("text_encoder/model.safetensors");
    let bytes = std::fs::read(&te).unwrap();
    std::fs::write(&te, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err("flux-schnell", &d, &o);
    assert!(e.contains("text_encoder"), "{e}");
    std::fs::write(&te, &bytes).unwrap();
    std::fs::rename(d.join("tokenizer_2"), d.join("tok2")).unwrap();
    let e = load_err("flux-schnell", &d, &o);
    assert!(e.contains("tokenizer_2"), "{e}");
    std::fs::rename(d.join("tok2"), d.join("tokenizer_2")).unwrap();
    let cfg = d.join("vae/config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("\"latent_channels\":16", "\"latent_channels\":8"),
    )
    .unwrap();
    let e = load_err("flux-schnell", &d, &o);
    assert!(e.contains("vae") || e.contains("VAE"), "{e}");
    std::fs::write(&cfg, &text).unwrap();
    std::fs::remove_dir_all(d.join("vae")).unwrap();
    let e = load_err("flux-schnell", &d, &o);
    assert!(e.contains("has no VAE"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
