"""FlashDiff from Python.

The policies work on numpy arrays (read in place when they are C-contiguous and of the
right dtype, converted otherwise):

>>> import numpy as np, flashdiff
>>> layout = flashdiff.partition_saliency(np.random.rand(8, 8).astype(np.float32), 4)
>>> layout.patches, layout.patch_of.shape
(4, (64,))

The engine generates with a built-in model, taking the same settings as the CLI, JSON lines
and HTTP (one request schema):

>>> engine = flashdiff.Engine("tinydit")                      # doctest: +SKIP
>>> out = engine.generate("a red circle left of a blue square", seed=3, steps=50)  # doctest: +SKIP
>>> out.sample.shape, out.report["work_skipped"]              # doctest: +SKIP

Every refusal raises :class:`flashdiff.Error` (a ``ValueError``) with the Rust error's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _native
from ._native import (  # noqa: F401  (re-exported)
    MODELS,
    PIPELINES,
    Budget,
    Error,
    Gate,
    Layout,
    Scheduler,
    partition_uniform,
    split_words,
)

__all__ = [
    "MODELS",
    "PIPELINES",
    "Budget",
    "Engine",
    "Error",
    "Gate",
    "Layout",
    "Output",
    "Scheduler",
    "partition_saliency",
    "partition_uniform",
    "psnr",
    "relative_change",
    "saliency_map",
    "salient_mask",
    "split_words",
    "ssim",
]


def salient_mask(words: Sequence[str]) -> np.ndarray:
    """Which of ``words`` are salient (content words): a bool array."""
    return _native.salient_mask(list(words))


def saliency_map(attn: Any, salient: Any) -> np.ndarray:
    """The saliency of every latent token: the mean cross-attention of its row of ``attn``
    (``tokens x prompt_len``) over the salient prompt tokens (``salient``, a bool each)."""
    return _native.saliency_map(
        np.ascontiguousarray(attn, dtype=np.float32),
        np.ascontiguousarray(salient, dtype=np.bool_),
    )


def partition_saliency(saliency: Any, patches: int) -> Layout:
    """Cuts the latent into ``patches`` semantically coherent, balanced patches; the map's
    shape, ``(height, width)`` or ``(frames, height, width)``, is the latent's grid."""
    return _native.partition_saliency(np.ascontiguousarray(saliency, dtype=np.float32), patches)


def relative_change(now: Any, before: Any, patch_of: Any, patches: int) -> np.ndarray:
    """Each patch's relative L1 change between two snapshots of a per-token signal
    (``tokens x width``): what a :class:`Budget` observes each step."""
    return _native.relative_change(
        np.ascontiguousarray(now, dtype=np.float32),
        np.ascontiguousarray(before, dtype=np.float32),
        np.ascontiguousarray(patch_of, dtype=np.uint32),
        patches,
    )


def psnr(a: Any, b: Any) -> float:
    """PSNR in dB between two RGB images in [0, 1] of one shape ``(height, width, 3)``, as
    the engine's reports and ``flashdiff bench`` measure it (infinite when identical)."""
    return _native.psnr(np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32))


def ssim(a: Any, b: Any) -> float:
    """SSIM between two RGB images in [0, 1] of one shape ``(height, width, 3)``, as
    ``flashdiff bench`` measures it (11x11 Gaussian window, sigma 1.5)."""
    return _native.ssim(np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32))


@dataclass
class Output:
    """A finished request."""

    kind: str
    """``image``, ``video`` or ``audio``."""
    sample: np.ndarray
    """RGB in [0, 1] as ``(height, width, 3)`` or ``(frames, height, width, 3)``; a sound as
    ``(samples, channels)`` in [-1, 1]."""
    sample_rate: int
    """Samples per second of a sound (0 otherwise)."""
    report: Dict[str, Any]
    """Steps, patches, patch-steps computed, work skipped, latency, the layout's patch of
    every token: the HTTP API's job report."""
    file: bytes
    """The file ``flashdiff generate`` writes for it (PNG, GIF or WAV)."""
    extension: str
    """``png``, ``gif`` or ``wav``."""

    def save(self, path: str) -> None:
        """Writes :attr:`file` to ``path``."""
        with open(path, "wb") as f:
            f.write(self.file)


def _output(d: Dict[str, Any]) -> Output:
    return Output(
        kind=d["kind"],
        sample=d["sample"],
        sample_rate=d["sample_rate"],
        report=json.loads(d["report"]),
        file=d["file"],
        extension=d["extension"],
    )


