"""On-disk layout of a sweep: videos, their lossless metric frames, sidecars and shared initial latents.

::

    OUT/videos/<prompt_id>/<policy_slug>.mp4          the video (H.264, lossy)
    OUT/videos/<prompt_id>/<policy_slug>.frames.npz   the frames metrics use (uint8, lossless)
    OUT/videos/<prompt_id>/<policy_slug>.json         sidecar: key, timings, latent digest (written last)
    OUT/latents/<prompt_id>.safetensors               the prompt's initial latent, shared by all policies

A video counts as done when its sidecar's key matches the request and the MP4 and frames exist; the
sidecar is written last (atomically), so an interrupted run is redone, not reused.
"""

from __future__ import annotations

import json
import os
import re
from typing import List, Optional, Sequence

import numpy as np
import torch

SIDECAR_FORMAT = 1
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str) -> str:
    """A file-name-safe form of a policy label (``mxfp6:3,mxfp4:14`` -> ``mxfp6-3_mxfp4-14``)."""
    out = text.strip().replace(":", "-").replace(",", "_").replace("=", "-")
    return _SLUG.sub("_", out).strip("_") or "policy"


def save_safetensors(tensors: dict, path: str, metadata: dict) -> str:
    """``safetensors.torch.save_file``, then the file mode every other output gets (``0o666`` less the umask:
    safetensors writes through a private temporary file, mode 0600)."""
    from safetensors.torch import save_file

    save_file(tensors, path, metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return path


def write_json_atomic(path: str, payload) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=1, allow_nan=False)
    os.replace(tmp, path)


class VideoStore:
    """Paths and reuse checks under one sweep output folder."""

    def __init__(self, out: str):
        self.out = out

    def base(self, prompt_id: str, policy_slug: str) -> str:
        return os.path.join(self.out, "videos", prompt_id, policy_slug)

    def mp4(self, prompt_id: str, policy_slug: str) -> str:
        return self.base(prompt_id, policy_slug) + ".mp4"

    def frames_path(self, prompt_id: str, policy_slug: str) -> str:
        return self.base(prompt_id, policy_slug) + ".frames.npz"

    def sidecar_path(self, prompt_id: str, policy_slug: str) -> str:
        return self.base(prompt_id, policy_slug) + ".json"

    def latent_path(self, prompt_id: str) -> str:
        return os.path.join(self.out, "latents", f"{prompt_id}.safetensors")

    # -- videos ---------------------------------------------------------------------------------
    def reusable(self, prompt_id: str, policy_slug: str, key: dict, indices: Sequence[int]) -> Optional[dict]:
        """The sidecar of a finished video made with ``key`` that holds frames ``indices``, else None."""
        side = self.sidecar_path(prompt_id, policy_slug)
        if not (os.path.isfile(side) and os.path.isfile(self.mp4(prompt_id, policy_slug))
                and os.path.isfile(self.frames_path(prompt_id, policy_slug))):
            return None
        try:
            with open(side) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            return None
        if record.get("format") != SIDECAR_FORMAT or record.get("key") != key:
            return None
        if not set(indices) <= set(record.get("frame_indices", [])):
            return None
        return record

    def save_frames(self, prompt_id: str, policy_slug: str, frames: np.ndarray, indices: Sequence[int]) -> str:
        path = self.frames_path(prompt_id, policy_slug)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez_compressed(path, frames=frames[list(indices)], indices=np.asarray(indices, dtype=np.int64))
        return path

    def load_frames(self, prompt_id: str, policy_slug: str, indices: Sequence[int]) -> np.ndarray:
        """The stored frames ``indices`` (uint8 (len(indices), H, W, 3))."""
        with np.load(self.frames_path(prompt_id, policy_slug)) as data:
            stored = {int(i): n for n, i in enumerate(data["indices"])}
            return data["frames"][[stored[i] for i in indices]]

    def save_sidecar(self, prompt_id: str, policy_slug: str, record: dict) -> None:
        write_json_atomic(self.sidecar_path(prompt_id, policy_slug), dict(record, format=SIDECAR_FORMAT))

    # -- latents --------------------------------------------------------------------------------
    def load_latent(self, prompt_id: str, key: dict) -> Optional[torch.Tensor]:
        """The prompt's stored initial latent if it was made with ``key``."""
        path = self.latent_path(prompt_id)
        if not os.path.isfile(path):
            return None
        from safetensors import safe_open

        with safe_open(path, framework="pt") as fh:
            if json.loads((fh.metadata() or {}).get("key", "null")) != key:
                return None
            return fh.get_tensor("latent")

    def save_latent(self, prompt_id: str, key: dict, latent: torch.Tensor) -> None:
        path = self.latent_path(prompt_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_safetensors({"latent": latent.contiguous()}, path, metadata={"key": json.dumps(key, sort_keys=True)})


def relpath(path: str, start: str) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def existing(paths: List[str]) -> List[str]:
    return [p for p in paths if os.path.isfile(p)]
