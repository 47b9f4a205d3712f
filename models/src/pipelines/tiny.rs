//! A small random FLUX pipeline folder in diffusers' layout, with the real structure of
//! every part (FLUX transformer, T5 encoder, CLIP text model, both tokenizers, AutoencoderKL)
//! at toy sizes: what tests and demos run `flashdiff generate --model flux-dev` on, since the
//! released weights cannot be downloaded here. Its images are noise-like
//! (random weights); what it shows is the path: loading, encoding, the engine, decoding.

use std::path::Path;

use std::sync::Mutex;

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};
use candle_transformers::models::clip::text_model as clip;
use candle_transformers::models::stable_diffusion::vae as sd;
use candle_transformers::models::t5;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal, Uniform};
use tokenizers::models::bpe::BPE;
use tokenizers::models::unigram::Unigram;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::Tokenizer;

use crate::families::flux::{Flux, FluxConfig};
use crate::families::mmdit::{Mmdit, MmditConfig};
use crate::ModelError;

/// Words the small T5 tokenizer has whole pieces for (others are spelt letter by letter).
const WORDS: &[&str] = &[
    "a",
    "an",
    "the",
    "of",
    "on",
    "in",
    "and",
    "with",
    "at",
    "to",
    "red",
    "green",
    "blue",
    "yellow",
    "white",
    "black",
    "orange",
    "purple",
    "cat",
    "dog",
    "table",
    "chair",
    "house",
    "tree",
    "car",
    "circle",
    "square",
    "left",
    "right",
    "top",
    "bottom",
    "center",
    "small",
    "big",
    "photo",
    "background",
    "sky",
    "sun",
    "lake",
    "mountain",
];

/// Widths of the toy parts.
const T5_WIDTH: usize = 32;
const CLIP_WIDTH: usize = 32;
const CLIP_TOKENS: usize = 32;

fn fail(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Input(format!("writing the small pipeline's {what}: {e}"))
}

fn write(path: &Path, text: &str) -> Result<(), ModelError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| fail(&d.display().to_string(), e))?;
    }
    std::fs::write(path, text).map_err(|e| fail(&path.display().to_string(), e))
}

/// The seed of every small pipeline's weights.
const SEED: u64 = 0x5EED_F1A5;

/// Fills a `VarMap` as candle's own `VarBuilder::from_varmap` does (each variable made on
/// first request, initialised as its hint says), but from a seeded generator: candle's CPU
/// generator cannot be seeded, and tests that measure these weights (rounding error through
/// T5, for one) must see the same weights on every run.
struct Seeded {
    vars: VarMap,
    rng: Mutex<StdRng>,
    /// How each variable is initialised, by name and shape, in place of the hint the model
    /// passes (our loaders ask with none).
    init: Option<Hint>,
}

/// How a random variable is initialised, from its name and shape.
type Hint = fn(&str, &[usize]) -> Init;

/// A builder over `vars` whose new variables come from the generator seeded with [`SEED`].
pub(crate) fn seeded(vars: &VarMap) -> VarBuilder<'static> {
    seeded_as(vars, None)
}

/// [`seeded`], each variable initialised as `init` says when given.
fn seeded_as(vars: &VarMap, init: Option<Hint>) -> VarBuilder<'static> {
    let backend = Seeded {
        vars: vars.clone(),
        rng: Mutex::new(StdRng::seed_from_u64(SEED)),
        init,
    };
    VarBuilder::from_backend(Box::new(backend), DType::F32, Device::Cpu)
}

/// Writes a CLIP text model of config `c` with random weights (transformers' names) to `path`.
fn clip_random(c: &crate::encoders::text::ClipJson, path: &Path) -> Result<(), ModelError> {
    let vm = VarMap::new();
    crate::encoders::clip::Net::new(seeded(&vm), c, path)?;
    vm.save(path)
        .map_err(|e| ModelError::Input(format!("{}: {e}", path.display())))
}

fn poisoned() -> candle_core::Error {
    candle_core::Error::Msg("a panic poisoned the small pipeline's weights".into())
}

