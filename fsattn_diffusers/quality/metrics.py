"""Frame metrics against a reference video: PSNR, SSIM (scikit-image) and LPIPS (see :mod:`.lpips_metric`).

Frames are uint8 arrays (F, H, W, 3) as :func:`fsattn_diffusers.integration.runner.to_uint8_frames`
makes them. Metrics are computed per frame on a subset of frames (every ``every``-th, from frame 0).
SSIM and LPIPS are averaged over those frames. The PSNR of a video is that of its pooled MSE (the mean
of the per-frame MSEs), so one identical frame (PSNR ``inf``) cannot make a whole video ``inf``; only
identical videos give ``inf`` (kept as such, never clipped). Per-frame PSNRs are kept for the curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

#: uint8 frames: the PSNR peak and the SSIM data range.
PIXEL_MAX = 255.0
#: Frames compared by default: every 4th (the paper's Section 5.3 evaluation).
DEFAULT_EVERY = 4
#: SSIM of Wang et al. (2004): 11x11 Gaussian window of sigma 1.5, population covariances.
SSIM_SIGMA = 1.5


def need_skimage():
    """Import ``skimage.metrics`` or raise a one-line ImportError saying how to install it."""
    try:
        from skimage import metrics
    except ImportError:
        raise ImportError("PSNR/SSIM need scikit-image: pip install scikit-image "
                          "(or pip install 'fsattn-diffusers[metrics]')") from None
    return metrics


def frame_indices(num_frames: int, every: int = DEFAULT_EVERY) -> List[int]:
    """Indices ``0, every, 2*every, ...`` below ``num_frames``.

    Raises
    ------
    ValueError
        For ``every < 1`` or ``num_frames < 1``.
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every={every!r} is not supported; accepted: an int >= 1")
    if num_frames < 1:
        raise ValueError(f"num_frames={num_frames} is not supported; accepted: >= 1")
    return list(range(0, num_frames, every))


def _check_pair(ref: np.ndarray, test: np.ndarray) -> None:
    if ref.shape != test.shape:
        raise ValueError(f"frames differ in shape: reference {ref.shape}, test {test.shape}")
    if ref.dtype != np.uint8 or test.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got {ref.dtype} and {test.dtype}")


def psnr(ref: np.ndarray, test: np.ndarray) -> float:
    """PSNR in dB of one uint8 frame (H, W, 3) against ``ref``: ``10 log10(255^2 / MSE)``; ``inf`` if equal."""
    _check_pair(ref, test)
    metrics = need_skimage()
    if np.array_equal(ref, test):
        return math.inf
    return float(metrics.peak_signal_noise_ratio(ref, test, data_range=PIXEL_MAX))


def mse(ref: np.ndarray, test: np.ndarray) -> float:
    """Mean squared error of one uint8 frame against ``ref`` (pixel units)."""
    _check_pair(ref, test)
    return float(need_skimage().mean_squared_error(ref, test))


def psnr_from_mse(value: float) -> float:
    """``10 log10(255^2 / MSE)``; ``inf`` for MSE 0."""
    return math.inf if value == 0 else 10.0 * math.log10(PIXEL_MAX ** 2 / value)


def ssim(ref: np.ndarray, test: np.ndarray) -> float:
    """SSIM of one uint8 frame (H, W, 3) against ``ref`` (Gaussian window, sigma 1.5, per channel, mean)."""
    _check_pair(ref, test)
    metrics = need_skimage()
    return float(metrics.structural_similarity(ref, test, channel_axis=-1, data_range=PIXEL_MAX,
                                               gaussian_weights=True, sigma=SSIM_SIGMA,
                                               use_sample_covariance=False))


def mean_value(values: Sequence[Optional[float]]) -> Optional[float]:
    """Mean of the values (``inf`` if any is ``inf``); ``None`` when there is none or any is ``None``."""
    if not values or any(v is None for v in values):
        return None
    if any(math.isinf(v) for v in values):
        return math.inf
    return float(np.mean(values))


@dataclass
class FrameMetrics:
    """Per-frame metrics of one video against its reference.

    ``lpips`` is ``None`` when LPIPS is unavailable (``lpips_note`` says why): never zero.
    ``means["psnr"]`` is the PSNR of the pooled MSE; ``means["mse"]`` that MSE.
    """

    indices: List[int]
    psnr: List[float]
    ssim: List[float]
    mse: List[float]
    lpips: Optional[List[float]] = None
    lpips_note: Optional[str] = None
    means: dict = field(default_factory=dict)

    def __post_init__(self):
        pooled = float(np.mean(self.mse))
        self.means = {"psnr": psnr_from_mse(pooled), "mse": pooled, "ssim": mean_value(self.ssim),
                      "lpips": None if self.lpips is None else mean_value(self.lpips)}


def compare_frames(ref: np.ndarray, test: np.ndarray, indices: Sequence[int], lpips=None) -> FrameMetrics:
    """Metrics of ``test`` against ``ref`` (both (F, H, W, 3) uint8 holding the frames ``indices``).

    Parameters
    ----------
    ref, test : ndarray
        Frames in the order of ``indices`` (already selected).
    lpips : :class:`~.lpips_metric.LpipsMetric`, optional
        Scorer; without one (or when unavailable) the LPIPS values are ``None``.
    """
    ref, test = np.asarray(ref), np.asarray(test)
    if ref.shape != test.shape or ref.ndim != 4 or ref.shape[0] != len(indices):
        raise ValueError(f"frame stacks must both be ({len(indices)}, H, W, 3); got {ref.shape} and {test.shape}")
    p = [psnr(a, b) for a, b in zip(ref, test)]
    s = [ssim(a, b) for a, b in zip(ref, test)]
    e = [mse(a, b) for a, b in zip(ref, test)]
    values, note = None, None
    if lpips is not None and lpips.available:
        values = lpips.score(ref, test)
    elif lpips is not None:
        note = lpips.reason
    return FrameMetrics(list(indices), p, s, e, values, note)
