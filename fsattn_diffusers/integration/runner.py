"""Load a Wan / HunyuanVideo pipeline, run it under a policy and write an MP4.

Shared by ``fsattn generate`` and the ready runners in :mod:`fsattn_diffusers.pipelines`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

#: model_index.json class names we run, and our short model-type names.
PIPELINE_TYPES = {"WanPipeline": "wan", "HunyuanVideoPipeline": "hunyuan_video"}
#: Video sizes must be multiples of this (VAE stride 8 x patch 2).
SIZE_MULTIPLE = 16
#: ``owner/name``: what we try on the Hub when no such directory exists.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Both VAEs compress time by 4: a video has 4k + 1 frames.
TEMPORAL_STRIDE = 4


class LoadError(ValueError):
    """A model that cannot be loaded (missing path, unknown type): one line for the user."""


def model_type(pipe) -> str:
    """``"wan"`` or ``"hunyuan_video"`` for a loaded pipeline (LoadError otherwise)."""
    name = type(pipe).__name__
    if name not in PIPELINE_TYPES:
        raise LoadError(f"unsupported pipeline {name}; accepted: {', '.join(PIPELINE_TYPES)}")
    return PIPELINE_TYPES[name]


def check_model(model: str) -> str:
    """Validate ``model`` (a directory or a Hub id) before loading weights; return its model type.

    Raises
    ------
    LoadError
        Missing path, a directory without ``model_index.json``, a pipeline class we do not run, or a
        Hub id that is neither on a reachable Hub nor in the local cache (found within
        :data:`HUB_TIMEOUT_S` when the Hub does not answer).
    """
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        index = os.path.join(path, "model_index.json")
        if not os.path.isfile(index):
            raise LoadError(f"{model} is not a diffusers pipeline directory (no model_index.json)")
        with open(index) as f:
            cls = json.load(f).get("_class_name")
    elif os.path.exists(path):
        raise LoadError(f"model path {model} is not a directory")
    elif not _HUB_ID.match(model):
        raise LoadError(f"model path {model} does not exist")
    elif hub_unreachable_reason() is not None:
        cls = _cached_class_name(model)
    else:
        from diffusers import DiffusionPipeline

        try:
            cls = DiffusionPipeline.load_config(model).get("_class_name")
        except Exception as exc:  # no network, no such repo, no access: one line for the user
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LoadError(f"cannot load {model}: no such directory, and the Hub lookup failed ({first}); "
                            f"for a local copy pass its directory") from None
    if cls not in PIPELINE_TYPES:
        raise LoadError(f"unknown model type {cls!r} in {model}; accepted: {', '.join(PIPELINE_TYPES)} "
                        f"(Wan2.1, Wan2.2, HunyuanVideo)")
    return PIPELINE_TYPES[cls]


#: Seconds the Hub reachability check waits for an answer.
HUB_TIMEOUT_S = 5.0


@functools.lru_cache(maxsize=None)
def hub_unreachable_reason() -> Optional[str]:
    """``None`` when the Hugging Face Hub answers (any HTTP status), else why not, in a few words.

    One HEAD request to ``HF_ENDPOINT`` with a :data:`HUB_TIMEOUT_S` timeout and no retries (a load
    through diffusers retries for about 25 s before it gives up); ``HF_HUB_OFFLINE=1`` counts as
    unreachable without a request. Checked once per process.
    """
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - DNS, refused, timeout, proxy: whatever kept the answer away
        text = " ".join(str(exc).split()) or "no answer"
        return f"{type(exc).__name__}: {text}"[:200]
    return None


def _cached_class_name(model: str) -> Optional[str]:
    """Pipeline class of Hub id ``model`` from the local Hugging Face cache (the Hub being unreachable)."""
    from huggingface_hub import constants, try_to_load_from_cache

    index = try_to_load_from_cache(model, "model_index.json")
    if isinstance(index, str) and os.path.isfile(index):
        with open(index) as f:
            return json.load(f).get("_class_name")
    raise LoadError(f"cannot load {model}: no such directory, the Hugging Face Hub ({constants.ENDPOINT}) is "
                    f"unreachable ({hub_unreachable_reason()}) and {model} is not in the local cache; download "
                    f"it where the Hub is reachable (e.g. `hf download {model} --local-dir DIR`) and pass "
                    f"that directory as --model DIR")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_pipeline(model: str, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
    """``from_pretrained`` a Wan / HunyuanVideo pipeline (directory or Hub id), VAE in float32.

    ``dtype`` defaults to bfloat16 on CUDA and float32 elsewhere.
    """
    from diffusers import DiffusionPipeline

    check_model(model)
    device = device or default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {"default": dtype, "vae": torch.float32}
    path = os.path.expanduser(model)
    offline = {} if os.path.isdir(path) or hub_unreachable_reason() is None else {"local_files_only": True}
    try:
        from diffusers.utils.deprecation_utils import _resolve_dtype  # noqa: F401  (``dtype=`` accepted)
        pipe = DiffusionPipeline.from_pretrained(path, dtype=dtypes, **offline)
    except ImportError:
        pipe = DiffusionPipeline.from_pretrained(path, torch_dtype=dtype, **offline)
    model_type(pipe)
    return pipe


def check_video_size(height: int, width: int, num_frames: int) -> None:
    """One-line ValueError unless sizes are multiples of 16 and frames are 4k + 1."""
    for name, value in (("height", height), ("width", width)):
        if value < SIZE_MULTIPLE or value % SIZE_MULTIPLE:
            raise ValueError(f"--{name} {value} is not a positive multiple of {SIZE_MULTIPLE}")
    if num_frames < 1 or (num_frames - 1) % TEMPORAL_STRIDE:
        lower = max(1, (num_frames - 1) // TEMPORAL_STRIDE * TEMPORAL_STRIDE + 1)
        raise ValueError(f"--frames {num_frames} is not 4k + 1 (the VAE compresses time by {TEMPORAL_STRIDE}); "
                         f"try {lower} or {lower + TEMPORAL_STRIDE}")


def to_uint8_frames(frames) -> np.ndarray:
    """(F, H, W, 3) uint8 from diffusers' ``output_type="np"`` frames (floats in [0, 1])."""
    arr = np.asarray(frames)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return arr


