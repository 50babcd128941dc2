"""What a sweep needs from one pipeline run, obtained by wrapping (nothing in the pipeline changes).

:class:`RunProbe` is a context manager around one ``generate_video`` call. It records

* the initial latent (the return value of ``pipe.prepare_latents``),
* the decoded frames before they are written lossily to MP4 (the return value of
  ``pipe.video_processor.postprocess_video``), so metrics see the pipeline's own pixels,
* the time of each denoising step: from the first transformer call to the end of each step
  (``callback_on_step_end``; pass :meth:`RunProbe.step_end` to the pipeline), CUDA synchronised.

Every wrapper is an instance attribute or a hook that :meth:`__exit__` removes.
"""

from __future__ import annotations

import hashlib
import time
from typing import List, Optional

import numpy as np
import torch

_MISSING = object()


def latent_digest(latent: torch.Tensor) -> str:
    """Short SHA-256 of a latent's float32 values (equal digests = the same initial latent)."""
    data = latent.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _sync(t: Optional[torch.Tensor]) -> None:
    if t is not None and t.is_cuda:
        torch.cuda.synchronize(t.device)


class _InstancePatch:
    """Set ``obj.name = value`` as an instance attribute and undo it exactly."""

    def __init__(self, obj, name: str, value):
        self.obj, self.name = obj, name
        self.old = obj.__dict__.get(name, _MISSING)
        object.__setattr__(obj, name, value)

    def undo(self) -> None:
        if self.old is _MISSING:
            self.obj.__dict__.pop(self.name, None)
        else:
            object.__setattr__(self.obj, self.name, self.old)


class RunProbe:
    """Record the initial latent, decoded frames and per-step times of one pipeline run."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.latent: Optional[torch.Tensor] = None
        self.frames: Optional[np.ndarray] = None
        self.first_call: Optional[float] = None
        self.step_ends: List[float] = []
        self._patches: List[_InstancePatch] = []
        self._hooks: list = []

    # -- wrappers -------------------------------------------------------------------------------
    def __enter__(self) -> "RunProbe":
        pipe = self.pipe
        prepare = pipe.prepare_latents
        postprocess = pipe.video_processor.postprocess_video

        def prepare_latents(*args, **kwargs):
            out = prepare(*args, **kwargs)
            latent = out[0] if isinstance(out, tuple) else out
            self.latent = latent.detach().to("cpu").clone()
            return out

        def postprocess_video(*args, **kwargs):
            out = postprocess(*args, **kwargs)
            arr = out.detach().float().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
            self.frames = arr[0] if arr.ndim == 5 else arr
            return out

        self._patches = [_InstancePatch(pipe, "prepare_latents", prepare_latents),
                         _InstancePatch(pipe.video_processor, "postprocess_video", postprocess_video)]
        for model in self._transformers():
            self._hooks.append(model.register_forward_pre_hook(self._on_transformer_call, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for patch in reversed(self._patches):
            patch.undo()
        for hook in self._hooks:
            hook.remove()
        self._patches, self._hooks = [], []

    def _transformers(self):
        comps = getattr(self.pipe, "components", {}) or {}
        return [m for name, m in sorted(comps.items()) if name.startswith("transformer") and m is not None]

    def _on_transformer_call(self, module, args, kwargs):
        if self.first_call is None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            _sync(hidden if isinstance(hidden, torch.Tensor) else None)
            self.first_call = time.perf_counter()

    def step_end(self, pipe, step, timestep, callback_kwargs):
        """``callback_on_step_end`` of diffusers pipelines: note when step ``step`` ended."""
        _sync(callback_kwargs.get("latents"))
        self.step_ends.append(time.perf_counter())
        return {}

    # -- results --------------------------------------------------------------------------------
    @property
    def step_seconds(self) -> List[float]:
        """Duration of each denoising step (the first from the first transformer call)."""
        if self.first_call is None or not self.step_ends:
            return []
        marks = [self.first_call] + self.step_ends
        return [b - a for a, b in zip(marks, marks[1:])]
