//! The text side of the FLUX pipeline: Hugging Face tokenizer files and the T5 and CLIP text
//! encoders of candle-transformers, read from diffusers' folders (`tokenizer/`,
//! `tokenizer_2/`, `text_encoder/`, `text_encoder_2/`).

use std::path::Path;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::clip::text_model as clip;
use candle_transformers::models::t5;
use tokenizers::Tokenizer;

use crate::families::joint::denoiser::{EncodedPrompt, PromptEncoder};
use crate::io::folder::{config, weights, weights_in};
use crate::ModelError;

fn input(msg: String) -> ModelError {
    ModelError::Input(msg)
}

/// A tokenizer that always yields `len` tokens: the prompt's, then padding.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    len: usize,
    pad_id: u32,
    pad: String,
    what: String,
}

impl TextTokenizer {
    /// Opens the tokenizer in `dir`: its `tokenizer.json`, or (CLIP's slow-tokenizer files)
    /// `vocab.json` and `merges.txt`. The padding token is `tokenizer_config.json`'s
    /// `pad_token` where there is one, else `pad` (T5: `<pad>`; CLIP pads with
    /// `<|endoftext|>`, SD3's CLIP-G with `!`).
    pub fn open(dir: &Path, len: usize, pad: &str) -> Result<Self, ModelError> {
        let configured = pad_token(dir)?;
        let pad = configured.as_deref().unwrap_or(pad);
        let json = dir.join("tokenizer.json");
        let mut inner = if json.is_file() {
            Tokenizer::from_file(&json).map_err(|e| input(format!("{}: {e}", json.display())))?
        } else if dir.join("vocab.json").is_file() && dir.join("merges.txt").is_file() {
            clip_bpe(dir)?
        } else {
            return Err(input(format!(
                "{} has neither tokenizer.json nor vocab.json + merges.txt",
                dir.display()
            )));
        };
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| input(format!("{}: {e}", dir.display())))?;
        let pad_id = inner.token_to_id(pad).ok_or_else(|| {
            input(format!(
                "the tokenizer in {} has no padding token {pad:?}",
                dir.display()
            ))
        })?;
        if len == 0 {
            return Err(input("a tokenizer length of 0 tokens".into()));
        }
        Ok(Self {
            inner,
            len,
            pad_id,
            pad: pad.into(),
            what: dir.display().to_string(),
        })
    }

    /// The prompt's token ids and token strings (special tokens included), padded to the
    /// fixed length. A prompt longer than that is an error, not silently cut.
    pub fn encode(&self, text: &str) -> Result<(Vec<u32>, Vec<String>), ModelError> {
        let (mut ids, mut pieces) = self.encode_unpadded(text)?;
        ids.resize(self.len, self.pad_id);
        pieces.resize(self.len, self.pad.clone());
        Ok((ids, pieces))
    }

    /// [`TextTokenizer::encode`] without the padding.
    pub fn encode_unpadded(&self, text: &str) -> Result<(Vec<u32>, Vec<String>), ModelError> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| input(format!("tokenizer {}: {e}", self.what)))?;
        let (ids, pieces) = (enc.get_ids().to_vec(), enc.get_tokens().to_vec());
        if ids.len() > self.len {
            return Err(input(format!(
                "the prompt is {} tokens for the tokenizer in {}; at most {} are read",
                ids.len(),
                self.what,
                self.len
            )));
        }
        Ok((ids, pieces))
    }

    /// The padding token.
    pub fn pad(&self) -> &str {
        &self.pad
    }

    /// Tokens per prompt.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a tokenizer yields at least one token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `pad_token` of `dir/tokenizer_config.json` (a string, or an object with `content`).
fn pad_token(dir: &Path) -> Result<Option<String>, ModelError> {
    let p = dir.join("tokenizer_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&p).map_err(|e| input(format!("{}: {e}", p.display())))?,
    )
    .map_err(|e| input(format!("{}: {e}", p.display())))?;
    Ok(match &v["pad_token"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    })
}

