"""Procedural text-to-audio data for the built-in audio model, and its ground-truth checker.

A clip is 2.048 s at 8 kHz holding one or two named events in order, each a kind (beep: a
pure tone; hum: a tone with its 2nd and 3rd harmonics; click: short broadband-ish bursts
around the pitch, 4 a second; chirp: a tone sweeping up an octave) at a pitch (low 250 Hz,
middle 600 Hz, high 1400 Hz): "a high beep then a low hum".

The model's latent is a log-magnitude spectrogram: 64 frames (32 ms hop) x 32 bands with
log-spaced centres from 100 Hz to 3.2 kHz, in dB from -60 to 0 mapped to [-1, 1]. Training
data renders it analytically from the events. The decoder is additive synthesis (each band
a sine at its centre frequency, its amplitude interpolated between frames), so a WAV has
energy exactly where the latent says; `check` reads a WAV by short-time Fourier analysis,
blind to how it was made. The Rust runtime re-implements vocabulary, prompts, decoder and
checker; keep them in step.
"""
import numpy as np

RATE = 8000
HOP = 256
FRAMES = 64
SAMPLES = FRAMES * HOP  # 16384, 2.048 s
BANDS = 32
F_LO, F_HI = 100.0, 3200.0
CENTRES = F_LO * (F_HI / F_LO) ** (np.arange(BANDS) / (BANDS - 1))
DB_FLOOR = -60.0
MAX_TOKENS = 8

KINDS = ["beep", "hum", "click", "chirp"]
PITCHES = {"low": 250.0, "middle": 600.0, "high": 1400.0}
PITCH_NAMES = list(PITCHES)
FUNCTION_WORDS = ["a", "then"]
VOCAB = ["<pad>"] + FUNCTION_WORDS + PITCH_NAMES + KINDS
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
CLICK_RATE = 4.0  # bursts a second
BAND_SPREAD = 0.35  # octaves: a tone's energy over neighbouring bands (Gaussian in log f)


def prompt_text(events):
    return " then ".join(f"a {p} {k}" for (k, p, _, _) in events)


def tokenize(text):
    ids = [WORD_ID[w] for w in text.split()]
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"prompt longer than {MAX_TOKENS} words: {text!r}")
    return ids + [0] * (MAX_TOKENS - len(ids))


def sample_events(rng):
    """[(kind, pitch name, start frame, end frame)]: one or two events, each 14-22 frames
    long, the second starting at least 12 frames after the first ends."""
    n = 1 + int(rng.random() < 0.6)
    events, free = [], 2
    for i in range(n):
        kind = KINDS[rng.integers(len(KINDS))]
        pitch = PITCH_NAMES[rng.integers(len(PITCH_NAMES))]
        length = int(rng.integers(14, 23))
        # Room left for the events still to place after this one.
        later = (n - 1 - i) * (12 + 22)
        last = FRAMES - 2 - length - later
        start = int(rng.integers(free, max(free + 1, last + 1)))
        events.append((kind, pitch, start, start + length))
        free = start + length + 12
    return events


def band_weights(freq):
    """Energy of a tone at `freq` over the bands (peak 1 at the nearest centre)."""
    d = np.log2(CENTRES / freq)
    return np.exp(-0.5 * (d / BAND_SPREAD) ** 2)


def render_latent(events, rng):
    """(BANDS, FRAMES) linear magnitudes in [0, 1] for the events."""
    mag = np.zeros((BANDS, FRAMES))
    for kind, pitch, a, b in events:
        f0 = PITCHES[pitch] * rng.uniform(0.97, 1.03)
        amp = rng.uniform(0.6, 1.0)
        for t in range(a, b):
            if kind == "beep":
                w = band_weights(f0)
            elif kind == "hum":
                w = band_weights(f0) + 0.6 * band_weights(2 * f0) + 0.4 * band_weights(3 * f0)
            elif kind == "chirp":
                w = band_weights(f0 * 2 ** ((t - a) / max(1, b - a - 1)))
            else:  # click: a burst on the frame where one falls, silence between
                phase = (t - a) * HOP * CLICK_RATE / RATE
                if phase - np.floor(phase) >= HOP * CLICK_RATE / RATE:
                    continue
                w = np.exp(-0.5 * (np.log2(CENTRES / f0) / 1.0) ** 2)
            mag[:, t] = np.maximum(mag[:, t], amp * w)
    return np.clip(mag, 0.0, 1.0)


def to_unit(mag):
    """Linear magnitudes -> latent values in [-1, 1] (dB over DB_FLOOR..0)."""
    db = 20 * np.log10(np.maximum(mag, 10 ** (DB_FLOOR / 20)))
    return (db - DB_FLOOR) / (-DB_FLOOR) * 2.0 - 1.0


