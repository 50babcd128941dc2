"""Pipeline and run settings for the quality commands (same model handling as ``fsattn generate``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch

#: ``model`` value that names the embedded offline smoke model.
TINY_MODEL = "tiny-wan2.2"


@dataclass(frozen=True)
class VideoSpec:
    """Everything besides prompt and policy that decides a generated video (part of the skip key)."""

    model: str
    height: int
    width: int
    num_frames: int
    steps: int
    guidance_scale: float
    guidance_scale_2: Optional[float]
    negative_prompt: str
    seed: int
    fps: int
    backend: str

    def key(self) -> dict:
        return asdict(self)


def build_pipeline(model: Optional[str], device: Optional[torch.device] = None,
                   dtype: Optional[torch.dtype] = None):
    """Load ``model`` (directory or Hub id) or build the tiny smoke model; return ``(pipe, settings)``.

    Raises
    ------
    fsattn_diffusers.integration.runner.LoadError
        A model that cannot be loaded (one line).
    """
    from ..integration.runner import check_model, default_device, load_pipeline
    from ..integration.tiny import tiny_wan22_pipeline
    from ..pipelines.settings import TINY_WAN22, configure_scheduler, settings_for

    device = device or default_device()
    if model is None:
        pipe, settings = tiny_wan22_pipeline(), TINY_WAN22
        if dtype is not None:
            pipe.to(dtype=dtype)
    else:
        check_model(model)
        pipe = load_pipeline(model, device=device, dtype=dtype)
        settings = settings_for(pipe)
        configure_scheduler(pipe, settings)
    pipe.to(device)
    return pipe, settings


def video_spec(settings, model: Optional[str], seed: int, backend: str, **overrides) -> VideoSpec:
    """A :class:`VideoSpec` from run settings with the non-None ``overrides`` applied."""
    s = settings.with_overrides(**overrides)
    return VideoSpec(model=model or TINY_MODEL, height=s.height, width=s.width, num_frames=s.num_frames,
                     steps=s.steps, guidance_scale=s.guidance_scale, guidance_scale_2=s.guidance_scale_2,
                     negative_prompt=s.negative_prompt, seed=seed, fps=s.fps, backend=backend)


def run_kwargs(spec: VideoSpec) -> dict:
    """Keyword arguments of :func:`~fsattn_diffusers.integration.runner.generate_video` for ``spec``."""
    return dict(height=spec.height, width=spec.width, num_frames=spec.num_frames, steps=spec.steps,
                guidance_scale=spec.guidance_scale, guidance_scale_2=spec.guidance_scale_2,
                negative_prompt=spec.negative_prompt, seed=spec.seed, fps=spec.fps, backend=spec.backend)
