"""The verdict protocol of studies/src/protocol.rs, in Python, for scripts that judge methods
the engine does not run (studies/diffusers_caches.py) against its study's rows.

- A method's setting per target work level is chosen on validation prompts: among its
  candidates whose mean validation work is at or under the target, the highest mean
  validation fidelity; of equal means the least work; of equal work too, the first
  (`choose`).
- The chosen settings run once on test prompts; two methods are compared prompt by prompt
  (`compare`): the mean paired difference A - B with a 95% percentile bootstrap interval
  (`RESAMPLES` resamples from a seed) and the difference of their worst prompts. "ahead" only
  when the interval lies above `MARGIN_DB` and A's worst prompt is higher; "behind"
  symmetrically; else "level". Methods whose mean work differs by more than `WORK_MATCH` are
  "not matched", unless the cheaper one is ahead anyway (or the dearer one behind).

One difference from the Rust module: the bootstrap draws its resamples with numpy's
generator (PCG64) from the seed, not with rand's ChaCha8, so an interval's ends can differ
from the engine's for the same seed by the resampling noise (hundredths of a dB at 32
prompts); the mean and the worst-prompt difference are the same numbers.

Also here: PSNR and SSIM of images as flashdiff-eval measures them (eval/src/metrics.rs), for
when the flashdiff package is not importable.
"""

import math

import numpy as np

TARGETS = (0.2, 0.25, 0.33, 0.5)  # image and TinyFLUX targets (protocol::IMAGE_TARGETS)
MAX_CANDIDATES = 32
RESAMPLES = 10_000
MARGIN_DB = 0.1
WORK_MATCH = 0.02


def mean(v):
    return float(sum(v) / len(v)) if len(v) else float("nan")


def choose(candidates, target):
    """Index of the candidate `candidates` [(mean validation work, mean validation dB)] runs at
    `target`, or None when none is that cheap. Non-finite work or dB is never chosen."""
    best = None
    for i, (w, m) in enumerate(candidates):
        if not (math.isfinite(w) and math.isfinite(m)) or w > target:
            continue
        if best is None or m > best[2] or (m == best[2] and w < best[1]):
            best = (i, w, m)
    return None if best is None else best[0]


def paired(a, b, seed, resamples=RESAMPLES):
    """A minus B on the same prompts in the same order: dict(mean, lo, hi, worst)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        raise ValueError(f"{a.size} prompts against {b.size}: a paired comparison needs the same prompts")
    if a.size == 0:
        raise ValueError("no prompts to compare")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("every prompt needs a finite value")
    d = a - b
    n = d.size
    rng = np.random.default_rng(seed)
    means = np.sort(d[rng.integers(0, n, size=(resamples, n))].mean(axis=1))
    at = lambda q: float(means[min(int(round(q * (resamples - 1))), resamples - 1)])  # noqa: E731
    return dict(mean=float(d.mean()), lo=at(0.025), hi=at(0.975), worst=float(a.min() - b.min()))


def quality_verdict(p):
    if p["lo"] > MARGIN_DB and p["worst"] > 0:
        return "ahead"
    if p["hi"] < -MARGIN_DB and p["worst"] < 0:
        return "behind"
    return "level"


def compare(a_db, a_work, b_db, b_work, seed):
    """A against B: the paired difference (dict) with "verdict" added, work included."""
    p = paired(a_db, b_db, seed)
    q = quality_verdict(p)
    wa, wb = mean(a_work), mean(b_work)
    if abs(wa - wb) <= WORK_MATCH + 1e-9 or (wa < wb and q == "ahead") or (wb < wa and q == "behind"):
        p["verdict"] = q
    else:
        p["verdict"] = "not matched"
    return p


def psnr(a, b):
    """PSNR in dB of two images in [0, 1] (any equal shapes); infinite when identical."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1 / mse)


def ssim(a, b):
    """SSIM of two (H, W, 3) images in [0, 1]: 11x11 Gaussian window (sigma 1.5), K1 0.01,
    K2 0.03, averaged over channels and valid window positions; 1 for images smaller than it."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    r = 5
    g = np.exp(-((np.arange(2 * r + 1) - r) ** 2) / (2 * 1.5 ** 2))
    g /= g.sum()
    h, w = a.shape[:2]
    if h <= 2 * r or w <= 2 * r:
        return 1.0

    def filt(x):  # valid 2-D Gaussian filter, per channel
        y = sum(g[i] * x[i:h - 2 * r + i] for i in range(2 * r + 1))
        return sum(g[i] * y[:, i:w - 2 * r + i] for i in range(2 * r + 1))

    c1, c2 = 0.01 ** 2, 0.03 ** 2
    ma, mb = filt(a), filt(b)
    va, vb, cov = filt(a * a) - ma * ma, filt(b * b) - mb * mb, filt(a * b) - ma * mb
    s = ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
    return float(s.mean())