def write_mp4(frames, path: str, fps: int) -> str:
    """Write (F, H, W, 3) frames as an H.264 MP4 (yuv420p) with imageio-ffmpeg; return the path."""
    import imageio

    arr = to_uint8_frames(frames)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
                            macro_block_size=1, ffmpeg_log_level="error") as writer:
        for frame in arr:
            writer.append_data(frame)
    return path


@dataclass
class GenerateResult:
    path: str
    num_frames: int
    height: int
    width: int
    seconds: float
    summary: List[str] = field(default_factory=list)


def announce_backend(policies, backend: str, device) -> None:
    """Say before a run's progress bars start, not in their middle, that its fsattn steps run on a slow backend.

    Parameters
    ----------
    policies : iterable of Policy
        The policies of the run; those without an fsattn step (stock attention, diffusers' backends) run nothing.
    backend : str
        The backend asked for (``"auto"``: the automatic order); a baseline policy's own backend wins.
    device : torch.device or str
        Where the attention runs. The backend named is the one :func:`fsattn_diffusers.backends.fast_path` picks
        there for the policy's first fsattn step (the one asked for when it is usable there, else the automatic
        order's first usable one, as a call falls back); a call that backend cannot take falls back at run time with
        its own notice. A policy that cannot plan its steps is passed over here (its run reports the failure).
    """
    from ..backends import fast_path, warn_if_slow

    for policy in policies:
        try:
            entries = policy.schedule(policy.reference_steps or 1)
        except Exception:  # noqa: BLE001 - a policy that cannot plan fails in its run, which reports it
            continue
        recipe = next((entry for entry in entries if entry is not None), None)
        if recipe is None:
            continue
        path = fast_path(recipe, torch.device(device), policy.backend or backend)
        if path is not None:
            warn_if_slow(path[0])


def generate_video(pipe, prompt: str, *, out: str, height: int, width: int, num_frames: int, steps: int,
                   guidance_scale: float, guidance_scale_2: Optional[float] = None, negative_prompt: str = "",
                   seed: int = 0, fps: int = 16, policy="hybrid", backend: str = "auto",
                   progress: bool = True, **pipeline_kwargs) -> GenerateResult:
    """Install ``policy`` on ``pipe``, generate one video, write it to ``out``, restore ``pipe``."""
    from .install import apply, remove

    check_video_size(height, width, num_frames)
    kind = model_type(pipe)
    handle = apply(pipe, policy=policy, backend=backend)
    announce_backend([handle.policy], backend, getattr(pipe, "device", "cpu"))
    pipe.set_progress_bar_config(disable=not progress)
    kwargs = dict(prompt=prompt, height=height, width=width, num_frames=num_frames, num_inference_steps=steps,
                  generator=torch.Generator(device="cpu").manual_seed(seed), output_type="np")
    if kind == "wan":
        kwargs.update(negative_prompt=negative_prompt, guidance_scale=guidance_scale)
        if getattr(pipe, "transformer_2", None) is not None:
            kwargs["guidance_scale_2"] = guidance_scale if guidance_scale_2 is None else guidance_scale_2
    else:  # HunyuanVideo: embedded guidance; true CFG only with a negative prompt
        kwargs.update(guidance_scale=guidance_scale)
        if negative_prompt:
            kwargs.update(negative_prompt=negative_prompt, true_cfg_scale=guidance_scale_2 or 1.0)
    kwargs.update(pipeline_kwargs)
    start = time.perf_counter()
    try:
        frames = pipe(**kwargs).frames[0]
        seconds = time.perf_counter() - start
        summary = handle.summary()
    finally:
        remove(pipe)
    write_mp4(frames, out, fps)
    arr = np.asarray(frames)
    return GenerateResult(out, arr.shape[0], arr.shape[1], arr.shape[2], seconds, summary)
