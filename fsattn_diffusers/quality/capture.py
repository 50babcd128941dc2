"""``fsattn capture``: one bf16 run of a pipeline with every self-attention call analysed.

The pipeline runs through :func:`~fsattn_diffusers.integration.runner.generate_video` with the ``bf16``
recipe on every step and a temporary attention backend (:data:`CAPTURE_BACKEND`). The fsattn
processors hand that backend each self-attention call's Q, K, V (after norms and RoPE, as attention
sees them); it answers with torch's scaled-dot-product attention in the model's dtype — the stock
computation — and, on the side, analyses a sample of query rows (:func:`.analysis.analyse`).

Each call is labelled with its denoising step, timestep, expert (``transformer`` / ``transformer_2``),
layer, CFG branch (the order of the transformer calls within a step: ``cond`` then ``uncond``, as the
Wan and HunyuanVideo pipelines call them) and batch entry.
"""

from __future__ import annotations

import heapq
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ..backends.contract import AttentionRequest, AttentionResult
from ..smoothing import valid_prefix
from .analysis import DEFAULT_ROWS, analyse, badness, resolve_recipes, sample_rows

#: Name of the temporary backend (registered only while a capture runs).
CAPTURE_BACKEND = "fsattn-capture"
#: Labels of the transformer calls within one denoising step (the pipelines call cond first).
BRANCHES = ("cond", "uncond")
#: Spreads the per-call row-sampling seeds apart.
SEED_STRIDE = 7919
#: Softmax interventions diagnosed on every call by default (Rowmax-H15's levels).
DEFAULT_INTERVENTIONS = ("octave:2",)


def branch_label(position: int) -> str:
    return BRANCHES[position] if position < len(BRANCHES) else f"call{position}"


@dataclass
class Captured:
    """What a capture run collected."""

    recipes: list
    rows: List[Dict] = field(default_factory=list)
    worst: list = field(default_factory=list)  # heap of (badness, n, tensors)
    video: Optional[str] = None
    summary: List[str] = field(default_factory=list)
    #: Softmax-diagnostic columns of the rows (:func:`softmax_fields`).
    diag_columns: List[str] = field(default_factory=list)


class _Observer:
    """The temporary backend's state: labels of the current call and the analysis of each call."""

    def __init__(self, pipe, recipes, rows: int, seed: int, backend: str, save_worst: int, interventions=()):
        self.pipe, self.recipes, self.rows, self.seed = pipe, recipes, rows, seed
        self.interventions = list(interventions)
        self.backend, self.save_worst = backend, save_worst
        self.names = [r.name for r in recipes]
        self.result = Captured(recipes)
        self._step, self._position = None, -1
        self._hooks = []

    # -- transformer calls -> CFG branch ---------------------------------------------------------
    def attach(self) -> None:
        comps = getattr(self.pipe, "components", {}) or {}
        for name, model in sorted(comps.items()):
            if name.startswith("transformer") and isinstance(model, torch.nn.Module):
                self._hooks.append(model.register_forward_pre_hook(self._on_transformer_call))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _tracker(self):
        from ..integration.install import installed

        handle = installed(self.pipe)
        return None if handle is None else handle.tracker

    def _on_transformer_call(self, module, args) -> None:
        tracker = self._tracker()
        step = None if tracker is None else tracker.step
        if step != self._step:
            self._step, self._position = step, 0
        else:
            self._position += 1

    # -- the backend ---------------------------------------------------------------------------
    def __call__(self, request: AttentionRequest) -> AttentionResult:  # the backend contract
        q, k, v, recipe, scale, kv_lens = (request.q, request.k, request.v, request.recipe, request.scale,
                                           request.kv_lens)
        self._observe(q, k, v, scale, kv_lens)
        mask = None
        if kv_lens is not None:
            mask = valid_prefix(kv_lens, k.shape[2], k.device)[:, None, None, :]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return AttentionResult(out.to(q.dtype))

    @torch.no_grad()
    def _observe(self, q, k, v, scale, kv_lens) -> None:
        tracker = self._tracker()
        rec = tracker.records[-1] if tracker is not None and tracker.records else None
        for b in range(q.shape[0]):
            n = len(self.result.rows)
            lens = None if kv_lens is None else kv_lens[b:b + 1]
            valid_q = q.shape[2] if lens is None or q.shape[2] != k.shape[2] else int(lens[0])
            sel = sample_rows(valid_q, self.rows, self.seed + SEED_STRIDE * n).to(q.device)
            qs, kb, vb = q[b:b + 1, :, sel], k[b:b + 1], v[b:b + 1]
            row = {"call": n, "step": None if rec is None else rec.step,
                   "num_steps": None if rec is None else rec.num_steps,
                   "timestep": None if rec is None else rec.timestep,
                   "expert": None if rec is None else rec.transformer,
                   "layer": None if rec is None else rec.layer, "branch": branch_label(self._position),
                   "batch": b, "heads": q.shape[1], "s_q": q.shape[2], "s_k": k.shape[2], "head_dim": q.shape[3],
                   "rows": int(sel.numel()), "kv_len": None if lens is None else int(lens[0]),
                   "dtype": str(q.dtype).replace("torch.", "")}
            row.update(analyse(qs, kb, vb, self.recipes, scale=scale, kv_lens=lens, backend=self.backend))
            diag = softmax_fields(qs[0], kb[0], vb[0], self.interventions, scale, None if lens is None else int(lens[0]))
            if not self.result.diag_columns:
                self.result.diag_columns = list(diag)
            row.update(diag)
            self.result.rows.append(row)
            self._keep_if_worst(row, qs, kb, vb, lens, scale)

    def _keep_if_worst(self, row, q, k, v, lens, scale) -> None:
        if self.save_worst <= 0:
            return
        key = badness(row, self.names)
        heap = self.result.worst
        if len(heap) >= self.save_worst and key <= heap[0][0]:
            return
        tensors = {"q": q.detach().cpu().clone(), "k": k.detach().cpu().clone(), "v": v.detach().cpu().clone()}
        if lens is not None:
            tensors["kv_lens"] = lens.detach().cpu().to(torch.int64).clone()
        item = (key, row["call"], {"row": row, "scale": scale, "tensors": tensors})
        if len(heap) < self.save_worst:
            heapq.heappush(heap, item)
        else:
            heapq.heapreplace(heap, item)


