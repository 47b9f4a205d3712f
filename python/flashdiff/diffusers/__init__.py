"""FlashDiff inside a diffusers pipeline.

>>> from diffusers import FluxPipeline                          # doctest: +SKIP
>>> import flashdiff.diffusers
>>> pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev")   # doctest: +SKIP
>>> flashdiff.diffusers.enable(pipe, epsilon=0.1, patches=16)  # doctest: +SKIP
>>> image = pipe("a red fox in the snow").images[0]            # doctest: +SKIP
>>> flashdiff.diffusers.report(pipe)                           # doctest: +SKIP

What it does to each call, per sample (each row of the transformer's batch, so classifier-free
guidance and batches give every sample what it would get alone):

1. The first ``warmup`` steps run in full. The last of them also measures how much every
   image token attends to the prompt's salient words (the pipeline's T5 pieces mapped to
   words) in the joint attention (FLUX's dual-stream blocks, SD3's joint blocks) or the
   cross-attention (Wan); that saliency map (a frames x height x width one for Wan's video
   latents) is cut into ``patches`` patches by the Rust partitioner.
2. Each later step decides which patches run. By FlashDiff's change budget (``rule
   "budget"``, the engine's rule and the default): every patch adds up the relative change
   of the first block's modulated input over its tokens since it last ran; a step runs once
   a patch has used up ``epsilon`` or waited ``max_skip`` steps, and otherwise every token
   advances on its forecast velocity without calling the transformer. Or by the paper's gate
   (``rule "gate"``), from each patch's self-attention mass (the refinement importance,
   measured in the last joint or self-attention block). The transformer runs on the chosen
   patches' image tokens only (their RoPE angles or position embeddings gathered with them)
   and the whole text stream; attention reads the other image tokens' K/V from a per-block
   cache, forecast along their slope; skipped tokens' velocity is forecast the same way. The
   last step runs every patch.
3. Few-step models (at most 8 steps) run unchanged unless ``force=True``, with a warning.

It is installed per pipeline instance, through the attention-processor API and a wrapper of
the transformer's ``forward``; classes are never patched. ``disable`` puts back what was
there. State is per call (a call is recognised by the scheduler's new ``timesteps``) and is
sized by the call's real step count. One device-to-host read per sample per step (the
patches' changes or importance) and one host-to-device copy (the active tokens' indices).

Supported: ``FluxPipeline``, ``StableDiffusion3Pipeline`` (SD3 and SD3.5), ``WanPipeline``
(Wan 2.1 text-to-video; Wan 2.2's second, low-noise transformer is left as it is, and
per-token timesteps are refused) and their transformers (driven by a scheduler the caller
passes). Other pipelines are refused with an error that says so.
"""

from ._core import _budget_observe, _forecast, _refresh, disable, enable, report, set_salient  # noqa: F401

__all__ = ["enable", "disable", "set_salient", "report"]