/// CLIP's byte-level BPE from `vocab.json` and `merges.txt` (what diffusers folders ship for
/// FLUX's `tokenizer/`): NFC, runs of whitespace to one space, lower case; CLIP's word
/// pattern; byte-level symbols; words end in `</w>`; `<|startoftext|> ... <|endoftext|>`.
fn clip_bpe(dir: &Path) -> Result<Tokenizer, ModelError> {
    use tokenizers::models::bpe::BPE;
    use tokenizers::normalizers::replace::ReplacePattern;
    use tokenizers::normalizers::{Lowercase, Replace, Sequence, NFC};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::SplitDelimiterBehavior;
    let fail = |e: tokenizers::Error| input(format!("CLIP tokenizer in {}: {e}", dir.display()));
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    let bpe = BPE::from_file(&vocab.to_string_lossy(), &merges.to_string_lossy())
        .unk_token("<|endoftext|>".into())
        .end_of_word_suffix("</w>".into())
        .build()
        .map_err(fail)?;
    let mut tok = Tokenizer::new(bpe);
    let spaces = Replace::new(ReplacePattern::Regex(r"\s+".into()), " ").map_err(fail)?;
    tok.with_normalizer(Some(Sequence::new(vec![
        NFC.into(),
        spaces.into(),
        Lowercase.into(),
    ])))
    .map_err(fail)?;
    let words = Split::new(
        SplitPattern::Regex(
            r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"
                .into(),
        ),
        SplitDelimiterBehavior::Removed,
        true,
    )
    .map_err(fail)?;
    tok.with_pre_tokenizer(Some(PreSequence::new(vec![
        words.into(),
        ByteLevel::new(false, true, false).into(),
    ])));
    let special = |t: &str| {
        tok.token_to_id(t)
            .ok_or_else(|| input(format!("{} has no {t}", vocab.display())))
    };
    let (bos, eos) = (special("<|startoftext|>")?, special("<|endoftext|>")?);
    let post = TemplateProcessing::builder()
        .try_single("<|startoftext|> $A <|endoftext|>")
        .map_err(|e| input(format!("CLIP template: {e}")))?
        .special_tokens(vec![("<|startoftext|>", bos), ("<|endoftext|>", eos)])
        .build()
        .map_err(|e| input(format!("CLIP template: {e}")))?;
    tok.with_post_processor(Some(post));
    Ok(tok)
}

/// What we read of a CLIP text model's `config.json` (transformers' `CLIPTextConfig`), for
/// ours and for candle's.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ClipJson {
    pub(crate) vocab_size: usize,
    pub(crate) hidden_size: usize,
    pub(crate) intermediate_size: usize,
    pub(crate) num_hidden_layers: usize,
    pub(crate) num_attention_heads: usize,
    pub(crate) max_position_embeddings: usize,
    #[serde(default)]
    pub(crate) projection_dim: usize,
    #[serde(default = "quick_gelu")]
    pub(crate) hidden_act: String,
    #[serde(default = "eps")]
    pub(crate) layer_norm_eps: f64,
}

fn quick_gelu() -> String {
    "quick_gelu".into()
}

fn eps() -> f64 {
    1e-5
}

/// CLIP's text transformer (FLUX: CLIP ViT-L/14's), whose pooled output is the final state
/// of the end-of-text token.
pub(crate) struct ClipText {
    model: clip::ClipTextTransformer,
    tokenizer: TextTokenizer,
    width: usize,
    device: Device,
}

impl ClipText {
    pub(crate) fn load(
        weights_dir: &Path,
        tokenizer_dir: &Path,
        dev: &Device,
    ) -> Result<Self, ModelError> {
        let c: ClipJson = config(weights_dir)?;
        if c.hidden_act != "quick_gelu" {
            return Err(input(format!(
                "{}: hidden_act {:?}; candle's CLIP text model runs quick_gelu (CLIP ViT-L/14)",
                weights_dir.join("config.json").display(),
                c.hidden_act
            )));
        }
        let cfg = clip::ClipTextConfig {
            vocab_size: c.vocab_size,
            embed_dim: c.hidden_size,
            activation: clip::Activation::QuickGelu,
            intermediate_size: c.intermediate_size,
            max_position_embeddings: c.max_position_embeddings,
            pad_with: None,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            projection_dim: c.projection_dim,
        };
        let vb = weights(weights_dir, dev)?;
        let model = clip::ClipTextTransformer::new(vb.pp("text_model"), &cfg).map_err(|e| {
            input(format!(
                "CLIP text encoder in {}: {e}",
                weights_dir.display()
            ))
        })?;
        let tokenizer =
            TextTokenizer::open(tokenizer_dir, c.max_position_embeddings, "<|endoftext|>")?;
        Ok(Self {
            model,
            tokenizer,
            width: c.hidden_size,
            device: dev.clone(),
        })
    }

    /// The pooled vector of `prompt`: the final (layer-normed) state at the first position
    /// of the largest token id, which is CLIP's end-of-text token (as transformers reads it).
    pub(crate) fn pooled(&self, prompt: &str) -> Result<Tensor, ModelError> {
        let (ids, _) = self.tokenizer.encode(prompt)?;
        let eos = ids
            .iter()
            .enumerate()
            .fold(0, |best, (i, &id)| if id > ids[best] { i } else { best });
        let x = Tensor::from_vec(ids, (1, self.tokenizer.len()), &self.device)?;
        let states = self.model.forward_with_mask(&x, usize::MAX)?;
        Ok(states.squeeze(0)?.get(eos)?)
    }
}