/// `n` values drawn as `init` says for a tensor of `shape`.
fn draw(rng: &mut StdRng, init: Init, shape: &Shape) -> candle_core::Result<Vec<f32>> {
    let n = shape.elem_count();
    let bad = |e: &dyn std::fmt::Display| candle_core::Error::Msg(format!("initialiser: {e}"));
    let normal = |rng: &mut StdRng, mean: f64, std: f64| {
        let d = Normal::new(mean, std).map_err(|e| bad(&e))?;
        Ok((0..n).map(|_| d.sample(rng) as f32).collect())
    };
    let uniform = |rng: &mut StdRng, lo: f64, up: f64| {
        if lo >= up {
            return Ok(vec![lo as f32; n]);
        }
        let d = Uniform::new(lo, up).map_err(|e| bad(&e))?;
        Ok((0..n).map(|_| d.sample(rng) as f32).collect())
    };
    match init {
        Init::Const(c) => Ok(vec![c as f32; n]),
        Init::Uniform { lo, up } => uniform(rng, lo, up),
        Init::Randn { mean, stdev } => normal(rng, mean, stdev),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            // candle's formula: std = gain / sqrt(fan); a uniform of that std.
            let std = non_linearity.gain() / (fan.for_shape(shape).max(1) as f64).sqrt();
            match dist {
                NormalOrUniform::Normal => normal(rng, 0.0, std),
                NormalOrUniform::Uniform => uniform(rng, -(3f64.sqrt()) * std, 3f64.sqrt() * std),
            }
        }
    }
}

impl SimpleBackend for Seeded {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut vars = self.vars.data().lock().map_err(|_| poisoned())?;
        if let Some(v) = vars.get(name) {
            if v.shape() != &s {
                candle_core::bail!("{name}: asked for shape {s:?}, made as {:?}", v.shape());
            }
            return v.as_tensor().to_dtype(dtype);
        }
        let h = self.init.map_or(h, |init| init(name, s.dims()));
        let values = draw(&mut *self.rng.lock().map_err(|_| poisoned())?, h, &s)?;
        let var = Var::from_tensor(&Tensor::from_vec(values, s, dev)?.to_dtype(dtype)?)?;
        let t = var.as_tensor().clone();
        vars.insert(name.to_string(), var);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, _: &Device) -> candle_core::Result<Tensor> {
        let vars = self.vars.data().lock().map_err(|_| poisoned())?;
        match vars.get(name) {
            Some(v) => v.as_tensor().to_dtype(dtype),
            None => candle_core::bail!("{name}: not made yet"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.vars
            .data()
            .lock()
            .map(|v| v.contains_key(name))
            .unwrap_or(false)
    }
}

/// Random weights for one of our models, saved to `path`: `build` loads the model from a
/// `VarBuilder` that makes each tensor it asks for, initialised as `hint` says.
fn random_model(
    path: &Path,
    hint: Hint,
    build: impl FnOnce(&VarBuilder) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let vm = VarMap::new();
    build(&seeded_as(&vm, Some(hint)))?;
    save(&vm, path)
}

fn save(vm: &VarMap, path: &Path) -> Result<(), ModelError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| fail(&d.display().to_string(), e))?;
    }
    vm.save(path)
        .map_err(|e| fail(&path.display().to_string(), e))
}

/// Writes the folder: `dev` with FLUX.1 dev's guidance embedding, else schnell's structure.
pub fn write_flux(dir: &Path, dev: bool) -> Result<(), ModelError> {
    let t5_vocab = t5_tokenizer(&dir.join("tokenizer_2"))?;
    let clip_vocab = clip_tokenizer(&dir.join("tokenizer"))?;
    transformer(&dir.join("transformer"), dev)?;
    t5_encoder(&dir.join("text_encoder_2"), t5_vocab)?;
    clip_encoder(&dir.join("text_encoder"), clip_vocab)?;
    vae(&dir.join("vae"))
}