def from_unit(x):
    db = (np.clip(x, -1.0, 1.0) + 1.0) / 2.0 * (-DB_FLOOR) + DB_FLOOR
    mag = 10 ** (db / 20)
    return np.where(db <= DB_FLOOR + 1e-6, 0.0, mag)


def decode(latent):
    """Latent (BANDS, FRAMES) in [-1, 1] -> waveform (SAMPLES,) in [-1, 1] by additive
    synthesis: band b is a sine at CENTRES[b] (fixed phase), its amplitude interpolated
    linearly between frame centres."""
    mag = from_unit(latent)
    t = np.arange(SAMPLES)
    centres = (np.arange(FRAMES) + 0.5) * HOP
    out = np.zeros(SAMPLES)
    for b in range(BANDS):
        if mag[b].max() <= 0:
            continue
        a = np.interp(t, centres, mag[b])
        out += a * np.sin(2 * np.pi * CENTRES[b] * t / RATE + b)
    peak = np.abs(out).max()
    return out / peak * 0.9 if peak > 0 else out


def batch(rng, n):
    """n clips: latents (n, BANDS, FRAMES) in [-1, 1], token ids (n, MAX_TOKENS), events."""
    xs, ids, evs = [], [], []
    for _ in range(n):
        events = sample_events(rng)
        xs.append(to_unit(render_latent(events, rng)))
        ids.append(tokenize(prompt_text(events)))
        evs.append(events)
    return np.stack(xs).astype(np.float32), np.array(ids, np.int64), evs


# ---- The checker: reads a waveform, knows nothing of the latent. ----

def spectrum_frames(wave):
    """(FRAMES, 257) magnitude spectra: Hann window of 512 samples around each frame centre."""
    win = np.hanning(512)
    padded = np.pad(wave, 256)
    out = np.empty((FRAMES, 257))
    for f in range(FRAMES):
        c = f * HOP + HOP // 2 + 256
        out[f] = np.abs(np.fft.rfft(padded[c - 256:c + 256] * win))
    return out


def segments(energy, threshold, max_gap):
    """Runs of frames with energy >= threshold, joining runs split by <= max_gap quiet frames."""
    on = energy >= threshold
    runs, start = [], None
    for i, v in enumerate(list(on) + [False]):
        if v and start is None:
            start = i
        if not v and start is not None:
            runs.append([start, i])
            start = None
    merged = []
    for r in runs:
        if merged and r[0] - merged[-1][1] <= max_gap:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    return merged


def nearest_pitch(freq):
    return min(PITCH_NAMES, key=lambda p: abs(np.log2(freq / PITCHES[p])))


def classify(spec, a, b):
    """(kind, pitch) of frames a..b of the spectra."""
    freqs = np.fft.rfftfreq(512, 1.0 / RATE)
    seg = spec[a:b]
    energy = (seg ** 2).sum(1)
    loud = energy >= 0.1 * energy.max()
    # Clicks: most frames of the span are quiet between bursts.
    if loud.mean() < 0.6 and b - a >= 6:
        cen = [(freqs * s ** 2).sum() / (s ** 2).sum() for s in seg[loud]]
        return "click", nearest_pitch(float(np.exp(np.mean(np.log(cen)))))
    peaks = [freqs[int(s.argmax())] for s in seg[loud]]
    n = len(peaks)
    first, last = np.median(peaks[: max(1, n // 4)]), np.median(peaks[-max(1, n // 4):])
    if last / first > 1.35:
        return "chirp", nearest_pitch(first)
    f0 = float(np.median(peaks))
    total = (seg[loud] ** 2).sum(0)

    def near(f):
        m = np.abs(freqs - f) <= max(24.0, 0.04 * f)
        return total[m].sum()

    harm = (near(2 * f0) + near(3 * f0)) / max(near(f0), 1e-12)
    return ("hum" if harm > 0.15 else "beep"), nearest_pitch(f0)


def check(wave, events):
    """Ground-truth verdict for a waveform: as many sound events as the prompt names (runs
    of frames within 30 dB of the loudest, bursts at most 8 frames apart joined), in
    order, each of its kind and pitch. Returns a dict with "count", "kinds", "pitches",
    "all"."""
    spec = spectrum_frames(np.asarray(wave, np.float64))
    energy = (spec ** 2).sum(1)
    if energy.max() <= 0:
        return {"count": False, "kinds": False, "pitches": False, "all": False}
    runs = [r for r in segments(energy, energy.max() * 1e-3, 8) if r[1] - r[0] >= 3]
    res = {"count": len(runs) == len(events), "kinds": True, "pitches": True}
    if not res["count"]:
        res["kinds"] = res["pitches"] = False
    else:
        for (kind, pitch, _, _), (a, b) in zip(events, runs):
            k, p = classify(spec, a, b)
            res["kinds"] &= k == kind
            res["pitches"] &= p == pitch
    res["all"] = res["count"] and res["kinds"] and res["pitches"]
    return res