def softmax_fields(q, k, v, interventions, scale, kv_len) -> Dict[str, float]:
    """Softmax diagnostics of one call's sampled rows (q (H, R, D), k / v (H, S_k, D)).

    ``p_share_hi``, ``p_mass_hi``, ``p_share_lo``, ``p_mass_lo``: mass concentration of the exact softmax;
    ``<intervention>_<field>``: the :mod:`.diagnostics` fields of each intervention against it.
    """
    from .diagnostics import call_diagnostics, flat_fields

    labels = [getattr(i, "label", i) for i in interventions]
    fields = flat_fields(call_diagnostics(q, k, v, ["exact"] + labels, scale=scale, kv_len=kv_len))
    if "exact" not in labels:
        fields = {key: x for key, x in fields.items() if not key.startswith("exact_")}
    return fields


def run_capture(pipe, spec, prompt: str, out_video: str, recipes: Sequence = ("mxfp8", "mxfp6", "mxfp4"),
                rows: int = DEFAULT_ROWS, seed: int = 0, backend: str = "emulator", save_worst: int = 0,
                progress: bool = True, interventions: Sequence = DEFAULT_INTERVENTIONS) -> Captured:
    """Run ``pipe`` once in bf16 (stock attention numerics) and analyse every self-attention call.

    Parameters
    ----------
    spec : VideoSpec
        Size, frames, steps, guidance and seed of the run (its ``backend`` is not used).
    recipes : recipe names or Recipes analysed on each call.
    rows : query rows sampled per call and batch entry (all keys are used).
    seed : seed of the row sampling.
    backend : attention backend of the analysis (``"emulator"``: the reference numerics).
    save_worst : keep the Q/K/V of this many worst calls (by rollback rate, then error).
    interventions : softmax interventions whose diagnostics each call also gets (:func:`softmax_fields`;
        the exact softmax's mass concentration is always recorded).

    Returns
    -------
    Captured
        One row per call and batch entry; ``worst`` holds the kept calls.
    """
    from ..backends import Backend, register_backend, registered
    from ..integration.runner import generate_video
    from ..recipe import BF16_EMULATED, PRESETS
    from .loading import run_kwargs

    if rows < 1:
        raise ValueError(f"rows={rows} is not supported; accepted: an int >= 1")
    if save_worst < 0:
        raise ValueError(f"save_worst={save_worst} is not supported; accepted: an int >= 0")
    from ..interventions import parse_intervention

    ivs = [parse_intervention(i) for i in interventions]
    observer = _Observer(pipe, resolve_recipes(recipes), rows, seed, backend, save_worst, ivs)
    registered()  # load the stock backends first, so ours is only added
    register_backend(Backend(CAPTURE_BACKEND, observer, lambda device: None, lambda *a, **kw: None))
    observer.attach()
    try:
        kwargs = dict(run_kwargs(spec), backend=CAPTURE_BACKEND)
        result = generate_video(pipe, prompt, out=out_video, policy=PRESETS[BF16_EMULATED], progress=progress, **kwargs)
    finally:
        observer.detach()
        _unregister(CAPTURE_BACKEND)
    observer.result.video = result.path
    observer.result.summary = result.summary
    if progress:
        print(f"fsattn capture: {len(observer.result.rows)} self-attention calls analysed", file=sys.stderr)
    return observer.result


def _unregister(name: str) -> None:
    from .. import backends

    backends.unregister_backend(name)  # the capture backend is temporary
