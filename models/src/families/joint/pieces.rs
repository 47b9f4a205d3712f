//! Words from subword tokens, for the saliency map of models with real tokenizers: the
//! partitioner's function-word filter works on whole words, and the engine's
//! saliency columns are words, while FLUX and SD3 attend to T5 SentencePiece pieces
//! ("▁red", "▁dish", "washer") and CLIP BPE tokens (`red</w>`, "dish", `washer</w>`).
//!
//! A piece that starts with "▁" (SentencePiece) begins a word; a token that ends in `</w>`
//! (CLIP) ends one; other pieces continue the current word. Special tokens (`<pad>`, `</s>`,
//! `<|startoftext|>`, ...) and pieces with nothing left once markers are removed belong to
//! no word.

use candle_core::{Device, Tensor};

/// The words a token sequence spells and, for each token, the word it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceWords {
    /// The words, in order.
    pub words: Vec<String>,
    /// Word of each token (`None` for special tokens and bare markers).
    pub word_of: Vec<Option<usize>>,
}

const SP: char = '\u{2581}';

fn is_special(p: &str) -> bool {
    (p.starts_with('<') && p.ends_with('>') && p.len() > 2) || p.starts_with("<|")
}

/// Reassembles words from `pieces` (one tokenizer's tokens, in order).
pub fn words_from_pieces<S: AsRef<str>>(pieces: &[S]) -> PieceWords {
    let mut words: Vec<String> = Vec::new();
    let mut word_of = Vec::with_capacity(pieces.len());
    // Whether the next piece continues the last word.
    let mut open = false;
    for p in pieces {
        let p = p.as_ref();
        if is_special(p) && !p.ends_with("</w>") {
            word_of.push(None);
            open = false;
            continue;
        }
        let starts = p.starts_with(SP);
        let (body, ends) = match p.strip_suffix("</w>") {
            Some(b) => (b, true),
            None => (p, false),
        };
        let body = body.trim_start_matches(SP);
        if body.is_empty() {
            // A bare "▁" starts a word its next piece spells; a bare "</w>" ends one.
            word_of.push(None);
            if starts || ends {
                open = false;
            }
            continue;
        }
        if starts || !open || words.is_empty() {
            words.push(body.to_string());
        } else if let Some(w) = words.last_mut() {
            w.push_str(body);
        }
        word_of.push(Some(words.len() - 1));
        open = !ends;
    }
    PieceWords { words, word_of }
}

impl PieceWords {
    /// `tokens x words` matrix with a 1 where a token belongs to a word: a `rows x tokens`
    /// attention map times it gives each row's attention mass per word.
    pub fn matrix(&self, dev: &Device) -> candle_core::Result<Tensor> {
        let (t, w) = (self.word_of.len(), self.words.len());
        let mut m = vec![0f32; t * w];
        for (i, o) in self.word_of.iter().enumerate() {
            if let Some(j) = o {
                m[i * w + j] = 1.0;
            }
        }
        Tensor::from_vec(m, (t, w), dev)
    }

    /// Whether each word is salient (not a function word).
    pub fn salient(&self) -> Vec<bool> {
        flashdiff_partitioner::salient_mask(&self.words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentencepiece_pieces_make_words() {
        let p = [
            "▁a", "▁red", "▁dish", "washer", "▁on", "▁the", "▁table", ".", "</s>", "<pad>",
        ];
        let w = words_from_pieces(&p);
        assert_eq!(w.words, ["a", "red", "dishwasher", "on", "the", "table."]);
        assert_eq!(
            w.word_of,
            [
                Some(0),
                Some(1),
                Some(2),
                Some(2),
                Some(3),
                Some(4),
                Some(5),
                Some(5),
                None,
                None
            ]
        );
        assert_eq!(w.salient(), [false, true, true, false, false, true]);
    }

    #[test]
    fn a_bare_marker_starts_the_next_piece_as_a_word() {
        let w = words_from_pieces(&["▁", "X", "ray", "▁cat"]);
        assert_eq!(w.words, ["Xray", "cat"]);
        assert_eq!(w.word_of, [None, Some(0), Some(0), Some(1)]);
    }

    #[test]
    fn clip_tokens_make_words() {
        let p = [
            "<|startoftext|>",
            "a</w>",
            "dish",
            "washer</w>",
            "<|endoftext|>",
        ];
        let w = words_from_pieces(&p);
        assert_eq!(w.words, ["a", "dishwasher"]);
        assert_eq!(w.word_of, [None, Some(0), Some(1), Some(1), None]);
    }

    #[test]
    fn the_matrix_sums_a_words_pieces() {
        let w = words_from_pieces(&["▁dish", "washer", "▁red", "</s>"]);
        let attn = Tensor::new(&[[0.1f32, 0.2, 0.3, 0.4]], &Device::Cpu).unwrap();
        let per_word = attn.matmul(&w.matrix(&Device::Cpu).unwrap()).unwrap();
        let v = per_word.to_vec2::<f32>().unwrap();
        assert!(
            (v[0][0] - 0.3).abs() < 1e-6 && (v[0][1] - 0.3).abs() < 1e-6,
            "{v:?}"
        );
    }

    #[test]
    fn nothing_and_only_specials_make_no_words() {
        assert!(words_from_pieces::<&str>(&[]).words.is_empty());
        let w = words_from_pieces(&["<pad>", "</s>", "▁"]);
        assert!(w.words.is_empty());
        assert_eq!(w.word_of, [None, None, None]);
    }
}