/// Writes a small random Wan2.1 folder: umT5 (3 layers, 16 wide) and its tokenizer, the
/// transformer (2 blocks of 2 heads of 12, 4 latent channels), the VAE (8 wide at its
/// base) and the scheduler's config.
pub fn write_wan(dir: &Path) -> Result<(), ModelError> {
    let vocab = t5_tokenizer(&dir.join("tokenizer"))?;
    let json = serde_json::json!({"architectures": ["UMT5EncoderModel"], "vocab_size": vocab,
        "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 3, "num_heads": 4,
        "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
        "feed_forward_proj": "gated-gelu", "layer_norm_epsilon": 1e-6});
    write(&dir.join("text_encoder/config.json"), &json.to_string())?;
    let cfg = serde_json::from_value(json).map_err(|e| fail("umT5 config", e))?;
    random_model(&dir.join("text_encoder/model.safetensors"), init, |get| {
        crate::encoders::umt5::Umt5Encoder::load(cfg, get, &Device::Cpu).map(drop)
    })?;
    let cfg = crate::families::wan::WanConfig {
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
    };
    random_model(
        &dir.join("transformer/diffusion_pytorch_model.safetensors"),
        init,
        |get| crate::families::wan::Wan::load(cfg, get).map(drop),
    )?;
    write(
        &dir.join("transformer/config.json"),
        r#"{"_class_name": "WanTransformer3DModel", "num_attention_heads": 2}"#,
    )?;
    let vae = serde_json::json!({"_class_name": "AutoencoderKLWan", "base_dim": 8, "z_dim": 4,
        "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
        "temperal_downsample": [false, true, true],
        "latents_mean": [0.1, -0.1, 0.0, 0.2], "latents_std": [1.2, 0.9, 1.0, 1.5]});
    write(&dir.join("vae/config.json"), &vae.to_string())?;
    let cfg = serde_json::from_value(vae).map_err(|e| fail("Wan VAE config", e))?;
    let hint = |name: &str, shape: &[usize]| {
        if name.ends_with(".gamma") {
            Init::Const(1.0)
        } else {
            init(name, shape)
        }
    };
    random_model(
        &dir.join("vae/diffusion_pytorch_model.safetensors"),
        hint,
        |get| crate::decoders::wan_vae::WanVae::load(cfg, get).map(drop),
    )?;
    write(
        &dir.join("scheduler/scheduler_config.json"),
        r#"{"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0}"#,
    )
}

/// Writes a small random Stable Audio Open folder: T5 and its tokenizer, the projection
/// model (the seconds' embedders), the DiT (hidden 32, cross-attention 16 wide with 2
/// key/value heads), the Oobleck VAE (5 blocks, 32 samples a latent frame, stereo, 8 kHz)
/// and the scheduler's config. Its window: 16 latent frames, 64 ms.
pub fn write_sao(dir: &Path) -> Result<(), ModelError> {
    let vocab = t5_tokenizer(&dir.join("tokenizer"))?;
    t5_encoder(&dir.join("text_encoder"), vocab)?;
    let w = T5_WIDTH;
    write(
        &dir.join("projection_model/config.json"),
        &serde_json::json!({"_class_name": "StableAudioProjectionModel", "text_encoder_dim": w,
            "conditioning_dim": w, "min_value": 0, "max_value": 512})
        .to_string(),
    )?;
    let vm = VarMap::new();
    let vb = seeded(&vm);
    for p in ["start_number_conditioner", "end_number_conditioner"] {
        let e = format!("{p}.time_positional_embedding");
        for (n, shape) in [
            (format!("{e}.0.weights"), vec![8]),
            (format!("{e}.1.weight"), vec![w, 17]),
            (format!("{e}.1.bias"), vec![w]),
        ] {
            let init = Init::Randn {
                mean: 0.0,
                stdev: if n.ends_with("weights") { 1.0 } else { 0.25 },
            };
            vb.get_with_hints(shape, &n, init)?;
        }
    }
    save(
        &vm,
        &dir.join("projection_model/diffusion_pytorch_model.safetensors"),
    )?;
    let cfg = crate::families::sao::SaoConfig {
        in_channels: 8,
        out_channels: 8,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        depth: 2,
        cross_dim: 16,
        cross_in: w,
        global_in: 2 * w,
        time_proj_dim: 16,
    };
    write(
        &dir.join("transformer/config.json"),
        &serde_json::json!({"_class_name": "StableAudioDiTModel", "sample_size": 16,
            "in_channels": 8, "num_layers": 2, "attention_head_dim": 8,
            "num_attention_heads": 4, "num_key_value_attention_heads": 2, "out_channels": 8,
            "cross_attention_dim": 16, "time_proj_dim": 16, "global_states_input_dim": 2 * w,
            "cross_attention_input_dim": w})
        .to_string(),
    )?;
    random_model(
        &dir.join("transformer/diffusion_pytorch_model.safetensors"),
        init,
        |get| crate::families::sao::Sao::load(cfg, get).map(drop),
    )?;
    let vae = crate::decoders::oobleck::OobleckConfig {
        decoder_channels: 4,
        decoder_input_channels: 8,
        audio_channels: 2,
        downsampling_ratios: vec![2, 2, 2, 2, 2],
        channel_multiples: vec![1, 2, 2, 2, 2],
        sampling_rate: 8000,
    };
    write(
        &dir.join("vae/config.json"),
        &serde_json::json!({"_class_name": "AutoencoderOobleck", "decoder_channels": 4,
            "decoder_input_channels": 8, "audio_channels": 2, "encoder_hidden_size": 4,
            "downsampling_ratios": [2, 2, 2, 2, 2], "channel_multiples": [1, 2, 2, 2, 2],
            "sampling_rate": 8000})
        .to_string(),
    )?;
    let hint = |name: &str, _: &[usize]| {
        if name.ends_with("weight_g") {
            Init::Const(1.0)
        } else if name.ends_with("alpha") || name.ends_with("beta") || name.ends_with("bias") {
            Init::Const(0.0)
        } else {
            Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            }
        }
    };
    random_model(
        &dir.join("vae/diffusion_pytorch_model.safetensors"),
        hint,
        |get| crate::decoders::oobleck::Oobleck::load(vae, get).map(drop),
    )?;
    write(
        &dir.join("scheduler/scheduler_config.json"),
        r#"{"_class_name": "CosineDPMSolverMultistepScheduler", "sigma_min": 0.3,
            "sigma_max": 500.0, "sigma_data": 1.0, "prediction_type": "v_prediction"}"#,
    )
}

