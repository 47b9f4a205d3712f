"""FlashDiff inside a diffusers pipeline.

>>> from diffusers import FluxPipeline                          # doctest: +SKIP
>>> import flashdiff.diffusers
>>> pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev")   # doctest: +SKIP
>>> flashdiff.diffusers.enable(pipe)                           # doctest: +SKIP
>>> image = pipe("a red fox in the snow").images[0]            # doctest: +SKIP
>>> flashdiff.diffusers.summary(pipe)["text"]                  # doctest: +SKIP
'computed 16 of 28 steps per row; 0.59 of full computation's FLOPs; denoising ...'

What it does to each call:

1. The first ``warmup`` steps run in full. The last of them also measures how much every
   image token attends to the prompt's salient words (the pipeline's T5 pieces mapped to
   words) in the joint attention (FLUX's dual-stream blocks, SD3's joint blocks) or the
   cross-attention (Wan); that saliency map (frames x height x width for Wan's video
   latents) is cut into ``patches`` patches by the Rust partitioner.
2. Rows decide in groups: one sample's guidance rows decide together (SD3's negative and
   positive rows of one image; for FLUX's true CFG and Wan, which call the transformer once
   with the prompt and once without, the second call follows the first call's decision);
   each image of a batch decides on its own, so an image's output does not depend on what
   else is in the batch.
3. The default rule (``rule="budget"``, the engine's whole-step rule): every patch adds up
   the relative L1 change of the first block's modulated input over its tokens (and the
   group's rows) since it last ran; a step runs once a patch has used up ``epsilon`` or the
   group has skipped ``max_skip`` steps. A step that runs computes the whole latent with the
   pipeline's own attention processors; one that does not advances every token on its
   forecast velocity (``reuse``) without calling the transformer. It keeps only what it
   reads: the signal and each row's velocity history.
4. The regional rule (``rule="gate"``, the paper's gate): each step runs the patches whose
   attention importance (measured in the last joint or self-attention block) is above
   ``epsilon``, on those patches' image tokens (their RoPE angles, position embeddings and
   ControlNet residuals gathered with them) and the whole text; attention reads the other
   tokens' K/V from per-block caches forecast along their slopes. It keeps those caches.
5. The rows that run go through one transformer forward per step (the whole-step rule) or
   one per distinct token set (the regional rule); the last step runs every patch.
6. Few-step schedules (at most 8 steps) run unchanged unless ``force=True``, with a warning.

It is installed per pipeline instance, through the attention-processor API and a wrapper of
the transformer's ``forward`` (of ``torch.compile``'s wrapper when the transformer is
compiled: decisions run outside the compiled graph); classes are never patched. Every
``scheduler.set_timesteps`` starts a new call. ``disable`` puts back what was there.
``summary(pipe)`` says what the last call did, and the same line is logged at INFO.

Supported: ``FluxPipeline``, ``StableDiffusion3Pipeline`` (SD3 and SD3.5), ``WanPipeline``
(Wan 2.1 text-to-video; Wan 2.2's second, low-noise transformer is left as it is, and
per-token timesteps are refused), their ControlNet pipelines, and their transformers
(driven by a scheduler the caller passes). Other pipelines are refused with an error that
says so.
"""

from ._adapter import _forecast, _refresh  # noqa: F401
from ._core import disable, enable, report, set_salient, summary
from ._step import _budget_observe  # noqa: F401

__all__ = ["enable", "disable", "set_salient", "report", "summary"]
