"""LPIPS (AlexNet) through the ``lpips`` package, with the backbone from the standard torch cache.

Nothing is downloaded. The AlexNet backbone comes from
``<torch.hub.get_dir()>/checkpoints/alexnet-owt-7be5be79.pth`` (torchvision's ImageNet weights, where
torchvision and ``lpips`` put them) or an explicit file; the linear calibration layers ship inside the
``lpips`` package. When ``lpips`` does not import (it needs torchvision) or the weights are absent,
:func:`load_lpips` returns an unavailable metric whose ``reason`` is one line; reports then mark the
LPIPS column ``unavailable`` (never zero, never blank).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

#: torchvision's AlexNet ImageNet weights (``AlexNet_Weights.IMAGENET1K_V1``) as the torch cache names them.
ALEXNET_WEIGHTS_FILE = "alexnet-owt-7be5be79.pth"
#: Prefix of the AlexNet feature layers in that state dict (``features.<index>.weight``).
FEATURES_PREFIX = "features."
#: Frames per LPIPS forward pass (bounds memory on large frames).
LPIPS_BATCH = 8


def one_line(exc: BaseException) -> str:
    """First line of an exception message (its type name when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def default_weights_path() -> str:
    """Where the torch cache keeps the AlexNet backbone (``$TORCH_HOME/hub/checkpoints/...``)."""
    return os.path.join(torch.hub.get_dir(), "checkpoints", ALEXNET_WEIGHTS_FILE)


@dataclass
class LpipsMetric:
    """An LPIPS scorer, or the one-line reason why there is none."""

    model: Optional[torch.nn.Module]
    reason: Optional[str] = None
    weights: Optional[str] = None
    device: str = "cpu"

    @property
    def available(self) -> bool:
        return self.model is not None

    def describe(self) -> str:
        """One line for reports."""
        if not self.available:
            return self.reason or "LPIPS unavailable"
        return f"LPIPS (AlexNet, lpips package) with backbone weights {self.weights}"

    @torch.no_grad()
    def score(self, ref: np.ndarray, test: np.ndarray) -> List[float]:
        """LPIPS per frame of two uint8 stacks (F, H, W, 3); 0 for identical frames."""
        if not self.available:
            raise RuntimeError(self.describe())
        out: List[float] = []
        for start in range(0, len(ref), LPIPS_BATCH):
            a = _to_lpips_input(ref[start:start + LPIPS_BATCH], self.device)
            b = _to_lpips_input(test[start:start + LPIPS_BATCH], self.device)
            out.extend(float(x) for x in self.model(a, b).flatten().cpu())
        return out


def _to_lpips_input(frames: np.ndarray, device: str) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> float32 (N, 3, H, W) in [-1, 1] (what ``lpips.LPIPS`` expects)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(device=device, dtype=torch.float32)
    return x.permute(0, 3, 1, 2) / 127.5 - 1.0


def load_alexnet_features(net: torch.nn.Module, state: dict) -> None:
    """Copy AlexNet ``features.*`` weights into lpips' sliced AlexNet (``slice<k>.<index>.*``).

    Raises
    ------
    KeyError
        When the state dict lacks a feature layer the LPIPS network needs.
    """
    mapped = {}
    for name in net.state_dict():
        layer = name.split(".", 1)[1]  # "slice2.3.weight" -> "3.weight" (torchvision's features index)
        key = FEATURES_PREFIX + layer
        if key not in state:
            raise KeyError(f"weights file has no {key!r} (an AlexNet ImageNet state dict has "
                           f"features.0 ... features.10)")
        mapped[name] = state[key]
    net.load_state_dict(mapped, strict=True)


def load_lpips(weights: Optional[str] = None, device: str = "cpu") -> LpipsMetric:
    """An LPIPS (AlexNet) scorer with the backbone from ``weights`` or the torch cache; never downloads.

    Returns
    -------
    LpipsMetric
        ``available`` False with a one-line ``reason`` when lpips does not import or the weights are
        missing or unreadable.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import lpips
    except Exception as exc:  # ImportError, or torchvision failing to register its ops
        return LpipsMetric(None, f"LPIPS unavailable: the lpips package does not import here ({one_line(exc)})")
    path = weights or default_weights_path()
    if not os.path.isfile(path):
        return LpipsMetric(None, f"LPIPS unavailable: no AlexNet weights at {path} (torch cache; nothing is "
                                 f"downloaded — put {ALEXNET_WEIGHTS_FILE} there)")
    try:
        with warnings.catch_warnings():  # torchvision's deprecation notes for pretrained=False
            warnings.simplefilter("ignore")
            model = lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True, verbose=False)
        state = torch.load(path, map_location="cpu", weights_only=True)
        load_alexnet_features(model.net, state)
    except Exception as exc:
        return LpipsMetric(None, f"LPIPS unavailable: cannot load {path} ({one_line(exc)})")
    return LpipsMetric(model.eval().to(device), None, path, str(device))


def unavailable(reason: str) -> LpipsMetric:
    """An LPIPS metric switched off on purpose (``reason`` is shown in reports)."""
    return LpipsMetric(None, f"LPIPS unavailable: {reason}")