/// Writes a small random SD3 (`sd35`: SD3.5 medium's structure, with Q/K norms and a
/// dual-attention block) pipeline folder: CLIP-L (quick-GELU), CLIP-G (GELU, padded with
/// `!`), T5, the MMDiT and the VAE.
pub fn write_sd3(dir: &Path, sd35: bool) -> Result<(), ModelError> {
    let t5_vocab = t5_tokenizer(&dir.join("tokenizer_3"))?;
    let clip_vocab = clip_tokenizer(&dir.join("tokenizer"))?;
    clip_tokenizer(&dir.join("tokenizer_2"))?;
    write(
        &dir.join("tokenizer_2/tokenizer_config.json"),
        r#"{"pad_token": "!"}"#,
    )?;
    // CLIP-L 8 + CLIP-G 16 wide: zero-padded to T5's 32; pooled 16 + 16.
    for (sub, width, act) in [
        ("text_encoder", 8, "quick_gelu"),
        ("text_encoder_2", 16, "gelu"),
    ] {
        let json = serde_json::json!({
            "architectures": ["CLIPTextModelWithProjection"],
            "vocab_size": clip_vocab,
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "max_position_embeddings": CLIP_TOKENS,
            "projection_dim": 16,
            "hidden_act": act,
        });
        write(&dir.join(sub).join("config.json"), &json.to_string())?;
        let c = serde_json::from_value(json).map_err(|e| fail("CLIP config", e))?;
        clip_random(&c, &dir.join(sub).join("model.safetensors"))?;
    }
    t5_encoder(&dir.join("text_encoder_3"), t5_vocab)?;
    let cfg = MmditConfig {
        patch: 2,
        in_channels: 16,
        out_channels: 16,
        hidden: 64,
        heads: 4,
        depth: 2,
        pos_max: 16,
        context_in_dim: T5_WIDTH,
        pooled_dim: 32,
        qk_norm: sd35,
        dual: if sd35 { vec![0] } else { vec![] },
    };
    let t = dir.join("transformer");
    random_model(
        &t.join("diffusion_pytorch_model.safetensors"),
        init,
        |get| Mmdit::load(cfg, get).map(drop),
    )?;
    write(
        &t.join("config.json"),
        r#"{"_class_name": "SD3Transformer2DModel", "num_attention_heads": 4}"#,
    )?;
    vae(&dir.join("vae"))
}

