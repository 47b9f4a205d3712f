"""A call's bookkeeping: the rows of the transformer's batch, the groups of rows that decide
together, one pipeline call, and what the attention processors read during one forward."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from .. import Budget, Gate


def _nbytes(x: Any) -> int:
    """Bytes of the tensors in `x` (a tensor, or lists and dicts of them)."""
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    if isinstance(x, dict):
        return sum(_nbytes(y) for y in x.values())
    return int(x.numel() * x.element_size()) if hasattr(x, "element_size") else 0


class _Group:
    """The rows that decide together: one sample's guidance rows (SD3's negative and positive
    rows of one image in one forward; FLUX's true CFG and Wan, which call the transformer
    once with the prompt and once with the negative prompt, follow the first call's decision
    in the second). Its layout, budget or gate, signal and decisions."""

    def __init__(self) -> None:
        self.layout = None
        self.tokens: List[Any] = []  # image-token indices of each patch, on the device
        self.patch_of_t: Any = None
        self.sizes_t: Any = None
        self.budget: Optional[Budget] = None
        self.gate: Optional[Gate] = None
        self.signal: Optional[Any] = None  # the group's rows' first-block modulated input (rows, N, W)
        self.saliency: Optional[Any] = None  # the prompt row's image-to-salient-words attention (N,)
        self.decided: Dict[int, np.ndarray] = {}  # step -> active patches

    def nbytes(self) -> Dict[str, int]:
        layout = _nbytes(self.tokens) + _nbytes(self.patch_of_t) + _nbytes(self.sizes_t)
        return {"signal": _nbytes(self.signal), "layout": layout + _nbytes(self.saliency)}


class _Row:
    """One row of the transformer's batch in one branch (a branch is one of a step's calls):
    its velocity history and, under the regional rule, its per-block K/V caches."""

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.vel: Optional[List[Any]] = None  # [v, slope, last_step(, curve, gap)] in token rows
        self.kv: Dict[str, List[Any]] = {}  # block -> [[k, k_slope, last], [v, v_slope, last]]
        self.computed: List[int] = []  # image tokens computed per step after the warm-up

    def nbytes(self) -> Dict[str, int]:
        return {"velocity": _nbytes(self.vel), "kv": _nbytes(self.kv)}


class _Call:
    """One pipeline call: from the scheduler's ``set_timesteps`` to the last step."""

    def __init__(self, timesteps: Any, steps: int, plain: bool, prompts: Optional[List[str]]) -> None:
        self.timesteps = timesteps
        self.steps = steps
        self.plain = plain
        self.prompts = prompts
        self.rows: Dict[Any, _Row] = {}
        self.groups: Dict[int, _Group] = {}
        self.step = -1
        self.branch = 0
        self.branches = 1
        self.first = 0  # the first step index the call ran (img2img pipelines start later)
        self.batch0 = 0  # the batch of each step's first call, and its rows' groups
        self.groups0: List[int] = []
        self.branches_at: Dict[int, int] = {}  # step -> calls it took
        self.forwards = 0  # transformer forwards run
        self.calls = 0  # forwards the pipeline asked for
        self.flops_run = 0.0
        self.flops_full = 0.0
        self.t0: Optional[float] = None
        self.t1: Optional[float] = None
        self.logged = False

    def row(self, branch: int, b: int, g: int) -> _Row:
        group = self.groups.setdefault(g, _Group())
        return self.rows.setdefault((branch, b), _Row(group))


class _Ctx:
    """What the attention processors need during one forward: its rows, in batch order."""

    def __init__(self, rows: List[_Row], mode: str, step: int, text: int) -> None:
        self.rows = rows
        self.mode = mode  # "saliency" (last warm-up step), "record" (all tokens) or "partial"
        self.step = step
        self.text = text
        self.active_tokens = None  # partial: image-token indices, gathered order
        self.n_tokens = 0  # partial: the image tokens of a whole step
        self.salient: List[Any] = [None] * len(rows)  # saliency: per row, bool (T,) or None
        self.importance: List[Any] = [None] * len(rows)  # partial: per row, (patches,)
