"""Wan 2.1 (``WanTransformer3DModel``): self- and cross-attention processors, the forward over the
batch rows that run, on the chosen tokens with their RoPE, and the signal."""

from __future__ import annotations

import re
from typing import Any, List, Optional

from .. import Error
from ._adapter import _Adapter
from ._attention import _Processor
from ._base import _ATTR, _torch
from ._step import _grid_view, _output, _plain, _rows, _scatter_tokens, _step


def _wan_rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotates each (even, odd) pair of `x`'s last dimension by the angle whose cosine and
    sine the pair's entries of `cos` and `sin` hold (Wan's interleaved RoPE)."""
    torch = _torch()
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out.type_as(x)


class _WanSelfProcessor(_Processor):
    """Wan's self-attention over the image tokens (sequence dim 1: (B, L, H, D)), with
    FlashDiff's K/V cache."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, rotary_emb: Any = None) -> Any:
        if self.a.ctx is None:  # a call FlashDiff leaves alone: the processor it replaced
            return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                      attention_mask, rotary_emb)
        from diffusers.models.transformers import transformer_wan as tw

        q, k, v = tw._get_qkv_projections(attn, hidden_states, None)
        q = attn.norm_q(q).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(k).unflatten(2, (attn.heads, -1))
        v = v.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            q, k = _wan_rope(q, *rotary_emb), _wan_rope(k, *rotary_emb)
        k, v = self.keys_values(self.a.ctx, q, k, v)
        out = tw.dispatch_attention_fn(q, k, v, attn_mask=attention_mask, backend=self._attention_backend)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class _WanCrossProcessor(_Processor):
    """Wan's cross-attention to the prompt, unchanged; at the last warm-up step it also adds
    up how much every image token attends to the prompt's salient words."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, rotary_emb: Any = None) -> Any:
        ctx = self.a.ctx
        if ctx is not None and ctx.mode == "saliency":
            from diffusers.models.transformers import transformer_wan as tw

            text = encoder_hidden_states
            if attn.add_k_proj is not None:  # image-to-video: the prompt's rows follow the image's
                text = text[:, text.shape[1] - ctx.text:]
            q, k, _ = tw._get_qkv_projections(attn, hidden_states, text)
            q = attn.norm_q(q).unflatten(2, (attn.heads, -1))
            k = attn.norm_k(k).unflatten(2, (attn.heads, -1))
            for j, row in enumerate(ctx.rows):
                sal = ctx.salient[j]
                if sal is None:
                    continue
                probs = self.attention_probs(q[j:j + 1], k[j:j + 1])  # (N, T)
                m = probs[:, sal].mean(dim=1) if bool(sal.any()) else probs.mean(dim=1)
                g = row.group
                g.saliency = m if g.saliency is None else g.saliency + m
        return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                  attention_mask, rotary_emb)


def _gather_rope(a: _Adapter) -> Any:
    """Wan's rotary angles of the active tokens only."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        return tuple(f[:, ctx.active_tokens] for f in out)

    return hook


def _gather_patches(a: _Adapter) -> Any:
    """After Wan's patch embedding, (B, C, F, H, W): the active tokens as (B, C, n, 1, 1),
    which the transformer flattens into its n rows."""

    def hook(module: Any, inputs: Any, out: Any) -> Any:
        ctx = a.ctx
        if ctx is None or ctx.mode != "partial":
            return out
        return out.flatten(2)[:, :, ctx.active_tokens][..., None, None]

    return hook


def _wan_signal(t: Any, hs: Any, timestep: Any, ehs: Any, image: Any) -> Any:
    """Wan's first block's modulated self-attention input of every token, (rows, tokens, width)."""
    torch = _torch()
    with torch.no_grad():
        x = t.patch_embedding(hs).flatten(2).transpose(1, 2)
        _, proj, _, _ = t.condition_embedder(timestep, ehs, image)
        block = t.blocks[0]
        shift, scale = (block.scale_shift_table + proj.unflatten(1, (6, -1)).float()).chunk(6, dim=1)[:2]
        m = block.norm1(x.float()) * (1 + scale) + shift
    return m.detach().float()