/// Random initialisation: norms' scales 1, small biases, weights of unit gain.
fn init(name: &str, shape: &[usize]) -> Init {
    let norm = name.ends_with(".scale") || (name.contains("norm") && name.ends_with(".weight"));
    if norm && shape.len() == 1 {
        Init::Const(1.0)
    } else if shape.len() == 1 {
        Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        }
    } else {
        Init::Randn {
            mean: 0.0,
            stdev: 1.0 / (shape[1..].iter().product::<usize>() as f64).sqrt(),
        }
    }
}

fn transformer(dir: &Path, dev: bool) -> Result<(), ModelError> {
    let cfg = FluxConfig {
        in_channels: 64,
        vec_in_dim: CLIP_WIDTH,
        context_in_dim: T5_WIDTH,
        hidden: 64,
        mlp_ratio: 2.0,
        heads: 4,
        depth: 2,
        depth_single: 2,
        axes_dim: [4, 6, 6],
        theta: 10_000.0,
        qkv_bias: true,
        guidance_embed: dev,
    };
    random_model(
        &dir.join("diffusion_pytorch_model.safetensors"),
        init,
        |get| Flux::load(cfg, get).map(drop),
    )?;
    write(
        &dir.join("config.json"),
        r#"{"_class_name": "FluxTransformer2DModel", "axes_dims_rope": [4, 6, 6]}"#,
    )
}

/// T5's SentencePiece-style unigram tokenizer; returns its vocabulary size.
fn t5_tokenizer(dir: &Path) -> Result<usize, ModelError> {
    let mut vocab: Vec<(String, f64)> = ["<pad>", "</s>", "<unk>"]
        .iter()
        .map(|s| (s.to_string(), 0.0))
        .collect();
    vocab.push(("\u{2581}".into(), -8.0));
    vocab.extend(WORDS.iter().map(|w| (format!("\u{2581}{w}"), -4.0)));
    vocab.extend(('a'..='z').map(|c| (c.to_string(), -10.0)));
    vocab.extend(('a'..='z').map(|c| (format!("\u{2581}{c}"), -10.0)));
    vocab.extend(
        ["dish", "washer", "ing", "s"]
            .iter()
            .map(|w| (w.to_string(), -5.0)),
    );
    vocab.push(("\u{2581}dish".into(), -5.0));
    vocab.dedup_by(|a, b| a.0 == b.0);
    let n = vocab.len();
    let model = Unigram::from(vocab, Some(2), false).map_err(|e| fail("T5 tokenizer", e))?;
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Metaspace::new(
        '\u{2581}',
        PrependScheme::Always,
        true,
    )));
    let post = TemplateProcessing::builder()
        .try_single("$A </s>")
        .map_err(|e| fail("T5 tokenizer", e))?
        .special_tokens(vec![("</s>", 1)])
        .build()
        .map_err(|e| fail("T5 tokenizer", e))?;
    tok.with_post_processor(Some(post));
    std::fs::create_dir_all(dir).map_err(|e| fail("T5 tokenizer", e))?;
    tok.save(dir.join("tokenizer.json"), true)
        .map_err(|e| fail("T5 tokenizer", e))?;
    Ok(n)
}

/// CLIP's byte-level BPE as diffusers ships it for FLUX (`vocab.json` + `merges.txt`, no
/// `tokenizer.json`); `<|endoftext|>` has the largest id, as in CLIP. Returns the vocabulary
/// size.
fn clip_tokenizer(dir: &Path) -> Result<usize, ModelError> {
    let merges = [
        ("r", "e"),
        ("re", "d</w>"),
        ("b", "l"),
        ("bl", "u"),
        ("blu", "e</w>"),
    ];
    let mut tokens: Vec<String> = Vec::new();
    for c in ('a'..='z').chain('0'..='9').chain(",.!?'-".chars()) {
        tokens.push(c.to_string());
        tokens.push(format!("{c}</w>"));
    }
    tokens.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    tokens.push("<|startoftext|>".into());
    tokens.push("<|endoftext|>".into());
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), serde_json::Value::from(i)))
        .collect();
    let mut m = String::from("#version: 0.2\n");
    for (a, b) in merges {
        m.push_str(&format!("{a} {b}\n"));
    }
    write(
        &dir.join("vocab.json"),
        &serde_json::Value::Object(vocab).to_string(),
    )?;
    write(&dir.join("merges.txt"), &m)?;
    // The file must parse as the BPE the loader builds.
    BPE::from_file(
        &dir.join("vocab.json").to_string_lossy(),
        &dir.join("merges.txt").to_string_lossy(),
    )
    .build()
    .map_err(|e| fail("CLIP tokenizer", e))?;
    Ok(tokens.len())
}

