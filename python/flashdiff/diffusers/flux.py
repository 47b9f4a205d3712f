"""FLUX (``FluxTransformer2DModel``): its forward, per sample, on the chosen patches' image tokens with
their RoPE angles, and the first double-stream block's modulated input as the budget's signal."""

from __future__ import annotations

from typing import Any, List

from ._core import _ATTR, _Adapter, _Call, _Ctx, _Processor, _Row, _decide, _observe, _output, _partition, _record_velocity, _refresh, _torch, _vel_forecast


def _forward(self: Any, hidden_states: Any, encoder_hidden_states: Any = None, pooled_projections: Any = None,
             timestep: Any = None, img_ids: Any = None, txt_ids: Any = None, guidance: Any = None,
             joint_attention_kwargs: Any = None, return_dict: bool = True, **kw: Any) -> Any:
    torch = _torch()
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()

    def orig(hs: Any, ehs: Any, pooled: Any, t: Any, ids: Any, g: Any) -> Any:
        return a.orig_forward(hs, encoder_hidden_states=ehs, pooled_projections=pooled, timestep=t,
                              img_ids=ids, txt_ids=txt_ids, guidance=g,
                              joint_attention_kwargs=joint_attention_kwargs, return_dict=False, **kw)[0]

    if call.plain:
        a.ctx = None
        out = orig(hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, guidance)
    else:
        if img_ids.ndim == 3:
            img_ids = img_ids[0]
        n, warm, text = call.step, a.s["warmup"], encoder_hidden_states.shape[1]
        batch = hidden_states.shape[0]
        outs = []
        for b in range(batch):
            sl = slice(b, b + 1)
            row = call.rows.setdefault((call.branch, b), _Row())
            args = (encoder_hidden_states[sl], pooled_projections[sl], timestep[sl],
                    None if guidance is None else guidance[sl])
            if n < warm:
                ctx = _Ctx(row, "record", n, text)
                ctx.want_saliency = n == warm - 1
                if ctx.want_saliency:
                    ctx.salient = a.salient_tokens(b, batch, text, hidden_states.device)
                a.ctx = ctx
                o = orig(hidden_states[sl], args[0], args[1], args[2], img_ids, args[3])
                a.ctx = None
                _record_velocity(a, row, o[0].detach(), n)
                if ctx.want_saliency:
                    h = int(img_ids[:, 1].max().item()) + 1
                    w = int(img_ids[:, 2].max().item()) + 1
                    _partition(a, row, (h, w), img_ids.device)
                    if row.budget is not None:
                        row.signal = _flux_signal(self, hidden_states[sl], args)
            else:
                o = _partial(a, call, row, hidden_states[sl], img_ids, args, text, orig)
            outs.append(o)
        out = torch.cat(outs, 0)
    return _output(out, return_dict)


def _flux_signal(t: Any, hs: Any, args: Any) -> Any:
    """The first double-stream block's modulated input of every image token (tokens x width):
    the change the budget adds up, what whole-step caching watches."""
    torch = _torch()
    _, pooled, timestep, guidance = args
    with torch.no_grad():
        x = t.x_embedder(hs)
        ts = timestep.to(x.dtype) * 1000
        if guidance is None:
            temb = t.time_text_embed(ts, pooled)
        else:
            temb = t.time_text_embed(ts, guidance.to(x.dtype) * 1000, pooled)
        m = t.transformer_blocks[0].norm1(x, emb=temb)[0]
    return m[0].detach().float()


def _partial(a: _Adapter, call: _Call, row: _Row, hs: Any, img_ids: Any, args: Any, text: int, orig: Any) -> Any:
    n = call.step
    active, idx, last, vel = _decide(a, call, row, lambda: _flux_signal(a.transformer, hs, args))
    if vel is not None:
        return vel.unsqueeze(0).to(hs.dtype)
    ctx = _Ctx(row, "partial", n, text)
    ctx.active_tokens = idx
    a.ctx = ctx
    try:
        o = orig(hs[:, idx], args[0], args[1], args[2], img_ids[idx], args[3])
    finally:
        a.ctx = None
    fresh = o[0].detach()
    vel = _vel_forecast(a, row, n)
    vel[idx] = fresh
    _refresh(row.vel, idx, fresh, n)
    row.computed.append(int(idx.numel()))
    _observe(row, ctx, active, last)
    return vel.unsqueeze(0).to(o.dtype)

def install(a: _Adapter, transformer: Any, names: List[str]) -> Any:
    """FLUX's processors (every block's joint attention) and ``forward``. The dual-stream
    blocks' joint attention is where saliency and importance are read."""
    a.dual = [n for n in names if n.startswith("transformer_blocks.") and ".attn." in n]
    a.importance_block = a.dual[-1] if a.dual else names[-1]
    return {n: _Processor(a, n) for n in names}, _forward
