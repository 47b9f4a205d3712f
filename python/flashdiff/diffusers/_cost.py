"""FLOPs accounting from the transformer's own layers, and the ControlNets a pipeline runs."""

from __future__ import annotations

import re
from typing import Any, Callable, List, Optional

from ._base import _torch


class _Cost:
    """Model FLOPs of one row's forward from the transformer's own layers: 2 x in x out per
    input row of every linear layer (and per output position of the patch-embedding
    convolution), by the stream of tokens it runs on (image, text, both, or once per
    sample), plus 4 x width x queries x keys per attention. The rules are those of
    FlopCounterMode for matrix products and attention, which a test holds it to."""

    def __init__(self, transformer: Any, stream: Callable[[str], str], attention: Callable[[str], Optional[str]],
                 signal: Callable[[str], bool]) -> None:
        torch = _torch()
        self.per = {"image": 0, "text": 0, "joint": 0, "sample": 0}
        self.sig = {"image": 0, "text": 0, "joint": 0, "sample": 0}
        self.attn: List[Any] = []
        for name, m in transformer.named_modules():
            kind = attention(name)
            if kind is not None and hasattr(m, "heads"):
                self.attn.append((name, kind, getattr(m, "inner_dim", None) or m.to_q.out_features))
                continue
            if isinstance(m, torch.nn.Linear):
                f = 2 * m.in_features * m.out_features
            elif isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
                f = 2 * m.weight.numel()  # per output position: in x kernel x out
            else:
                continue
            s = stream(name)
            self.per[s] += f
            if signal(name):
                self.sig[s] += f

    def forward(self, n: int, big_n: int, t: int) -> float:
        """One row's forward computing `n` of `big_n` image tokens beside `t` text tokens."""
        p = self.per
        f = p["image"] * n + p["text"] * t + p["joint"] * (n + t) + p["sample"]
        for _, kind, inner in self.attn:
            q, k = {"joint": (n + t, big_n + t), "self": (n, big_n), "cross": (n, t)}[kind]
            f += 4 * inner * q * k
        return float(f)

    def signal(self, big_n: int, t: int) -> float:
        s = self.sig
        return float(s["image"] * big_n + s["text"] * t + s["joint"] * (big_n + t) + s["sample"])


_SAMPLE = re.compile(r"(^|\.)(time_text_embed|time_embed|condition_embedder\.time\w*)(\.|$)|norm\w*\.linear$")


def _stream(name: str) -> str:
    """Which tokens a linear layer of FLUX, SD3 or Wan runs on, by its diffusers name."""
    if _SAMPLE.search(name):
        return "sample"
    if name.startswith("single_transformer_blocks."):
        return "joint"
    if ("context" in name or "add_" in name or "text_embedder" in name or "image_embedder" in name
            or re.search(r"^blocks\.\d+\.attn2\.to_[kv]$", name)):
        return "text"
    return "image"


def _controlnets(pipe: Any) -> List[Any]:
    """The pipeline's ControlNet models (each net of a multi-ControlNet)."""
    net = getattr(pipe, "controlnet", None) if pipe is not None else None
    if net is None:
        return []
    nets = getattr(net, "nets", None)
    return list(nets) if nets is not None else [net]
