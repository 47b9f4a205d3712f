"""Small random-weight diffusers pipelines built offline (no download): tokenizers from a
word list, CLIP and T5 encoders, a one-level VAE, and FLUX or SD3 transformers of a few
blocks. What the adapter's pipeline tests run on."""

import json
import os
import tempfile

import torch
import diffusers
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

WORDS = ["a", "red", "blue", "green", "fox", "cat", "dog", "in", "the", "snow", "circle", "square", "big",
         "small", "on", "field", "sky", "ugly", "blurry"]
TEXT = 16  # T5 positions (max_sequence_length) and CLIP's model_max_length


def t5_tokenizer():
    """A T5 tokenizer whose pieces are the words above (with SentencePiece's word marker)."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [("\u2581" + w, -1.0) for w in WORDS]
    vocab += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    tk = Tokenizer(models.Unigram(vocab, unk_id=2))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    return transformers.T5TokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>", model_max_length=TEXT, extra_ids=0)


def clip_tokenizer():
    d = tempfile.mkdtemp(prefix="fd-clip-")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for w in WORDS:
        vocab[w + "</w>"] = len(vocab)
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    with open(os.path.join(d, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(d, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return transformers.CLIPTokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"),
                                      model_max_length=TEXT)


def clip(hidden=16, projection=None):
    cfg = transformers.CLIPTextConfig(vocab_size=80, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=TEXT, bos_token_id=0,
                                      eos_token_id=1, pad_token_id=1, projection_dim=projection or hidden)
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    return cls(cfg).eval()


def t5(d_model=32):
    cfg = transformers.T5Config(vocab_size=64, d_model=d_model, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                                decoder_start_token_id=0)
    return transformers.T5EncoderModel(cfg).eval()


def vae(latent=4, scaled=False):
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1, latent_channels=latent,
        norm_num_groups=1, sample_size=16, use_quant_conv=scaled, use_post_quant_conv=scaled,
        shift_factor=0.1, scaling_factor=1.5).eval()


def flux_transformer(channels=16):
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=channels, num_layers=2, num_single_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=False,
        axes_dims_rope=[2, 2, 4]).eval()


def flux_pipe(seed=0):
    """A FluxPipeline: 16x16 pixels, 4 latent channels packed 2x2 (64 image tokens)."""
    torch.manual_seed(seed)
    return diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae(4), text_encoder=clip(16),
        tokenizer=clip_tokenizer(), text_encoder_2=t5(32), tokenizer_2=t5_tokenizer(),
        transformer=flux_transformer(16))


def flux_controlnet_pipe(seed=0):
    torch.manual_seed(seed)
    parts = dict(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae(4), text_encoder=clip(16),
                 tokenizer=clip_tokenizer(), text_encoder_2=t5(32), tokenizer_2=t5_tokenizer(),
                 transformer=flux_transformer(16))
    net = diffusers.FluxControlNetModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=False,
        axes_dims_rope=[2, 2, 4]).eval()
    # Random output projections, so that the control reaches the image (they start at zero).
    for p in list(net.controlnet_blocks.parameters()) + list(net.controlnet_single_blocks.parameters()):
        torch.nn.init.normal_(p, std=0.5)
    torch.nn.init.normal_(net.controlnet_x_embedder.weight, std=0.5)
    return diffusers.FluxControlNetPipeline(controlnet=net, **parts)


def sd3_transformer():
    return diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=32, out_channels=4,
        pos_embed_max_size=16).eval()


def sd3_pipe(seed=0):
    """A StableDiffusion3Pipeline: 16x16 pixels, 4 latent channels, 2x2 patches (64 tokens);
    two CLIP encoders of width 16 (pooled 2 x 16) and a T5 of width 32."""
    torch.manual_seed(seed)
    return diffusers.StableDiffusion3Pipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae(4, scaled=True),
        text_encoder=clip(16, 16), tokenizer=clip_tokenizer(), text_encoder_2=clip(16, 16),
        tokenizer_2=clip_tokenizer(), text_encoder_3=t5(32), tokenizer_3=t5_tokenizer(),
        transformer=sd3_transformer())


def sd3_controlnet_pipe(seed=0):
    torch.manual_seed(seed)
    net = diffusers.SD3ControlNetModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=32, out_channels=4,
        pos_embed_max_size=16).eval()
    for p in net.controlnet_blocks.parameters():
        torch.nn.init.normal_(p, std=0.5)
    for p in net.pos_embed_input.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return diffusers.StableDiffusion3ControlNetPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae(4, scaled=True),
        text_encoder=clip(16, 16), tokenizer=clip_tokenizer(), text_encoder_2=clip(16, 16),
        tokenizer_2=clip_tokenizer(), text_encoder_3=t5(32), tokenizer_3=t5_tokenizer(),
        transformer=sd3_transformer(), controlnet=net)
