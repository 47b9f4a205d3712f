"""The attention processor every family installs: saliency on the last warm-up step,
K/V recorded on computed steps, forecast K/V beside a partial step's fresh rows, and the
patch gate's importance."""

from __future__ import annotations

from typing import Any

from ._adapter import _Adapter, _forecast, _refresh
from ._base import _torch
from ._state import _Ctx, _Group


class _Processor:
    """FLUX's attention with FlashDiff's saliency and K/V cache (sequence dim 1: (B, L, H, D)).
    With no context (every forward of the whole-step rule but the saliency step) it is the
    processor it replaced."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, adapter: _Adapter, name: str) -> None:
        self.a = adapter
        self.name = name

    def __call__(
        self,
        attn: Any,
        hidden_states: Any,
        encoder_hidden_states: Any = None,
        attention_mask: Any = None,
        image_rotary_emb: Any = None,
    ) -> Any:
        if self.a.ctx is None:
            return self.a.saved_processors[self.name](attn, hidden_states, encoder_hidden_states,
                                                      attention_mask, image_rotary_emb)
        torch = _torch()
        from diffusers.models.transformers import transformer_flux as tf

        q, k, v, eq, ek, ev = tf._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        q = attn.norm_q(q.unflatten(-1, (-1, attn.head_dim)))
        k = attn.norm_k(k.unflatten(-1, (-1, attn.head_dim)))
        v = v.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            eq = attn.norm_added_q(eq.unflatten(-1, (-1, attn.head_dim)))
            ek = attn.norm_added_k(ek.unflatten(-1, (-1, attn.head_dim)))
            ev = ev.unflatten(-1, (-1, attn.head_dim))
            q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
        if image_rotary_emb is not None:
            q = tf.apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = tf.apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        k, v = self.keys_values(self.a.ctx, q, k, v)
        out = tf.dispatch_attention_fn(q, k, v, attn_mask=attention_mask, backend=self._attention_backend)
        out = out.flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is not None:
            eo, out = out.split_with_sizes([encoder_hidden_states.shape[1], out.shape[1] - encoder_hidden_states.shape[1]], 1)
            out = attn.to_out[1](attn.to_out[0](out.contiguous()))
            return out, attn.to_add_out(eo.contiguous())
        return out

    def keys_values(self, ctx: _Ctx, q: Any, k: Any, v: Any) -> Any:
        """The K/V the attention reads: in the saliency and record modes the forward's own
        (cached under the regional rule; the saliency step also adds up each prompt row's
        attention to its salient words), in the partial mode every row's forecast with its
        computed rows written in."""
        torch = _torch()
        n, extrap = ctx.step, self.a.s["reuse"] != "stale"
        if ctx.mode != "partial":
            if self.a.regional:
                for j, row in enumerate(ctx.rows):
                    k0, v0 = k[j].detach().float(), v[j].detach().float()
                    store = row.kv.get(self.name)
                    if store is None:
                        steps = torch.full((k0.shape[0],), n, dtype=torch.long, device=k0.device)
                        row.kv[self.name] = [[k0.clone(), torch.zeros_like(k0), steps.clone()],
                                             [v0.clone(), torch.zeros_like(v0), steps.clone()]]
                    else:
                        pos = torch.arange(k0.shape[0], device=k0.device)
                        _refresh(store[0], pos, k0, n)
                        _refresh(store[1], pos, v0, n)
            if ctx.mode == "saliency" and self.name in self.a.dual:
                t = ctx.text
                for j, row in enumerate(ctx.rows):
                    sal = ctx.salient[j]
                    if sal is None:
                        continue
                    probs = self.attention_probs(q[j:j + 1, t:], k[j:j + 1])  # (N, T + N)
                    m = probs[:, :t][:, sal].mean(dim=1) if bool(sal.any()) else probs[:, :t].mean(dim=1)
                    g = row.group
                    g.saliency = m if g.saliency is None else g.saliency + m
            return k, v
        kfs, vfs = [], []
        t = k.shape[1] - ctx.active_tokens.numel()  # this block's text rows (0: image only)
        pos = torch.cat([torch.arange(t, device=k.device), ctx.active_tokens + t])
        for j, row in enumerate(ctx.rows):
            ks, vs = row.kv[self.name]
            kf = _forecast(ks[0], ks[1], ks[2], n, extrap)
            vf = _forecast(vs[0], vs[1], vs[2], n, extrap)
            kj, vj = k[j].detach().float(), v[j].detach().float()
            kf[pos] = kj
            vf[pos] = vj
            _refresh(ks, pos, kj, n)
            _refresh(vs, pos, vj, n)
            kfs.append(kf)
            vfs.append(vf)
        kf, vf = torch.stack(kfs).to(k.dtype), torch.stack(vfs).to(v.dtype)
        if self.name == self.a.importance_block:
            for j, row in enumerate(ctx.rows):
                probs = self.attention_probs(q[j:j + 1, t:], kf[j:j + 1])[:, t:]  # (n_active, N)
                ctx.importance[j] = self.patch_mass(row.group, ctx.active_tokens, probs)
        return kf, vf

    @staticmethod
    def attention_probs(q: Any, k: Any) -> Any:
        """Softmax attention of `q`'s rows over `k`'s (one batch row), averaged over heads:
        (rows, keys); heads in chunks so that no more than about 64 Mi scores are live."""
        torch = _torch()
        scale = q.shape[-1] ** -0.5
        heads = q.shape[2]
        chunk = max(1, (1 << 26) // max(1, q.shape[1] * k.shape[1]))
        acc = None
        for h in range(0, heads, chunk):
            qh = q[0, :, h:h + chunk].float().transpose(0, 1)  # (h, rows, d)
            kh = k[0, :, h:h + chunk].float().transpose(0, 1)
            p = torch.softmax((qh @ kh.transpose(1, 2)) * scale, dim=-1).sum(0)
            acc = p if acc is None else acc + p
        return acc / heads

    @staticmethod
    def patch_mass(group: _Group, active_tokens: Any, probs: Any) -> Any:
        """R_i = (1/|A_i|^2) sum over active tokens u of patch i of their mass into patch i."""
        torch = _torch()
        patch_of = group.patch_of_t
        mine = patch_of[active_tokens]  # patch of each active query
        into = torch.zeros(probs.shape[0], len(group.tokens), device=probs.device, dtype=probs.dtype)
        into.index_add_(1, patch_of, probs)
        own = into.gather(1, mine.view(-1, 1)).squeeze(1)
        r = torch.zeros(len(group.tokens), device=probs.device, dtype=probs.dtype)
        r.index_add_(0, mine, own)
        return r / group.sizes_t.to(probs.dtype) ** 2
