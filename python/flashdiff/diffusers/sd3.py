"""SD3 and SD3.5 (``SD3Transformer2DModel``): the joint attention processor (image rows first, no
RoPE), the forward on the chosen tokens with their position embeddings, and the signal."""

from __future__ import annotations

from typing import Any, List

from .. import Error
from ._core import _ATTR, _Adapter, _Processor, _hooked_batch, _output, _scatter_tokens, _torch


class _SD3Processor(_Processor):
    """SD3 / SD3.5's joint attention (image rows first, then text; no RoPE) and their
    image-only second attention, with FlashDiff's K/V cache. Rows are put text first, the
    shared layout of the cache, for the attention, and back after."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.a.ctx is None:  # a call FlashDiff leaves alone: the processor it replaced
            return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                      attention_mask, *args, **kwargs)
        torch = _torch()
        import torch.nn.functional as F

        b, heads = hidden_states.shape[0], attn.heads

        def split(x: Any) -> Any:
            return x.view(b, -1, heads, x.shape[-1] // heads)  # (B, L, H, D)

        q, k, v = split(attn.to_q(hidden_states)), split(attn.to_k(hidden_states)), split(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        n_img = q.shape[1]
        if encoder_hidden_states is not None:
            eq = split(attn.add_q_proj(encoder_hidden_states))
            ek = split(attn.add_k_proj(encoder_hidden_states))
            ev = split(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
        k, v = self.keys_values(self.a.ctx, q, k, v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out.transpose(1, 2).reshape(b, -1, heads * q.shape[-1]).to(q.dtype)
        text = out.shape[1] - n_img
        img = attn.to_out[1](attn.to_out[0](out[:, text:]))
        if encoder_hidden_states is None:
            return img
        txt = out[:, :text]
        if not attn.context_pre_only:
            txt = attn.to_add_out(txt)
        return img, txt


def _gather_tokens(a: _Adapter) -> Any:
    """After SD3's patch embedding (positions added): only the active tokens go on."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        return out[:, ctx.active_tokens]

    return hook


def _forward_sd3(self: Any, hidden_states: Any, encoder_hidden_states: Any = None, pooled_projections: Any = None,
                 timestep: Any = None, block_controlnet_hidden_states: Any = None, joint_attention_kwargs: Any = None,
                 return_dict: bool = True, skip_layers: Any = None) -> Any:
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()

    def orig(hs: Any, ehs: Any, pooled: Any, t: Any) -> Any:
        return a.orig_forward(hs, encoder_hidden_states=ehs, pooled_projections=pooled, timestep=t,
                              block_controlnet_hidden_states=block_controlnet_hidden_states,
                              joint_attention_kwargs=joint_attention_kwargs, return_dict=False,
                              skip_layers=skip_layers)[0]

    if call.plain:
        a.ctx = None
        out = orig(hidden_states, encoder_hidden_states, pooled_projections, timestep)
    else:
        if block_controlnet_hidden_states is not None:
            raise Error("flashdiff.diffusers: ControlNet residuals are not supported with FlashDiff enabled")
        text, p = encoder_hidden_states.shape[1], self.config.patch_size
        grid = (hidden_states.shape[-2] // p, hidden_states.shape[-1] // p)
        samples = [(hidden_states[b:b + 1], encoder_hidden_states[b:b + 1], pooled_projections[b:b + 1],
                    timestep[b:b + 1]) for b in range(hidden_states.shape[0])]
        out = _hooked_batch(a, call, samples, text, grid, hidden_states.device, run=orig,
                            signal=lambda args: _sd3_signal(self, args),
                            unpatchify=lambda v: _unpatchify_sd3(self, v, grid))
    return _output(out, return_dict)


def _sd3_signal(t: Any, args: Any) -> Any:
    """SD3's first joint block's modulated input of every image token (tokens x width)."""
    torch = _torch()
    hs, _, pooled, timestep = args
    with torch.no_grad():
        x = t.pos_embed(hs)
        temb = t.time_text_embed(timestep, pooled)
        m = t.transformer_blocks[0].norm1(x, emb=temb)[0]
    return m[0].detach().float()


def _unpatchify_sd3(t: Any, v: Any, grid: Any) -> Any:
    """(1, h * w, p * p * c) token rows to SD3's (1, c, h * p, w * p) output."""
    torch = _torch()
    (h, w), p, c = grid, t.config.patch_size, t.out_channels
    v = torch.einsum("nhwpqc->nchpwq", v.reshape(1, h, w, p, p, c))
    return v.reshape(1, c, h * p, w * p)

def install(a: _Adapter, transformer: Any, names: List[str]) -> Any:
    """SD3's processors and ``forward``, and the hooks that gather the chosen tokens' position
    embeddings and scatter the output back. Its joint blocks are where saliency and
    importance are read."""
    a.dual = [n for n in names if n.startswith("transformer_blocks.") and ".attn." in n]
    a.importance_block = a.dual[-1] if a.dual else names[-1]
    a.hooks = [transformer.pos_embed.register_forward_hook(_gather_tokens(a)),
               transformer.proj_out.register_forward_hook(_scatter_tokens(a))]
    return {n: _SD3Processor(a, n) for n in names}, _forward_sd3
