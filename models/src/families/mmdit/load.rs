//! SD3 / SD3.5 checkpoints: diffusers' `transformer/` folder (one file or shards) and
//! Stability's single file (`joint_blocks.N.x_block...`, read through a mapping), in f32,
//! f16 or bf16.

use super::{Mmdit, MmditConfig};
use crate::io::shards::{Checkpoint, Shards, Source};
use crate::ModelError;

/// How an SD3 checkpoint names its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MmditLayout {
    /// diffusers' `SD3Transformer2DModel` (a `transformer/` folder).
    Diffusers,
    /// Stability's single file (`sd3.5_medium.safetensors`): `joint_blocks.N.x_block...`
    /// after a prefix (`model.diffusion_model.` in the released files).
    Stability {
        /// Prefix before every name.
        prefix: String,
    },
}

/// One or more safetensors files holding an SD3 / SD3.5 transformer.
pub type MmditCheckpoint = Checkpoint<MmditLayout>;

impl Checkpoint<MmditLayout> {
    /// Opens a safetensors file or a (diffusers) folder of shards.
    pub fn open(path: &std::path::Path) -> Result<Self, ModelError> {
        let files = Shards::open(path)?;
        let layout = match files.naming(
            path,
            "an SD3",
            &["pos_embed.proj.weight"],
            ("x_embedder.proj.weight", "Stability"),
        )? {
            None => MmditLayout::Diffusers,
            Some(prefix) => MmditLayout::Stability { prefix },
        };
        // Counted before the mapping is known: a block's first norm is named alike in every
        // block of either layout.
        let depth = (0..)
            .take_while(|i| {
                let name = format!("transformer_blocks.{i}.norm1.linear.weight");
                files.shape(&layout_source(&layout, 0, &name)).is_some()
            })
            .count();
        // The mapping needs it: the last block's text modulation is stored differently.
        let named = layout.clone();
        Ok(Self::new(files, layout, move |name| {
            layout_source(&named, depth, name)
        }))
    }

    /// Joint blocks: a block's first norm is named alike in every block of either layout.
    fn depth(&self) -> usize {
        (0..)
            .take_while(|i| {
                self.weights()
                    .shape(&format!("transformer_blocks.{i}.norm1.linear.weight"))
                    .is_some()
            })
            .count()
    }

