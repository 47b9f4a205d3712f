//! SD3 / SD3.5's prompt encoder: CLIP-L and CLIP-G (penultimate states, projected pooled
//! vectors) and T5, joined as diffusers' `StableDiffusion3Pipeline` joins them.

use std::path::Path;

use candle_core::{Device, Tensor};

use super::clip::ClipWithProjection;
use super::text::T5Text;
use crate::families::joint::denoiser::{EncodedPrompt, PromptEncoder};
use crate::ModelError;

/// The piece shown for CLIP's rows: special (no word), so that a word's saliency column is
/// made of its T5 pieces only and no word is counted twice.
pub const CLIP_PIECE: &str = "<|clip|>";

/// CLIP-L + CLIP-G + T5. The text states are CLIP-L's and CLIP-G's penultimate states side
/// by side, zero-padded to T5's width, then T5's states below them (`77 + 256` rows for the
/// released models); the pooled vector is both CLIPs' projected vectors side by side.
pub struct Sd3Text {
    clip_l: ClipWithProjection,
    clip_g: ClipWithProjection,
    t5: T5Text,
}

impl std::fmt::Debug for Sd3Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sd3Text")
            .field("clip_l", &self.clip_l)
            .field("clip_g", &self.clip_g)
            .field("tokens", &self.tokens())
            .finish()
    }
}

impl Sd3Text {
    /// The encoders of a diffusers SD3 folder: `text_encoder/` + `tokenizer/` (CLIP-L),
    /// `text_encoder_2/` + `tokenizer_2/` (CLIP-G), `text_encoder_3/` + `tokenizer_3/` (T5,
    /// padded to `t5_tokens`, computing in `t5_dtype`).
    pub fn load(
        dir: &Path,
        t5_tokens: usize,
        t5_dtype: candle_core::DType,
        dev: &Device,
    ) -> Result<Self, ModelError> {
        let clip_l = ClipWithProjection::load(
            &dir.join("text_encoder"),
            &dir.join("tokenizer"),
            "<|endoftext|>",
            dev,
        )?;
        let clip_g = ClipWithProjection::load(
            &dir.join("text_encoder_2"),
            &dir.join("tokenizer_2"),
            "!",
            dev,
        )?;
        let t5 = T5Text::load(
            &dir.join("text_encoder_3"),
            &dir.join("tokenizer_3"),
            t5_tokens,
            t5_dtype,
            dev,
        )?;
        if clip_l.tokens() != clip_g.tokens() {
            return Err(ModelError::Input(format!(
                "{}: CLIP-L reads {} tokens and CLIP-G {}; SD3 joins them row by row",
                dir.display(),
                clip_l.tokens(),
                clip_g.tokens()
            )));
        }
        let clip_width = clip_l.widths().0 + clip_g.widths().0;
        if clip_width > t5.width() {
            return Err(ModelError::Input(format!(
                "{}: the CLIP states are {clip_width} wide together, wider than T5's {}",
                dir.display(),
                t5.width()
            )));
        }
        Ok(Self { clip_l, clip_g, t5 })
    }

    /// Widths of the joined text states (T5's) and of the pooled vector.
    pub fn widths(&self) -> (usize, usize) {
        (
            self.t5.width(),
            self.clip_l.widths().1 + self.clip_g.widths().1,
        )
    }
}

impl PromptEncoder for Sd3Text {
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let (sl, pl) = self.clip_l.encode(prompt)?;
        let (sg, pg) = self.clip_g.encode(prompt)?;
        let clip = Tensor::cat(&[sl, sg], 1)?;
        let (n, w) = clip.dims2()?;
        let clip = clip.pad_with_zeros(1, 0, self.t5.width() - w)?;
        let (t5_pieces, t5) = self.t5.encode(prompt)?;
        let mut pieces = vec![CLIP_PIECE.to_string(); n];
        pieces.extend(t5_pieces);
        Ok(EncodedPrompt {
            pieces,
            states: Tensor::cat(&[clip, t5], 0)?,
            pooled: Tensor::cat(&[pl, pg], 0)?,
        })
    }

    fn tokens(&self) -> usize {
        self.clip_l.tokens() + self.t5.tokens()
    }
}
