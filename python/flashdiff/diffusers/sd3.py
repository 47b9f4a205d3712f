"""SD3 and SD3.5 (``SD3Transformer2DModel``): the joint attention processor (image rows first, no
RoPE), the forward over the batch rows that run, on the chosen tokens with their position
embeddings (and ControlNet residuals), and the signal."""

from __future__ import annotations

import re
from typing import Any, List, Optional

from ._adapter import _Adapter
from ._attention import _Processor
from ._base import _ATTR, _torch
from ._step import _control, _grid_view, _output, _plain, _rows, _scatter_tokens, _step


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
    batch = hidden_states.shape[0]

    def run(sel: Any, idx: Any) -> Any:
        return a.forward_fn(
            _rows(hidden_states, sel, batch), encoder_hidden_states=_rows(encoder_hidden_states, sel, batch),
            pooled_projections=_rows(pooled_projections, sel, batch), timestep=_rows(timestep, sel, batch),
            block_controlnet_hidden_states=_control(block_controlnet_hidden_states, sel, idx, batch),
            joint_attention_kwargs=joint_attention_kwargs, return_dict=False, skip_layers=skip_layers)[0]

    if call.plain:
        return _output(_plain(a, call, lambda: run(None, None)), return_dict)
    p = self.config.patch_size
    grid = (hidden_states.shape[-2] // p, hidden_states.shape[-1] // p)

    def signal(sel: Any) -> Any:
        return _sd3_signal(self, _rows(hidden_states, sel, batch), _rows(pooled_projections, sel, batch),
                           _rows(timestep, sel, batch))

    view = _grid_view(self, batch, encoder_hidden_states.shape[1], grid, hidden_states.device, hidden_states.dtype,
                      run, signal, _patchify_sd3, _unpatchify_sd3)
    return _output(_step(a, call, view), return_dict)


def _sd3_signal(t: Any, hs: Any, pooled: Any, timestep: Any) -> Any:
    """SD3's first joint block's modulated input of every image token, (rows, tokens, width)."""
    torch = _torch()
    with torch.no_grad():
        x = t.pos_embed(hs)
        temb = t.time_text_embed(timestep, pooled)
        m = t.transformer_blocks[0].norm1(x, emb=temb)[0]
    return m.detach().float()


def _patchify_sd3(t: Any, out: Any, grid: Any) -> Any:
    """SD3's (rows, c, h * p, w * p) output as token rows (rows, h * w, p * p * c), the layout
    of its last projection."""
    (h, w), p = grid, t.config.patch_size
    c = out.shape[1]
    return out.reshape(out.shape[0], c, h, p, w, p).permute(0, 2, 4, 3, 5, 1).reshape(out.shape[0], h * w, p * p * c)


def _unpatchify_sd3(t: Any, v: Any, grid: Any) -> Any:
    """(rows, h * w, p * p * c) token rows to SD3's (rows, c, h * p, w * p) output."""
    torch = _torch()
    (h, w), p, c = grid, t.config.patch_size, t.out_channels
    v = torch.einsum("nhwpqc->nchpwq", v.reshape(v.shape[0], h, w, p, p, c))
    return v.reshape(v.shape[0], c, h * p, w * p)


def attention_kind(name: str) -> Optional[str]:
    """SD3's joint attention; SD3.5's second attention is over the image tokens only."""
    if re.fullmatch(r"transformer_blocks\.\d+\.attn", name):
        return "joint"
    return "self" if re.fullmatch(r"transformer_blocks\.\d+\.attn2", name) else None


def signal_module(name: str) -> bool:
    """The layers the budget's signal runs."""
    return name.startswith(("pos_embed", "time_text_embed")) or name == "transformer_blocks.0.norm1.linear"


def install(a: _Adapter, transformer: Any, names: List[str]) -> Any:
    """SD3's processors and ``forward``, and the hooks that gather the chosen tokens' position
    embeddings and put the computed tokens back in the token grid. Its joint blocks are
    where saliency and importance are read."""
    a.dual = [n for n in names if n.startswith("transformer_blocks.") and ".attn." in n]
    a.importance_block = a.dual[-1] if a.dual else names[-1]
    a.hooks = [transformer.pos_embed.register_forward_hook(_gather_tokens(a)),
               transformer.proj_out.register_forward_hook(_scatter_tokens(a))]
    return {n: _SD3Processor(a, n) for n in names}, _forward_sd3