def _request(prompt: Optional[str], settings: Dict[str, Any]) -> str:
    fields = dict(settings)
    if prompt is not None:
        fields["prompt"] = prompt
    try:
        return json.dumps(fields)
    except (TypeError, ValueError) as e:
        raise Error(f"settings: not representable as request fields: {e}") from None


class Engine:
    """A serving engine over one built-in model (``tinydit``, ``tinyvideo``, ``tinyaudio``)
    or a TinyDiT-family weights file, on in-process workers.

    Settings are the request schema's fields (``steps``, ``seed``, ``patches``, ``epsilon``,
    ``max_skip``, ``budget`` (a work budget in (0, 1]), ``mode``, ``layout``, ``reuse``,
    ``monotasks``, ``cache_threshold``, ``priority``, ``deadline_ms``, ``warmup``,
    ``adaptive_epsilon``), with the CLI's defaults
    for a lone request. Safe to share between threads; the GIL is released while the model
    runs.
    """

    def __init__(
        self,
        model: str = "tinydit",
        weights: Optional[str] = None,
        workers: int = 1,
        device: str = "cpu",
        size: Optional[Tuple[int, int]] = None,
        guidance: Optional[float] = None,
        dtype: Optional[str] = None,
    ):
        """``model``: a built-in model (:data:`MODELS`; ``weights`` optionally its
        safetensors file) or a real pipeline (:data:`PIPELINES`; ``weights`` its diffusers
        folder, ``size`` (height, width), ``guidance`` and ``dtype`` (``f32``, ``bf16``) as
        the CLI's flags). ``device``: ``cpu``, or ``cuda`` in a build with the ``cuda``
        feature."""
        self._e = _native.Engine(model, weights, workers, device, size, guidance, dtype)

    @property
    def model(self) -> str:
        return self._e.model

    @property
    def kind(self) -> str:
        return self._e.kind

    @property
    def workers(self) -> int:
        return self._e.workers

    def settings(self, prompt: str = "", **settings: Any) -> Dict[str, Any]:
        """The settings a request would run with; raises on a bad one as ``generate`` does."""
        return json.loads(self._e.settings(_request(prompt, settings)))

    def generate(self, prompt: str, **settings: Any) -> Output:
        """Runs one request to the end."""
        return _output(self._e.generate(_request(prompt, settings)))

    def submit(self, prompt: str, **settings: Any) -> int:
        """Admits a request; returns its id. It runs on the engine's own thread; wait
        with :meth:`step`."""
        return self._e.submit(_request(prompt, settings))

    def step(self, timeout_ms: int = 5) -> int:
        """Waits for the engine's next scheduling round (at most ``timeout_ms``; 0: the
        round); returns the requests still in flight."""
        return self._e.step(timeout_ms)

    def poll(self, id: int) -> str:
        """``pending``, ``done``, ``failed`` or ``unknown``."""
        return self._e.poll(id)

    def result(self, id: int, scale: Optional[int] = None) -> Output:
        """A finished request's output, once; raises with the reason when it failed. For an
        image, ``scale`` (1 to 32) sets the PNG's scale, as :meth:`submit_image` returns it."""
        return _output(self._e.result(id, scale))

    def wait(self, id: int, timeout_ms: int = 100) -> str:
        """Waits up to ``timeout_ms`` (at most 10000) for request ``id``; returns what
        :meth:`poll` then says. The GIL is released while it waits."""
        return self._e.wait(id, timeout_ms)

    @property
    def pending(self) -> int:
        """Requests submitted whose results are not ready yet."""
        return self._e.pending

    def submit_image(self, body: Any) -> Tuple[List[int], int]:
        """Admits a body of OpenAI's image endpoint (``bytes`` or ``str``: the image fields
        ``n``, ``size``, ``response_format``, ``output_format`` beside the settings) exactly
        as ``flashdiff serve --port`` with its default flags does: a refusal raises
        :class:`Error` with the text the server puts in its 400. Returns the ids of the
        ``n`` images (seeds ``seed``, ``seed + 1``, ...) and the PNG scale for
        :meth:`result`."""
        ids, scale = self._e.submit_image(body)
        return list(ids), scale

    def check_image(self, body: Any) -> Tuple[int, int]:
        """Checks a body as :meth:`submit_image` does without admitting it; returns the
        number of images and the PNG scale."""
        return self._e.check_image(body)

    def cancel(self, id: int) -> None:
        """Cancels a request in flight."""
        self._e.cancel(id)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("flashdiff")
    except Exception:  # not installed (imported from a checkout)
        return "0.0.0"


__version__ = _version()
