"""FLUX (``FluxTransformer2DModel``): its forward over the batch rows that run, on the chosen
patches' image tokens with their RoPE angles (and ControlNet residuals), and the first
double-stream block's modulated input as the budget's signal."""

from __future__ import annotations

import re
from typing import Any, List, Optional

from ._adapter import _Adapter
from ._attention import _Processor
from ._base import _ATTR, _torch
from ._memo import _Memo
from ._step import _View, _control, _output, _plain, _rows, _step


def _forward(self: Any, hidden_states: Any, encoder_hidden_states: Any = None, pooled_projections: Any = None,
             timestep: Any = None, img_ids: Any = None, txt_ids: Any = None, guidance: Any = None,
             joint_attention_kwargs: Any = None, controlnet_block_samples: Any = None,
             controlnet_single_block_samples: Any = None, return_dict: bool = True, **kw: Any) -> Any:
    a: _Adapter = getattr(self, _ATTR)
    call = a.begin()
    batch = hidden_states.shape[0]

    def run(sel: Any, idx: Any) -> Any:
        ids = img_ids if idx is None else (img_ids[idx] if img_ids.ndim == 2 else img_ids[:, idx])
        hs = _rows(hidden_states, sel, batch)
        return a.forward_fn(
            hs if idx is None else hs[:, idx], encoder_hidden_states=_rows(encoder_hidden_states, sel, batch),
            pooled_projections=_rows(pooled_projections, sel, batch), timestep=_rows(timestep, sel, batch),
            img_ids=ids, txt_ids=txt_ids, guidance=_rows(guidance, sel, batch),
            joint_attention_kwargs=joint_attention_kwargs,
            controlnet_block_samples=_control(controlnet_block_samples, sel, idx, batch),
            controlnet_single_block_samples=_control(controlnet_single_block_samples, sel, idx, batch),
            return_dict=False, **kw)[0]

    if call.plain:
        return _output(_plain(a, call, lambda: run(None, None)), return_dict)
    ids = img_ids[0] if img_ids.ndim == 3 else img_ids
    # The token grid from the position ids, read back once per call and ids tensor (a read
    # waits for the device).
    key = (ids.data_ptr(), tuple(ids.shape))
    if getattr(call, "flux_grid", (None,))[0] != key:
        maxes = ids[:, 1:3].max(dim=0).values.tolist()
        call.flux_grid = (key, (int(maxes[0]) + 1, int(maxes[1]) + 1))
    grid = call.flux_grid[1]

    def signal(sel: Any) -> Any:
        return _flux_signal(self, _rows(hidden_states, sel, batch), _rows(pooled_projections, sel, batch),
                            _rows(timestep, sel, batch), _rows(guidance, sel, batch))

    # A step that runs whole takes the signal's patch embedding, timestep embedding and first
    # modulation from the signal instead of computing them again. Not under torch.compile:
    # its graph holds the modules' own forwards, and wrapping them would recompile it.
    shared = {"x_embedder": self.x_embedder, "time_text_embed": self.time_text_embed,
              "norm1": self.transformer_blocks[0].norm1}
    memo = _Memo(shared if a.outer is self else {})
    with memo:
        view = _View(batch, encoder_hidden_states.shape[1], grid, hidden_states.device, run,
                     tokens=lambda out, idx: out, untokens=lambda v: v.to(hidden_states.dtype), signal=signal,
                     reused=memo.reused)
        return _output(_step(a, call, view), return_dict)


def _flux_signal(t: Any, hs: Any, pooled: Any, timestep: Any, guidance: Optional[Any]) -> Any:
    """The first double-stream block's modulated input of every image token, (rows, tokens,
    width): the change the budget adds up, what whole-step caching watches."""
    torch = _torch()
    with torch.no_grad():
        x = t.x_embedder(hs)
        ts = timestep.to(x.dtype) * 1000
        if guidance is None:
            temb = t.time_text_embed(ts, pooled)
        else:
            temb = t.time_text_embed(ts, guidance.to(x.dtype) * 1000, pooled)
        m = t.transformer_blocks[0].norm1(x, emb=temb)[0]
    # A copy: the forward that may follow reads the same tensor (see _memo).
    return m.detach().float().clone()


def attention_kind(name: str) -> Optional[str]:
    """Every FLUX attention is joint: image and text rows attend to both."""
    return "joint" if re.fullmatch(r"(single_)?transformer_blocks\.\d+\.attn", name) else None


def signal_module(name: str) -> bool:
    """The layers the budget's signal runs."""
    return (name.startswith(("x_embedder", "time_text_embed"))
            or name == "transformer_blocks.0.norm1.linear")


def install(a: _Adapter, transformer: Any, names: List[str]) -> Any:
    """FLUX's processors (every block's joint attention) and ``forward``. The dual-stream
    blocks' joint attention is where saliency and importance are read."""
    a.dual = [n for n in names if n.startswith("transformer_blocks.") and ".attn." in n]
    a.importance_block = a.dual[-1] if a.dual else names[-1]
    return {n: _Processor(a, n) for n in names}, _forward