/// T5's encoder (FLUX: T5 v1.1 XXL's), whose final states are the transformer's text input.
pub(crate) struct T5Text {
    model: Mutex<t5::T5EncoderModel>,
    tokenizer: TextTokenizer,
    width: usize,
    device: Device,
}

impl std::fmt::Debug for T5Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("T5Text")
            .field("tokens", &self.tokens())
            .field("width", &self.width())
            .finish()
    }
}

impl T5Text {
    /// `len`: the padded prompt length (FLUX.1 dev 512, schnell 256). The encoder computes
    /// in `dtype` (F32, or BF16 for the 4.7B-parameter T5 v1.1 XXL on a GPU); its states come
    /// out in f32.
    pub(crate) fn load(
        weights_dir: &Path,
        tokenizer_dir: &Path,
        len: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<Self, ModelError> {
        let cfg: t5::Config = config(weights_dir)?;
        let vb = weights_in(weights_dir, dtype, dev)?;
        let model = t5::T5EncoderModel::load(vb, &cfg)
            .map_err(|e| input(format!("T5 encoder in {}: {e}", weights_dir.display())))?;
        Ok(Self {
            model: Mutex::new(model),
            tokenizer: TextTokenizer::open(tokenizer_dir, len, "<pad>")?,
            width: cfg.d_model,
            device: dev.clone(),
        })
    }

    /// Width of the states.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Tokens per prompt.
    pub(crate) fn tokens(&self) -> usize {
        self.tokenizer.len()
    }

    /// The prompt's pieces and final states with the padding masked, `len x d_model`: the
    /// encoder runs on the prompt's tokens alone (what masking the padded keys computes
    /// for them) and the padding's rows are zero, as Stable Audio's pipeline has them.
    pub(crate) fn encode_masked(&self, prompt: &str) -> Result<(Vec<String>, Tensor), ModelError> {
        let (ids, mut pieces) = self.tokenizer.encode_unpadded(prompt)?;
        let n = ids.len();
        let len = self.tokenizer.len();
        pieces.resize(len, self.tokenizer.pad().to_string());
        if n == 0 {
            return Ok((
                pieces,
                Tensor::zeros((len, self.width), DType::F32, &self.device)?,
            ));
        }
        let x = Tensor::from_vec(ids, (1, n), &self.device)?;
        let mut model = self
            .model
            .lock()
            .map_err(|_| input("the T5 encoder was poisoned by a panic".into()))?;
        let states = model.forward(&x)?.squeeze(0)?.to_dtype(DType::F32)?;
        Ok((pieces, states.pad_with_zeros(0, 0, len - n)?))
    }

    /// The prompt's pieces and final states, `len x d_model` (padding included, no mask: as
    /// FLUX's and SD3's pipelines run it).
    pub(crate) fn encode(&self, prompt: &str) -> Result<(Vec<String>, Tensor), ModelError> {
        let (ids, pieces) = self.tokenizer.encode(prompt)?;
        let x = Tensor::from_vec(ids, (1, self.tokenizer.len()), &self.device)?;
        let mut model = self
            .model
            .lock()
            .map_err(|_| input("the T5 encoder was poisoned by a panic".into()))?;
        let states = model.forward(&x)?;
        Ok((pieces, states.squeeze(0)?.to_dtype(DType::F32)?))
    }
}

/// FLUX's prompt encoder: T5 states (and pieces, for the saliency words) and CLIP's pooled
/// vector.
pub struct FluxText {
    t5: T5Text,
    clip: ClipText,
}

impl std::fmt::Debug for FluxText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FluxText")
            .field("t5_tokens", &self.t5.tokenizer.len())
            .field("t5_width", &self.t5.width)
            .field("clip_width", &self.clip.width)
            .finish()
    }
}

impl FluxText {
    /// The encoders of a diffusers FLUX folder: `text_encoder/` + `tokenizer/` (CLIP) and
    /// `text_encoder_2/` + `tokenizer_2/` (T5), T5 padded to `t5_tokens` and computing in
    /// `t5_dtype`.
    pub fn load(
        dir: &Path,
        t5_tokens: usize,
        t5_dtype: DType,
        dev: &Device,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            t5: T5Text::load(
                &dir.join("text_encoder_2"),
                &dir.join("tokenizer_2"),
                t5_tokens,
                t5_dtype,
                dev,
            )?,
            clip: ClipText::load(&dir.join("text_encoder"), &dir.join("tokenizer"), dev)?,
        })
    }

    /// Widths of the T5 states and of CLIP's pooled vector.
    pub fn widths(&self) -> (usize, usize) {
        (self.t5.width, self.clip.width)
    }
}

impl PromptEncoder for FluxText {
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let (pieces, states) = self.t5.encode(prompt)?;
        Ok(EncodedPrompt {
            pieces,
            states,
            pooled: self.clip.pooled(prompt)?,
        })
    }

    fn tokens(&self) -> usize {
        self.t5.tokenizer.len()
    }
}