fn t5_encoder(dir: &Path, vocab: usize) -> Result<(), ModelError> {
    let json = serde_json::json!({
        "architectures": ["T5EncoderModel"],
        "vocab_size": vocab,
        "d_model": T5_WIDTH,
        "d_kv": 8,
        "d_ff": 64,
        "num_layers": 2,
        "num_heads": 4,
        "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 32,
        "dropout_rate": 0.1,
        "layer_norm_epsilon": 1e-6,
        "initializer_factor": 1.0,
        "feed_forward_proj": "gated-gelu",
        "is_encoder_decoder": true,
        "tie_word_embeddings": false,
        "pad_token_id": 0,
        "eos_token_id": 1,
    });
    write(&dir.join("config.json"), &json.to_string())?;
    let cfg: t5::Config = serde_json::from_value(json).map_err(|e| fail("T5 config", e))?;
    let vm = VarMap::new();
    let vb = seeded(&vm);
    // The released checkpoints name the embedding `shared.weight`.
    vb.get_with_hints(
        (vocab, T5_WIDTH),
        "shared.weight",
        Init::Randn {
            mean: 0.0,
            stdev: 1.0,
        },
    )?;
    t5::T5EncoderModel::load(vb, &cfg)?;
    // candle's T5 asks for its RMS norms' weights without an initialiser, so a fresh
    // VarMap holds zeros there and the encoder's states would all be zero: ones, as T5's.
    {
        let vars = vm
            .data()
            .lock()
            .map_err(|_| fail("T5 weights", "a panic poisoned the VarMap"))?;
        for (name, var) in vars.iter() {
            if name.ends_with("layer_norm.weight") {
                var.set(&Tensor::ones(var.dims(), DType::F32, &Device::Cpu)?)?;
            }
        }
    }
    save(&vm, &dir.join("model.safetensors"))
}

fn clip_encoder(dir: &Path, vocab: usize) -> Result<(), ModelError> {
    let json = serde_json::json!({
        "architectures": ["CLIPTextModel"],
        "vocab_size": vocab,
        "hidden_size": CLIP_WIDTH,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": CLIP_TOKENS,
        "projection_dim": CLIP_WIDTH,
        "hidden_act": "quick_gelu",
    });
    write(&dir.join("config.json"), &json.to_string())?;
    let cfg = clip::ClipTextConfig {
        vocab_size: vocab,
        embed_dim: CLIP_WIDTH,
        activation: clip::Activation::QuickGelu,
        intermediate_size: 64,
        max_position_embeddings: CLIP_TOKENS,
        pad_with: None,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        projection_dim: CLIP_WIDTH,
    };
    let vm = VarMap::new();
    let vb = seeded(&vm);
    clip::ClipTextTransformer::new(vb.pp("text_model"), &cfg)?;
    save(&vm, &dir.join("model.safetensors"))
}

fn vae(dir: &Path) -> Result<(), ModelError> {
    let json = serde_json::json!({
        "_class_name": "AutoencoderKL",
        "in_channels": 3,
        "out_channels": 3,
        "block_out_channels": [16, 16, 16, 16],
        "layers_per_block": 1,
        "latent_channels": 16,
        "norm_num_groups": 8,
        "use_quant_conv": false,
        "use_post_quant_conv": false,
        "scaling_factor": 0.3611,
        "shift_factor": 0.1159,
    });
    write(&dir.join("config.json"), &json.to_string())?;
    let vm = VarMap::new();
    let vb = seeded(&vm);
    sd::AutoEncoderKL::new(
        vb,
        3,
        3,
        sd::AutoEncoderKLConfig {
            block_out_channels: vec![16, 16, 16, 16],
            layers_per_block: 1,
            latent_channels: 16,
            norm_num_groups: 8,
            use_quant_conv: false,
            use_post_quant_conv: false,
        },
    )?;
    save(&vm, &dir.join("diffusion_pytorch_model.safetensors"))
}
