//! Stable Audio Open as a pipeline: the cosine schedule and the seconds'
//! embeddings against diffusers (golden file from `models/reference/sao_pipeline_golden.py`),
//! T5 with its padding masked against candle's T5 on the prompt alone, and the whole
//! small random pipeline as a `Denoiser` that makes stereo sound.

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use flashdiff_models::encoders::text::TextTokenizer;
use flashdiff_models::families::flux::PromptEncoder;
use flashdiff_models::families::joint::denoiser::Schedule;
use flashdiff_models::pipelines::audio::{SaoText, SECONDS_PIECE, T5_TOKENS};
use flashdiff_models::pipelines::{self as pipeline, tiny, PipelineOptions, AUDIO};
use flashdiff_models::Kind;

use common::{max_diff, t};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-sao-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    tiny::write_sao(&d).unwrap();
    d
}

#[test]
fn cosine_schedule_equals_diffusers_timesteps() {
    let g = common::golden("sao_pipeline_golden");
    let want = t(&g, "golden.timesteps").to_vec1::<f32>().unwrap();
    let s = Schedule::Cosine {
        min: 0.3,
        max: 500.0,
    };
    for (n, w) in want.iter().enumerate() {
        let got = s.time(n as u32, 10, 16);
        assert!((got - w).abs() <= 1e-6, "step {n}: {got} vs diffusers' {w}");
    }
    assert_eq!(s.time(10, 10, 16), 0.0, "the last step goes to sigma 0");
}

