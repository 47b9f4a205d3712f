"""What every part of the adapter shares: the attribute a wrapped transformer carries, the
log, the families by transformer class, and PyTorch, imported on first use."""

from __future__ import annotations

import logging
from typing import Any, Dict

from .. import Error

_ATTR = "_flashdiff_adapter"
_log = logging.getLogger("flashdiff.diffusers")

# The transformers FlashDiff runs inside, by class name.
_KINDS = {"FluxTransformer2DModel": "flux", "SD3Transformer2DModel": "sd3", "WanTransformer3DModel": "wan"}


def _families() -> Dict[str, Any]:
    """Each family's module, by kind: it installs its processors and ``forward``."""
    from . import flux, sd3, wan

    return {"flux": flux, "sd3": sd3, "wan": wan}


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise Error("flashdiff.diffusers needs PyTorch and diffusers installed") from e
    return torch