def _patchify_wan(t: Any, out: Any, grid: Any) -> Any:
    """Wan's (rows, c, f * pt, h * ph, w * pw) output as token rows (rows, f * h * w,
    pt * ph * pw * c), the layout of its last projection."""
    (f, h, w), (pt, ph, pw) = grid, t.config.patch_size
    r, c = out.shape[:2]
    v = out.reshape(r, c, f, pt, h, ph, w, pw).permute(0, 2, 4, 6, 3, 5, 7, 1)
    return v.reshape(r, f * h * w, pt * ph * pw * c)


def _unpatchify_wan(t: Any, v: Any, grid: Any) -> Any:
    """(rows, f * h * w, pt * ph * pw * c) token rows to Wan's (rows, c, f * pt, h * ph, w * pw)."""
    (f, h, w), (pt, ph, pw) = grid, t.config.patch_size
    v = v.reshape(v.shape[0], f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return v.flatten(6, 7).flatten(4, 5).flatten(2, 3)


def _forward_wan(self: Any, hidden_states: Any, timestep: Any = None, encoder_hidden_states: Any = None,
                 encoder_hidden_states_image: Any = None, return_dict: bool = True,
                 attention_kwargs: Any = None) -> Any:
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()
    batch = hidden_states.shape[0]
    image = encoder_hidden_states_image

    def run(sel: Any, idx: Any) -> Any:
        return a.forward_fn(_rows(hidden_states, sel, batch), timestep=_rows(timestep, sel, batch),
                              encoder_hidden_states=_rows(encoder_hidden_states, sel, batch),
                              encoder_hidden_states_image=_rows(image, sel, batch), return_dict=False,
                              attention_kwargs=attention_kwargs)[0]

    if call.plain:
        return _output(_plain(a, call, lambda: run(None, None)), return_dict)
    if timestep.ndim == 2:
        raise Error("flashdiff.diffusers: per-token timesteps (Wan 2.2 TI2V) are not supported")
    pt, ph, pw = self.config.patch_size
    grid = (hidden_states.shape[2] // pt, hidden_states.shape[3] // ph, hidden_states.shape[4] // pw)

    def signal(sel: Any) -> Any:
        return _wan_signal(self, _rows(hidden_states, sel, batch), _rows(timestep, sel, batch),
                           _rows(encoder_hidden_states, sel, batch), _rows(image, sel, batch))

    view = _grid_view(self, batch, encoder_hidden_states.shape[1], grid, hidden_states.device, hidden_states.dtype,
                      run, signal, _patchify_wan, _unpatchify_wan)
    return _output(_step(a, call, view), return_dict)


def attention_kind(name: str) -> Optional[str]:
    """Wan's self-attention over the video tokens and cross-attention to the prompt."""
    m = re.fullmatch(r"blocks\.\d+\.attn([12])", name)
    return None if m is None else ("self" if m.group(1) == "1" else "cross")


def signal_module(name: str) -> bool:
    """The layers the budget's signal runs (the condition embedder embeds the prompt too)."""
    return name.startswith(("patch_embedding", "condition_embedder"))


def install(a: _Adapter, transformer: Any, names: List[str]) -> Any:
    """Wan's processors and ``forward``: self-attention over the image tokens (K/V cached,
    importance read in the last block); the cross-attention to the prompt gives the
    saliency map."""
    a.dual = []
    a.saliency_names = [n for n in names if ".attn2." in n]
    a.importance_block = [n for n in names if ".attn1." in n][-1]
    procs = {n: (_WanCrossProcessor if ".attn2." in n else _WanSelfProcessor)(a, n) for n in names}
    a.hooks = [transformer.rope.register_forward_hook(_gather_rope(a)),
               transformer.patch_embedding.register_forward_hook(_gather_patches(a)),
               transformer.proj_out.register_forward_hook(_scatter_tokens(a))]
    return procs, _forward_wan
