//! The FLUX pipeline: tokenizer files, candle-transformers' text
//! encoders and VAE read through our checkpoint reader, the sampling schedules, decoding, and
//! the errors a wrong folder gets. On the small random pipeline `pipeline::tiny` writes.

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use flashdiff_models::decoders::vae::Vae;
use flashdiff_models::encoders::text::TextTokenizer;
use flashdiff_models::families::joint::denoiser::Schedule;
use flashdiff_models::families::joint::pieces::words_from_pieces;
use flashdiff_models::pipelines::{self as pipeline, tiny, PipelineOptions};
use flashdiff_models::Denoiser;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-pipe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(w: usize, h: usize) -> PipelineOptions {
    PipelineOptions::new((h, w))
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
    let mut reference = common::candle_t5(&dir);
    let t5 = TextTokenizer::open(&d.join("tokenizer_2"), 512, "<pad>").unwrap();
    let (ids, _) = t5.encode("a red dishwasher").unwrap();
    let want = reference
        .forward(&Tensor::from_vec(ids, (1, 512), &Device::Cpu).unwrap())
        .unwrap()
        .squeeze(0)
        .unwrap();
    // The context's first rows are txt_in(T5 states): compare the states themselves through
    // the encoder the pipeline built.
    let enc = flashdiff_models::encoders::text::FluxText::load(
        &d,
        512,
        candle_core::DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let got =
        flashdiff_models::families::flux::PromptEncoder::encode(&enc, "a red dishwasher").unwrap();
    let diff = common::max_diff(&got.states, &want);
    assert!(diff == 0.0, "T5 states differ by {diff}");
    assert_eq!(got.pooled.dims(), [32]);
    // T5 in bf16 (as on a GPU) gives f32 states. This random T5 amplifies rounding a lot
    // (its attention is unscaled), so the check is that the error follows the precision:
    // bf16's unit roundoff is 8x f16's; measured 0.33 vs 0.046 relative RMS (7.1x) on the
    // small pipeline's seeded weights (unseeded, f16's error ranged up to 0.12).
    let states = |dtype| {
        let enc =
            flashdiff_models::encoders::text::FluxText::load(&d, 512, dtype, &Device::Cpu).unwrap();
        let s = flashdiff_models::families::flux::PromptEncoder::encode(&enc, "a red dishwasher")
            .unwrap()
            .states;
        assert_eq!(s.dtype(), DType::F32);
        let err = (&s - &want).unwrap().sqr().unwrap().sum_all().unwrap();
        let norm = want.sqr().unwrap().sum_all().unwrap();
        (err.to_scalar::<f32>().unwrap() / norm.to_scalar::<f32>().unwrap()).sqrt()
    };
    let (bf16, f16) = (states(DType::BF16), states(DType::F16));
    assert!(
        f16 > 0.0 && f16 < 0.1 && bf16 > 2.0 * f16 && bf16 < 16.0 * f16,
        "relative RMS error of T5's states: bf16 {bf16}, f16 {f16}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_small_pipelines_weights_are_the_same_on_every_write() {
    // Tests measure these weights (the rounding bound above): they must not change per run.
    let (a, b) = (scratch("seed-a"), scratch("seed-b"));
    tiny::write_flux(&a, true).unwrap();
    tiny::write_flux(&b, true).unwrap();
    for part in [
        "text_encoder_2/model.safetensors",
        "text_encoder/model.safetensors",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
    ] {
        let read = |d: &std::path::Path| {
            candle_core::safetensors::load(d.join(part), &Device::Cpu)
                .unwrap_or_else(|e| panic!("{part}: {e}"))
        };
        let (x, y) = (read(&a), read(&b));
        assert!(!x.is_empty(), "{part} has tensors");
        assert_eq!(x.len(), y.len(), "{part}");
        for (name, t) in &x {
            assert_eq!(common::max_diff(t, &y[name]), 0.0, "{part}: {name} differs");
        }
    }
    std::fs::remove_dir_all(&a).unwrap();
    std::fs::remove_dir_all(&b).unwrap();
}

#[test]
fn the_pooled_vector_is_the_end_of_text_state_and_depends_on_the_prompt() {
    let d = scratch("pool");
    tiny::write_flux(&d, true).unwrap();
    let enc = flashdiff_models::encoders::text::FluxText::load(
        &d,
        64,
        candle_core::DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let e = |p: &str| flashdiff_models::families::flux::PromptEncoder::encode(&enc, p).unwrap();
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
    let e = load_err(
        "flux-schnell",
        &d,
        &PipelineOptions {
            dtype: candle_core::DType::F16,
            ..o.clone()
        },
    );
    assert!(e.contains("compute in f32 or bf16"), "{e}");
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

#[test]
fn a_grid_too_large_or_overflowing_is_refused() {
    use flashdiff_models::encoders::text::FluxText;
    use flashdiff_models::families::flux::{FluxCheckpoint, FluxDenoiser};
    let d = scratch("grid");
    tiny::write_flux(&d, false).unwrap();
    for grid in [(1, 1 << 10, 1 << 9), (usize::MAX, 2, 2), (0, 4, 4)] {
        let flux = FluxCheckpoint::open(&d.join("transformer"))
            .unwrap()
            .load(Some([4, 6, 6]), &Device::Cpu)
            .unwrap();
        let text = FluxText::load(&d, 16, candle_core::DType::F32, &Device::Cpu).unwrap();
        let e = FluxDenoiser::new_video(flux, Box::new(text), grid, 0.0, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokens") || e.contains("non-empty"),
            "{grid:?}: {e}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Our CLIP text encoder with projection against transformers' `CLIPTextModelWithProjection`
/// (golden files from `models/reference/clip_golden.py`): gelu (CLIP-G) and quick-GELU
/// (CLIP-L), penultimate states and projected pooled vector.
#[test]
fn clip_with_projection_equals_transformers() {
    use flashdiff_models::encoders::clip::ClipWithProjection;
    let toks = scratch("cliptok");
    tiny::write_flux(&toks, true).unwrap();
    for (file, act) in [
        ("clip_gelu_golden", "gelu"),
        ("clip_quick_golden", "quick_gelu"),
    ] {
        let d = scratch(file);
        std::fs::create_dir_all(&d).unwrap();
        let golden =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("reference/{file}.safetensors"));
        std::fs::copy(&golden, d.join("model.safetensors")).unwrap();
        std::fs::write(
            d.join("config.json"),
            format!(
                r#"{{"vocab_size": 99, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 12,
                "projection_dim": 24, "hidden_act": "{act}"}}"#
            ),
        )
        .unwrap();
        let clip =
            ClipWithProjection::load(&d, &toks.join("tokenizer"), "<|endoftext|>", &Device::Cpu)
                .unwrap();
        let g = candle_core::safetensors::load(&golden, &Device::Cpu).unwrap();
        let ids: Vec<u32> = g["golden.ids"]
            .to_vec1::<i64>()
            .unwrap()
            .iter()
            .map(|&i| i as u32)
            .collect();
        let (states, pooled) = clip.forward(&ids).unwrap();
        for (got, want) in [
            (states, &g["golden.penultimate"]),
            (pooled, &g["golden.pooled"]),
        ] {
            let diff = common::max_diff(&got, want);
            assert!(diff <= 1e-4, "{file}: differs from transformers by {diff}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
    std::fs::remove_dir_all(&toks).unwrap();
}

/// SD3's prompt encoder joins CLIP-L and CLIP-G side by side (zero-padded to T5's width)
/// above T5, with the words from T5's pieces only; classifier-free guidance combines a pass
/// on the prompt and one on the empty prompt: scale 1 is the prompt's pass alone, and the
/// output is linear in the scale.
#[test]
fn sd3_encodes_as_diffusers_joins_and_guides_between_two_passes() {
    use flashdiff_models::encoders::sd3::Sd3Text;
    use flashdiff_models::families::joint::denoiser::PromptEncoder as _;
    use flashdiff_models::families::mmdit::MmditCheckpoint;
    use flashdiff_models::families::mmdit::Sd3Denoiser;
    use flashdiff_models::StepInput;
    let d = scratch("sd3");
    tiny::write_sd3(&d, true).unwrap();
    let text = Sd3Text::load(&d, 20, candle_core::DType::F32, &Device::Cpu).unwrap();
    assert_eq!(text.widths(), (32, 32));
    let e = text.encode("a red dishwasher").unwrap();
    assert_eq!(e.states.dims(), [32 + 20, 32]);
    assert_eq!(
        e.pieces[..32],
        vec![flashdiff_models::encoders::sd3::CLIP_PIECE.to_string(); 32][..]
    );
    // CLIP-L (8) + CLIP-G (16) = 24 columns, then zeros up to T5's 32.
    let pad = e.states.narrow(0, 0, 32).unwrap().narrow(1, 24, 8).unwrap();
    assert_eq!(
        pad.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
    let m = pipeline::load("sd3.5", &d, &opts(64, 48), &Device::Cpu).unwrap();
    let c = m.condition("a red dishwasher").unwrap();
    assert_eq!(
        c.words,
        ["a", "red", "dishwasher"],
        "each word once, from T5"
    );
    let dims = m.dims().clone();
    assert_eq!(dims.kv_dim, 2 * 64, "both passes' K/V");
    let ctx = Tensor::from_slice(&c.context, c.context.len(), &Device::Cpu).unwrap();
    let x = Tensor::randn(0f32, 1.0, (dims.grid.tokens(), dims.channels), &Device::Cpu).unwrap();
    let velocity = |scale: Option<f32>, empty: bool| {
        let load = || {
            let mmdit = MmditCheckpoint::open(&d.join("transformer"))
                .unwrap()
                .load(Some(4), &Device::Cpu)
                .unwrap();
            let text = Sd3Text::load(&d, 256, candle_core::DType::F32, &Device::Cpu).unwrap();
            let text: Box<dyn flashdiff_models::families::joint::denoiser::PromptEncoder> = if empty
            {
                Box::new(EmptyPrompt(text))
            } else {
                Box::new(text)
            };
            Sd3Denoiser::new(mmdit, text, (3, 4), 0.0, Device::Cpu).unwrap()
        };
        let m: Box<dyn Denoiser> = match scale {
            Some(g) => Box::new(load().with_cfg(g).unwrap()),
            None => Box::new(load()),
        };
        let prompt = "a red cat";
        let c = m.condition(prompt).unwrap();
        let ctx = Tensor::from_slice(&c.context, c.context.len(), &Device::Cpu).unwrap();
        let cond = m.step_cond(&ctx, 0.6).unwrap();
        m.full_forward(
            &x,
            StepInput {
                context: &ctx,
                cond: &cond,
            },
            false,
        )
        .unwrap()
        .velocity
    };
    let max = common::max_diff;
    let (c1, alone) = (velocity(Some(1.0), false), velocity(None, false));
    assert!(max(&c1, &alone) <= 1e-5, "scale 1 is not the prompt's pass");
    let (c0, empty) = (velocity(Some(0.0), false), velocity(None, true));
    assert!(
        max(&c0, &empty) <= 1e-5,
        "scale 0 is not the empty prompt's pass"
    );
    let c7 = velocity(Some(7.0), false);
    let want = (&empty + ((&alone - &empty).unwrap() * 7.0).unwrap()).unwrap();
    assert!(max(&c7, &want) <= 1e-4, "u + 7 (c - u)");
    assert!(max(&alone, &empty) > 1e-3, "the prompt changes nothing");
    // A subset forward reading both passes' cached K/V equals the full forward's rows.
    let cond = m.step_cond(&ctx, 0.6).unwrap();
    let step = StepInput {
        context: &ctx,
        cond: &cond,
    };
    let full = m.full_forward(&x, step, false).unwrap();
    let active = [1u32, 2, 7];
    let idx = Tensor::new(&active, &Device::Cpu).unwrap();
    let of_token: Vec<u32> = (0..dims.grid.tokens() as u32).map(|t| t % 3).collect();
    let sub = m
        .subset_forward(
            &x.index_select(&idx, 0).unwrap(),
            &active,
            step,
            Some(flashdiff_models::KvCache {
                k: &full.k,
                v: &full.v,
            }),
            flashdiff_models::Patches {
                of_token: &of_token,
                patches: 3,
            },
        )
        .unwrap();
    let rows = full.velocity.index_select(&idx, 0).unwrap();
    assert!(
        max(&sub.velocity, &rows) <= 1e-4,
        "subset over both caches differs"
    );
    assert_eq!(sub.k.dims(), [dims.kv_layers, 3, 128]);
    drop(ctx);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The empty prompt's encoding under a prompt's pieces (so that it has words): the pass
/// classifier-free guidance runs second.
#[derive(Debug)]
struct EmptyPrompt(flashdiff_models::encoders::sd3::Sd3Text);

impl flashdiff_models::families::joint::denoiser::PromptEncoder for EmptyPrompt {
    fn encode(
        &self,
        prompt: &str,
    ) -> Result<
        flashdiff_models::families::joint::denoiser::EncodedPrompt,
        flashdiff_models::ModelError,
    > {
        let mut e = self.0.encode("")?;
        e.pieces = self.0.encode(prompt)?.pieces;
        Ok(e)
    }

    fn tokens(&self) -> usize {
        self.0.tokens()
    }
}