#[test]
fn seconds_embeddings_equal_diffusers_and_padding_is_masked() {
    let d = scratch("text");
    std::fs::copy(
        common::reference("sao_pipeline_golden"),
        d.join("projection_model/diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let g = common::golden("sao_pipeline_golden");
    let text = SaoText::load(&d, 0.05, DType::F32, &Device::Cpu).unwrap();
    let e = text.encode("a dog barking").unwrap();
    let want = Tensor::cat(&[t(&g, "golden.start"), t(&g, "golden.end")], 0).unwrap();
    let diff = max_diff(&e.pooled, &want);
    assert!(
        diff <= 1e-5,
        "global vector differs from diffusers' by {diff}"
    );
    // The seconds are the cross-attention input's last two rows.
    let n = text.tokens();
    assert_eq!(n, T5_TOKENS + 2);
    assert_eq!(e.states.dims(), [n, 32]);
    let rows = e.states.narrow(0, n - 2, 2).unwrap().flatten_all().unwrap();
    assert!(max_diff(&rows, &want) <= 1e-5);
    assert_eq!(e.pieces[n - 1], SECONDS_PIECE);
    // Past 512 s the embedder clamps, as diffusers'.
    let far = SaoText::load(&d, 700.0, DType::F32, &Device::Cpu).unwrap();
    let end = far.encode("x").unwrap().pooled.narrow(0, 32, 32).unwrap();
    assert!(max_diff(&end, &t(&g, "golden.end_700")) <= 1e-5);

    // T5 on the prompt's tokens alone (what masking the padded keys computes for them),
    // through candle's own loader; the padding's rows zero.
    let dir = d.join("text_encoder");
    let mut reference = common::candle_t5(&dir);
    let tok = TextTokenizer::open(&d.join("tokenizer"), T5_TOKENS, "<pad>").unwrap();
    let (ids, _) = tok.encode_unpadded("a dog barking").unwrap();
    let k = ids.len();
    let x = Tensor::from_vec(ids, (1, k), &Device::Cpu).unwrap();
    let alone = reference.forward(&x).unwrap().squeeze(0).unwrap();
    assert!(max_diff(&e.states.narrow(0, 0, k).unwrap(), &alone) <= 1e-5);
    let pad = e.states.narrow(0, k, T5_TOKENS - k).unwrap();
    assert_eq!(common::max_abs(&pad), 0.0, "padded rows must be zero");
    // With padding in the encoder's input (unmasked) the prompt's rows would differ.
    let (padded, _) = tok.encode("a dog barking").unwrap();
    let x = Tensor::from_vec(padded, (1, T5_TOKENS), &Device::Cpu).unwrap();
    let unmasked = reference.forward(&x).unwrap().squeeze(0).unwrap();
    assert!(max_diff(&unmasked.narrow(0, 0, k).unwrap(), &alone) > 1e-4);
    // The unconditional input: every row zero, the same global vector.
    let u = text.unconditional().unwrap().unwrap();
    assert_eq!(common::max_abs(&u.states), 0.0);
    assert_eq!(max_diff(&u.pooled, &e.pooled), 0.0);
    std::fs::remove_dir_all(&d).ok();
}

fn opts(seconds: Option<f32>) -> PipelineOptions {
    PipelineOptions {
        seconds,
        ..PipelineOptions::new((0, 0))
    }
}

#[test]
fn the_pipeline_is_an_audio_denoiser_that_decodes_stereo() {
    let d = scratch("pipe");
    let m = pipeline::load(AUDIO, &d, &opts(Some(0.05)), &Device::Cpu).unwrap();
    assert_eq!(m.kind(), Kind::Audio);
    assert_eq!(m.name(), "stable-audio-open");
    let dims = m.dims().clone();
    assert_eq!(
        (dims.grid.frames, dims.grid.height, dims.grid.width),
        (1, 1, 16),
        "the whole window of latent frames"
    );
    assert_eq!(dims.channels, 8);
    let c = m.condition("a dog barking in the rain").unwrap();
    assert_eq!(c.words, ["a", "dog", "barking", "in", "the", "rain"]);
    assert!(c.salient[1], "\"dog\" is salient: {:?}", c.salient);
    // Cosine times, decreasing to 0.
    let times: Vec<f32> = (0..=20).map(|n| m.time(n, 20)).collect();
    assert!(
        times.windows(2).all(|w| w[0] > w[1]) && times[20] == 0.0,
        "{times:?}"
    );
    let s = m.decode(&vec![0.1; 16 * 8]).unwrap();
    assert_eq!((s.audio_channels, s.sample_rate), (2, 8000));
    assert_eq!(
        s.audio.len(),
        2 * 400,
        "0.05 s of stereo at 8 kHz, cut from 64 ms"
    );
    // Guided by default (7.0): the step conditioning holds both passes' global tokens.
    assert_eq!(dims.cond_len, 2 * 32);
    let unguided = pipeline::load(
        AUDIO,
        &d,
        &PipelineOptions {
            guidance: Some(1.0),
            ..opts(None)
        },
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(unguided.dims().cond_len, 32);
    assert_eq!(
        unguided.decode(&vec![0.1; 16 * 8]).unwrap().audio.len(),
        2 * 512,
        "no --seconds: the whole 64 ms window"
    );
    // Bad requests.
    let err = |o: PipelineOptions| {
        pipeline::load(AUDIO, &d, &o, &Device::Cpu)
            .unwrap_err()
            .to_string()
    };
    assert!(err(opts(Some(1.0))).contains("at most 0.06 s"));
    assert!(err(opts(Some(-1.0))).contains("at most"));
    std::fs::remove_file(d.join("projection_model/config.json")).unwrap();
    assert!(err(opts(None)).contains("projection_model"));
    std::fs::remove_dir_all(&d).ok();
}

/// stable-audio-tools' name of a tensor of the small diffusers folder (`part`: which
/// subfolder), with its value: the release's single-file layout, written out here as the
/// release stores it (see `models/reference/sao_official.py` for the DiT's part).
fn release_tensors(d: &std::path::Path) -> Vec<(String, Tensor)> {
    use flashdiff_models::decoders::oobleck::official_name;
    let read = |sub: &str| {
        let w = flashdiff_models::io::weights::Weights::open(
            &d.join(sub).join("diffusion_pytorch_model.safetensors"),
        )
        .unwrap();
        let mut v: Vec<(String, Tensor)> = w.names().map(|n| (n.to_string(), t(&w, n))).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let mut out = Vec::new();
    let dit: std::collections::HashMap<String, Tensor> = read("transformer").into_iter().collect();
    let mut dit = dit;
    let mut take = |n: &str| dit.remove(n).unwrap();
    let m = "model.model.";
    for i in 0..2 {
        let (b, l) = (
            format!("transformer_blocks.{i}."),
            format!("{m}transformer.layers.{i}."),
        );
        for (ours, theirs) in [
            ("norm1", "pre_norm"),
            ("norm2", "cross_attend_norm"),
            ("norm3", "ff_norm"),
        ] {
            out.push((
                format!("{l}{theirs}.gamma"),
                take(&format!("{b}{ours}.weight")),
            ));
            out.push((
                format!("{l}{theirs}.beta"),
                take(&format!("{b}{ours}.bias")),
            ));
        }
        let cat = |ts: Vec<Tensor>| Tensor::cat(&ts, 0).unwrap();
        let qkv = cat(["q", "k", "v"]
            .map(|x| take(&format!("{b}attn1.to_{x}.weight")))
            .to_vec());
        out.push((format!("{l}self_attn.to_qkv.weight"), qkv));
        out.push((
            format!("{l}self_attn.to_out.weight"),
            take(&format!("{b}attn1.to_out.0.weight")),
        ));
        out.push((
            format!("{l}cross_attn.to_q.weight"),
            take(&format!("{b}attn2.to_q.weight")),
        ));
        let kv = cat(["k", "v"]
            .map(|x| take(&format!("{b}attn2.to_{x}.weight")))
            .to_vec());
        out.push((format!("{l}cross_attn.to_kv.weight"), kv));
        out.push((
            format!("{l}cross_attn.to_out.weight"),
            take(&format!("{b}attn2.to_out.0.weight")),
        ));
        for x in ["0.proj.weight", "0.proj.bias", "2.weight", "2.bias"] {
            out.push((format!("{l}ff.ff.{x}"), take(&format!("{b}ff.net.{x}"))));
        }
    }
    let f = take("time_proj.weight");
    out.push((
        format!("{m}timestep_features.weight"),
        f.unsqueeze(1).unwrap(),
    ));
    for (ours, theirs) in [
        ("timestep_proj", "to_timestep_embed"),
        ("global_proj", "to_global_embed"),
        ("cross_attention_proj", "to_cond_embed"),
        ("proj_in", "transformer.project_in"),
        ("proj_out", "transformer.project_out"),
        ("preprocess_conv", "preprocess_conv"),
        ("postprocess_conv", "postprocess_conv"),
    ] {
        let names: Vec<String> = dit
            .keys()
            .filter(|k| k.starts_with(&format!("{ours}.")))
            .cloned()
            .collect();
        for n in names {
            let v = dit.remove(&n).unwrap();
            out.push((format!("{m}{theirs}{}", &n[ours.len()..]), v));
        }
    }
    assert!(
        dit.is_empty(),
        "unmapped: {:?}",
        dit.keys().collect::<Vec<_>>()
    );
    for (n, v) in read("projection_model") {
        let n = n
            .replace("start_number_conditioner", "seconds_start")
            .replace("end_number_conditioner", "seconds_total")
            .replace("time_positional_embedding", "embedder.embedding");
        out.push((format!("conditioner.conditioners.{n}"), v));
    }
    for (n, v) in read("vae") {
        let v = if n.ends_with(".alpha") || n.ends_with(".beta") {
            v.flatten_all().unwrap()
        } else {
            v
        };
        out.push((official_name(&n, 5), v));
    }
    out
}

/// The same small model as stable-audio-tools publishes it (one `model.safetensors`,
/// `model_config.json`, T5 beside it) makes the same sound as its diffusers folder.
#[test]
fn the_release_layout_makes_the_same_sound_as_the_diffusers_folder() {
    let d = scratch("diffusers");
    let r = std::env::temp_dir().join(format!("flashdiff-sao-release-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&r);
    std::fs::create_dir_all(&r).unwrap();
    for sub in ["text_encoder", "tokenizer"] {
        std::fs::create_dir_all(r.join(sub)).unwrap();
        for e in std::fs::read_dir(d.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), r.join(sub).join(e.file_name())).unwrap();
        }
    }
    let tensors = release_tensors(&d);
    let map: std::collections::HashMap<String, Tensor> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, r.join("model.safetensors")).unwrap();
    std::fs::write(
        r.join("model_config.json"),
        r#"{"sample_size": 512, "sample_rate": 8000, "model": {
            "pretransform": {"config": {"downsampling_ratio": 32}},
            "conditioning": {"configs": [
                {"id": "prompt", "type": "t5", "config": {"t5_model_name": "t5-base", "max_length": 128}},
                {"id": "seconds_start", "type": "number", "config": {"min_val": 0, "max_val": 512}},
                {"id": "seconds_total", "type": "number", "config": {"min_val": 0, "max_val": 512}}]},
            "diffusion": {"config": {"embed_dim": 32, "num_heads": 4}}}}"#,
    )
    .unwrap();
    // The release's VAE sizes are Stable Audio Open 1.0's unless vae/config.json says.
    std::fs::create_dir_all(r.join("vae")).unwrap();
    std::fs::copy(d.join("vae/config.json"), r.join("vae/config.json")).unwrap();
    let sound = |dir: &std::path::Path| {
        let m = pipeline::load(AUDIO, dir, &opts(Some(0.05)), &Device::Cpu).unwrap();
        let c = m.condition("a dog barking").unwrap();
        let ctx = Tensor::new(c.context.as_slice(), &Device::Cpu).unwrap();
        let cond = m.step_cond(&ctx, m.time(3, 10)).unwrap();
        let x = Tensor::ones((16, 8), DType::F32, &Device::Cpu).unwrap();
        let v = m
            .full_forward(
                &x,
                flashdiff_models::StepInput {
                    context: &ctx,
                    cond: &cond,
                },
                false,
            )
            .unwrap()
            .velocity;
        let audio = m.decode(&vec![0.2; 16 * 8]).unwrap().audio;
        (v.flatten_all().unwrap().to_vec1::<f32>().unwrap(), audio)
    };
    let (a, b) = (sound(&d), sound(&r));
    assert_eq!(a.0, b.0, "the DiT's velocity differs between the layouts");
    assert_eq!(a.1, b.1, "the decoded audio differs between the layouts");
    std::fs::remove_dir_all(&d).ok();
    std::fs::remove_dir_all(&r).ok();
}
