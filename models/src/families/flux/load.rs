//! FLUX checkpoints: Black Forest Labs' single file (`flux1-dev.safetensors`, optionally
//! under `model.diffusion_model.`) and diffusers' `transformer/` folder (one file or shards),
//! in f32, f16 or bf16. The architecture's sizes are read from the tensors' shapes.
//!
//! The transformer is written against Black Forest Labs' names; a diffusers checkpoint is
//! read through a mapping (separate Q, K, V and MLP-in projections are concatenated; the
//! final layer's modulation is stored as (scale, shift) there and (shift, scale) here).

use std::path::Path;

use candle_core::{DType, Device};

use super::{Flux, FluxConfig};
use crate::io::shards::{dtype_for, Checkpoint, Shards, Source};
use crate::ModelError;

/// How a checkpoint names its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FluxLayout {
    /// Black Forest Labs' names, after an optional prefix (`model.diffusion_model.`).
    Bfl {
        /// Prefix before every name ("" in the official files).
        prefix: String,
    },
    /// diffusers' `FluxTransformer2DModel` names.
    Diffusers,
}

/// One or more safetensors files holding a FLUX transformer.
pub type FluxCheckpoint = Checkpoint<FluxLayout>;

impl Checkpoint<FluxLayout> {
    /// Opens `path`: a safetensors file, or a folder holding `*.safetensors` shards (a
    /// diffusers `transformer/` folder, or the model folder above it).
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let files = Shards::open(path)?;
        let layout = match files.naming(
            path,
            "a FLUX",
            &["x_embedder.weight", "transformer_blocks.0.attn.to_q.weight"],
            ("img_in.weight", "Black Forest Labs"),
        )? {
            None => FluxLayout::Diffusers,
            Some(prefix) => FluxLayout::Bfl { prefix },
        };
        let named = layout.clone();
        Ok(Self::new(files, layout, move |name| {
            layout_source(&named, name)
        }))
    }

    /// The architecture, from the tensors' shapes. `axes_dim` sets the RoPE split of a head
    /// (default: FLUX.1's 16/56/56, which needs heads of 128).
    pub fn config(&self, axes_dim: Option<[usize; 3]>) -> Result<FluxConfig, ModelError> {
        let what = format!("FLUX checkpoint, {:?} layout", self.layout());
        let need = |n: &str, rank: usize| self.weights().need(n, rank, &what);
        let img_in = need("img_in.weight", 2)?;
        let (hidden, in_channels) = (img_in[0], img_in[1]);
        let head_dim = need("double_blocks.0.img_attn.norm.query_norm.scale", 1)?[0];
        let mlp = need("double_blocks.0.img_mlp.0.weight", 2)?[0];
        let count = |f: &dyn Fn(usize) -> String| {
            (0..)
                .take_while(|&i| self.weights().shape(&f(i)).is_some())
                .count()
        };
        let depth = count(&|i| format!("double_blocks.{i}.img_mod.lin.weight"));
        let depth_single = count(&|i| format!("single_blocks.{i}.modulation.lin.weight"));
        if head_dim == 0 || hidden % head_dim != 0 {
            return Err(ModelError::Input(format!(
                "FLUX checkpoint: width {hidden} is not a multiple of the head width {head_dim}"
            )));
        }
        let axes_dim = match axes_dim {
            Some(a) => a,
            None if head_dim == 128 => [16, 56, 56],
            None => {
                return Err(ModelError::Input(format!(
                    "FLUX checkpoint with heads of {head_dim}: give the RoPE axes (FLUX.1's \
                     16/56/56 need heads of 128)"
                )))
            }
        };
        let cfg = FluxConfig {
            in_channels,
            vec_in_dim: need("vector_in.in_layer.weight", 2)?[1],
            context_in_dim: need("txt_in.weight", 2)?[1],
            hidden,
            mlp_ratio: mlp as f64 / hidden as f64,
            heads: hidden / head_dim,
            depth,
            depth_single,
            axes_dim,
            theta: 10_000.0,
            qkv_bias: self
                .weights()
                .shape("double_blocks.0.img_attn.qkv.bias")
                .is_some(),
            guidance_embed: self
                .weights()
                .shape("guidance_in.in_layer.weight")
                .is_some(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The transformer on `dev`, its sizes read from the checkpoint.
    pub fn load(&self, axes_dim: Option<[usize; 3]>, dev: &Device) -> Result<Flux, ModelError> {
        self.load_in(axes_dim, DType::F32, dev)
    }

    /// [`FluxCheckpoint::load`] with the linear layers' weights in `compute` (F32, BF16 or
    /// F16), read from the file in that dtype (a bf16 checkpoint loaded for bf16 is never
    /// widened); every other tensor, and all activations, stay f32 (see `crate::families::joint`'s
    /// `Lin`).
    pub fn load_in(
        &self,
        axes_dim: Option<[usize; 3]>,
        compute: DType,
        dev: &Device,
    ) -> Result<Flux, ModelError> {
        dtype_for("", &[], compute)?;
        let cfg = self.config(axes_dim)?;
        let vb = self.weights().var_builder(compute, dev);
        Flux::load(cfg, &vb)
    }
}

/// Where a checkpoint of `layout` keeps Black Forest Labs' tensor `name`.
fn layout_source(layout: &FluxLayout, name: &str) -> Source {
    match layout {
        FluxLayout::Bfl { prefix } => Source::One(format!("{prefix}{name}")),
        FluxLayout::Diffusers => diffusers_source(name),
    }
}

/// Where Black Forest Labs' tensor `name` lives in diffusers' `FluxTransformer2DModel`.
fn diffusers_source(name: &str) -> Source {
    let (stem, suffix) = match name.rsplit_once('.') {
        Some((s, x)) if x == "weight" || x == "bias" => (s, format!(".{x}")),
        _ => (name, String::new()),
    };
    let one = |s: String| Source::One(s);
    let top = |s: &str| one(format!("{s}{suffix}"));
    match stem {
        "img_in" => return top("x_embedder"),
        "txt_in" => return top("context_embedder"),
        "time_in.in_layer" => return top("time_text_embed.timestep_embedder.linear_1"),
        "time_in.out_layer" => return top("time_text_embed.timestep_embedder.linear_2"),
        "guidance_in.in_layer" => return top("time_text_embed.guidance_embedder.linear_1"),
        "guidance_in.out_layer" => return top("time_text_embed.guidance_embedder.linear_2"),
        "vector_in.in_layer" => return top("time_text_embed.text_embedder.linear_1"),
        "vector_in.out_layer" => return top("time_text_embed.text_embedder.linear_2"),
        "final_layer.linear" => return top("proj_out"),
        "final_layer.adaLN_modulation.1" => {
            return Source::Swap(format!("norm_out.linear{suffix}"))
        }
        _ => {}
    }
    let mut it = stem.splitn(3, '.');
    let (kind, idx, rest) = (
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
    );
    let at = |b: &str, s: &str| format!("{b}.{idx}.{s}{suffix}");
    match kind {
        "double_blocks" => {
            let b = "transformer_blocks";
            match rest {
                "img_mod.lin" => one(at(b, "norm1.linear")),
                "txt_mod.lin" => one(at(b, "norm1_context.linear")),
                "img_attn.qkv" => Source::Cat(
                    ["to_q", "to_k", "to_v"]
                        .iter()
                        .map(|p| at(b, &format!("attn.{p}")))
                        .collect(),
                ),
                "txt_attn.qkv" => Source::Cat(
                    ["add_q_proj", "add_k_proj", "add_v_proj"]
                        .iter()
                        .map(|p| at(b, &format!("attn.{p}")))
                        .collect(),
                ),
                "img_attn.norm.query_norm.scale" => one(format!("{b}.{idx}.attn.norm_q.weight")),
                "img_attn.norm.key_norm.scale" => one(format!("{b}.{idx}.attn.norm_k.weight")),
                "txt_attn.norm.query_norm.scale" => {
                    one(format!("{b}.{idx}.attn.norm_added_q.weight"))
                }
                "txt_attn.norm.key_norm.scale" => {
                    one(format!("{b}.{idx}.attn.norm_added_k.weight"))
                }
                "img_attn.proj" => one(at(b, "attn.to_out.0")),
                "txt_attn.proj" => one(at(b, "attn.to_add_out")),
                "img_mlp.0" => one(at(b, "ff.net.0.proj")),
                "img_mlp.2" => one(at(b, "ff.net.2")),
                "txt_mlp.0" => one(at(b, "ff_context.net.0.proj")),
                "txt_mlp.2" => one(at(b, "ff_context.net.2")),
                _ => one(name.into()),
            }
        }
        "single_blocks" => {
            let b = "single_transformer_blocks";
            match rest {
                "modulation.lin" => one(at(b, "norm.linear")),
                "linear1" => Source::Cat(
                    ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]
                        .iter()
                        .map(|p| at(b, p))
                        .collect(),
                ),
                "linear2" => one(at(b, "proj_out")),
                "norm.query_norm.scale" => one(format!("{b}.{idx}.attn.norm_q.weight")),
                "norm.key_norm.scale" => one(format!("{b}.{idx}.attn.norm_k.weight")),
                _ => one(name.into()),
            }
        }
        _ => one(name.into()),
    }
}