    /// The architecture, from the tensors' shapes. The head count comes from the Q/K norms'
    /// width where the model has them; otherwise from `heads`, or heads of 64 as in every
    /// released SD3.
    pub fn config(&self, heads: Option<usize>) -> Result<MmditConfig, ModelError> {
        let what = format!("SD3 checkpoint, {:?} layout", self.layout());
        let need = |n: &str, rank: usize| self.weights().need(n, rank, &what);
        let proj = need("pos_embed.proj.weight", 4)?;
        let (hidden, in_channels, patch) = (proj[0], proj[1], proj[2]);
        let cells = need("pos_embed.pos_embed", 3)?[1];
        let pos_max = (cells as f64).sqrt().round() as usize;
        if pos_max * pos_max != cells || patch == 0 {
            return Err(ModelError::Input(format!(
                "SD3 checkpoint: {cells} learned positions are not a square grid"
            )));
        }
        let qk = self
            .weights()
            .shape("transformer_blocks.0.attn.norm_q.weight");
        let head_dim = match (&qk, heads) {
            (Some(s), _) => s[0],
            (None, Some(h)) if h > 0 => hidden / h,
            _ => 64,
        };
        if head_dim == 0 || hidden % head_dim != 0 {
            return Err(ModelError::Input(format!(
                "SD3 checkpoint: width {hidden} is not a multiple of the head width {head_dim}"
            )));
        }
        let cfg = MmditConfig {
            patch,
            in_channels,
            out_channels: need("proj_out.weight", 2)?[0] / (patch * patch),
            hidden,
            heads: hidden / head_dim,
            depth: self.depth(),
            pos_max,
            context_in_dim: need("context_embedder.weight", 2)?[1],
            pooled_dim: need("time_text_embed.text_embedder.linear_1.weight", 2)?[1],
            qk_norm: qk.is_some(),
            dual: (0..self.depth())
                .filter(|i| {
                    self.weights()
                        .shape(&format!("transformer_blocks.{i}.attn2.to_q.weight"))
                        .is_some()
                })
                .collect(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The transformer on `dev`, its sizes read from the checkpoint (`heads`: see
    /// [`MmditCheckpoint::config`]).
    pub fn load(
        &self,
        heads: Option<usize>,
        dev: &candle_core::Device,
    ) -> Result<Mmdit, ModelError> {
        self.load_in(heads, candle_core::DType::F32, dev)
    }

    /// [`MmditCheckpoint::load`] with the linear layers' weights in `compute` (F32, BF16 or
    /// F16), read from the file in that dtype; every other tensor and all activations stay
    /// f32.
    pub fn load_in(
        &self,
        heads: Option<usize>,
        compute: candle_core::DType,
        dev: &candle_core::Device,
    ) -> Result<Mmdit, ModelError> {
        crate::io::shards::dtype_for("", &[], compute)?;
        let vb = self.weights().var_builder(compute, dev);
        Mmdit::load(self.config(heads)?, &vb)
    }
}

/// Where a checkpoint of `layout` with `depth` joint blocks keeps diffusers' tensor `name`.
fn layout_source(layout: &MmditLayout, depth: usize, name: &str) -> Source {
    match layout {
        MmditLayout::Diffusers => Source::One(name.into()),
        MmditLayout::Stability { prefix } => stability_source(name, prefix, depth),
    }
}

/// Where diffusers' tensor `name` lives in Stability's single-file layout (the blocks'
/// fused QKV split in thirds; the continuous norms' (scale, shift) stored as (shift, scale)).
fn stability_source(name: &str, prefix: &str, depth: usize) -> Source {
    let one = |n: String| Source::One(format!("{prefix}{n}"));
    let (stem, w) = match name.rsplit_once('.') {
        Some((s, x)) if x == "weight" || x == "bias" => (s, x),
        _ => (name, ""),
    };
    let top = match stem {
        "pos_embed.pos_embed" => return one("pos_embed".into()),
        "pos_embed.proj" => "x_embedder.proj",
        "time_text_embed.timestep_embedder.linear_1" => "t_embedder.mlp.0",
        "time_text_embed.timestep_embedder.linear_2" => "t_embedder.mlp.2",
        "time_text_embed.text_embedder.linear_1" => "y_embedder.mlp.0",
        "time_text_embed.text_embedder.linear_2" => "y_embedder.mlp.2",
        "context_embedder" => "context_embedder",
        "proj_out" => "final_layer.linear",
        "norm_out.linear" => {
            return Source::Swap(format!("{prefix}final_layer.adaLN_modulation.1.{w}"))
        }
        _ => "",
    };
    if !top.is_empty() {
        return one(format!("{top}.{w}"));
    }
    let Some(rest) = stem.strip_prefix("transformer_blocks.") else {
        return one(name.into());
    };
    let (idx, part) = rest.split_once('.').unwrap_or((rest, ""));
    let last = idx.parse::<usize>().is_ok_and(|i| i + 1 == depth);
    let b = format!("{prefix}joint_blocks.{idx}");
    let third = |fused: &str, i: usize| Source::Part(format!("{b}.{fused}.{w}"), i, 3);
    let at = |n: &str| Source::One(format!("{b}.{n}.{w}"));
    match part {
        "norm1.linear" => at("x_block.adaLN_modulation.1"),
        "norm1_context.linear" if last => {
            Source::Swap(format!("{b}.context_block.adaLN_modulation.1.{w}"))
        }
        "norm1_context.linear" => at("context_block.adaLN_modulation.1"),
        "attn.to_q" => third("x_block.attn.qkv", 0),
        "attn.to_k" => third("x_block.attn.qkv", 1),
        "attn.to_v" => third("x_block.attn.qkv", 2),
        "attn.add_q_proj" => third("context_block.attn.qkv", 0),
        "attn.add_k_proj" => third("context_block.attn.qkv", 1),
        "attn.add_v_proj" => third("context_block.attn.qkv", 2),
        "attn2.to_q" => third("x_block.attn2.qkv", 0),
        "attn2.to_k" => third("x_block.attn2.qkv", 1),
        "attn2.to_v" => third("x_block.attn2.qkv", 2),
        "attn.to_out.0" => at("x_block.attn.proj"),
        "attn.to_add_out" => at("context_block.attn.proj"),
        "attn2.to_out.0" => at("x_block.attn2.proj"),
        "attn.norm_q" => at("x_block.attn.ln_q"),
        "attn.norm_k" => at("x_block.attn.ln_k"),
        "attn.norm_added_q" => at("context_block.attn.ln_q"),
        "attn.norm_added_k" => at("context_block.attn.ln_k"),
        "attn2.norm_q" => at("x_block.attn2.ln_q"),
        "attn2.norm_k" => at("x_block.attn2.ln_k"),
        "ff.net.0.proj" => at("x_block.mlp.fc1"),
        "ff.net.2" => at("x_block.mlp.fc2"),
        "ff_context.net.0.proj" => at("context_block.mlp.fc1"),
        "ff_context.net.2" => at("context_block.mlp.fc2"),
        _ => one(name.into()),
    }
}
