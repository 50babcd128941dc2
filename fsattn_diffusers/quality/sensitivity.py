"""``fsattn sensitivity``: video damage of each softmax intervention next to its attention-level diagnostics.

Each intervention (:mod:`fsattn_diffusers.interventions`) replaces the probabilities of the pipeline's
self-attention calls — every call, or those of chosen denoising steps and transformer blocks — in
float32 arithmetic; the other calls run stock attention. Videos are generated and compared with the
bf16 video (stock diffusers attention) of the same prompt, seed and initial latent by the sweep
machinery (:mod:`.sweep`: latents, reuse, PSNR / SSIM / LPIPS, results.csv, report.md, frame grids).
On every intervened call, sampled query rows (fixed seed) also give the diagnostics of
:mod:`.diagnostics` against exact softmax on the same operands; they are pooled per video.

How it is wired: a temporary attention backend (:data:`SENSITIVITY_BACKEND`) receives the calls the
fsattn processors route to it. Each intervention is a policy whose entry is the ``exact`` recipe
renamed ``iv:<label>`` (``None``, i.e. stock attention, on steps that are not chosen); the backend
maps that name back to the intervention. Calls of blocks that are not chosen get torch's
scaled-dot-product attention in the model's dtype, as stock attention computes it. Blocks are chosen by
the index in the layer name (``blocks.<i>.``; HunyuanVideo: the dual- and the single-stream block of
that index).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from typing import Dict, List, Optional, Sequence

import torch

from ..backends.contract import AttentionRequest, AttentionResult
from ..interventions import Intervention, intervened_attention, parse_interventions
from ..smoothing import valid_prefix
from .diagnostics import FIELDS, Diagnostics
from .sensitivity_report import COLUMNS, write_sensitivity_outputs  # noqa: F401 (COLUMNS: the table's columns)
from .sweep import REFERENCE, PolicyItem

#: Name of the temporary backend (registered only while a sensitivity run generates).
SENSITIVITY_BACKEND = "fsattn-sensitivity"
#: Recipe-name prefix that marks an intervention.
NAME_PREFIX = "iv:"
#: Query rows per call and batch entry that the diagnostics use by default.
DEFAULT_ROWS = 32
_BLOCK = re.compile(r"blocks\.(\d+)\.")
#: CPU calls with at most this many scores run the intervention math on one thread (see :func:`_one_thread`).
SMALL_CALL_SCORES = 1 << 22


@contextlib.contextmanager
def _one_thread(t: torch.Tensor, scores: int):
    """One intra-op thread for a small CPU call, restored afterwards.

    The interventions and diagnostics are many small tensor operations; on a CPU shared with other
    processes each parallel one waits for descheduled worker threads, which made a tiny-model run
    ~10x slower with two threads than with one. Large calls keep every thread.
    """
    n = torch.get_num_threads()
    if t.device.type != "cpu" or scores > SMALL_CALL_SCORES or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def parse_index_set(text: Optional[str], what: str) -> Optional[frozenset]:
    """``"0-3,7"`` -> {0, 1, 2, 3, 7}; ``None`` / empty -> None (all). One-line ValueError otherwise."""
    if text is None or not str(text).strip():
        return None
    out = set()
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ValueError(f"{what} {part!r} is not an index or range; accepted: e.g. 0-3,7 (0-based)")
        out.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return frozenset(out)


def _ranges(values: Optional[frozenset]) -> str:
    if values is None:
        return "all"
    xs, parts = sorted(values), []
    start = prev = xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(parts)


def _policy(iv: Intervention, steps: Optional[frozenset]):
    from ..integration.policy import FixedPolicy, Policy
    from ..recipe import PRESETS

    entry = PRESETS["exact"].replace(name=NAME_PREFIX + iv.label)
    if steps is None:
        return FixedPolicy(entry)

    class ChosenSteps(Policy):
        """The intervention on the chosen 0-based steps, stock attention on the others."""

        name = f"{NAME_PREFIX}{iv.label}@steps={_ranges(steps)}"

        def schedule(self, num_steps: int):
            return [entry if i in steps else None for i in range(num_steps)]

    return ChosenSteps()


def item_label(iv: Intervention, steps: Optional[frozenset], layers: Optional[frozenset]) -> str:
    """Report label: the intervention, with ``@steps=..`` / ``@blocks=..`` when not every call is changed."""
    label = iv.label
    if steps is not None:
        label += f"@steps={_ranges(steps)}"
    if layers is not None:
        label += f"@blocks={_ranges(layers)}"
    return label


class _Backend:
    """The temporary backend: intervened attention plus diagnostics on sampled rows of each call."""

    def __init__(self, pipe, interventions: Sequence[Intervention], layers: Optional[frozenset], rows: int, seed: int):
        self.pipe, self.layers, self.rows, self.seed = pipe, layers, rows, seed
        self.by_name = {NAME_PREFIX + iv.label: iv for iv in interventions}
        self.current = None  # (prompt_id, label) of the video being generated
        self.acc: Dict[tuple, Diagnostics] = {}
        self.calls: Dict[tuple, List[dict]] = {}

    def _record(self):
        from ..integration.install import installed

        handle = installed(self.pipe)
        recs = None if handle is None else handle.tracker.records
        return recs[-1] if recs else None

    def __call__(self, request: AttentionRequest) -> AttentionResult:  # the backend contract
        q, k, v, recipe, scale, kv_lens = (request.q, request.k, request.v, request.recipe, request.scale,
                                           request.kv_lens)
        iv = self.by_name.get(recipe.name)
        rec = self._record()
        block = None
        if rec is not None and rec.layer:
            m = _BLOCK.search(rec.layer)
            block = int(m.group(1)) if m else None
        if iv is None or (self.layers is not None and block not in self.layers):
            mask = None
            if kv_lens is not None:
                mask = valid_prefix(kv_lens, k.shape[2], k.device)[:, None, None, :]
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            return AttentionResult(out.to(q.dtype))
        with _one_thread(q, q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]):
            return AttentionResult(self._intervene(q, k, v, iv, rec, scale, kv_lens))

    def _intervene(self, q, k, v, iv, rec, scale, kv_lens):
        from ..interventions import resolve_for_call
        from .analysis import sample_rows

        key = self.current
        acc = self.acc.setdefault(key, Diagnostics())
        outs = []
        for b in range(q.shape[0]):
            n = len(self.calls.setdefault(key, []))
            lens = None if kv_lens is None else int(kv_lens[b])
            use = resolve_for_call(iv, q[b], k[b], scale=scale, kv_len=lens)
            outs.append(intervened_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], use, scale=scale,
                                             kv_lens=None if kv_lens is None else kv_lens[b:b + 1]))
            sel = sample_rows(q.shape[2], self.rows, self.seed + 7919 * n).to(q.device)
            one = Diagnostics()
            _add_rows(one, q[b][:, sel], k[b], v[b], use, scale, lens)
            _merge(acc, one)
            res = one.result()
            call = {"step": None if rec is None else rec.step, "layer": None if rec is None else rec.layer,
                    "batch": b, **{f: res[f] for f in ("jsd", "out_rel_err", "log_rmse")}}
            if use is not iv:
                call["alpha"] = use.alpha
            self.calls[key].append(call)
        return torch.cat(outs, dim=0).to(q.dtype)


def _add_rows(acc: Diagnostics, q, k, v, iv, scale, kv_len) -> None:
    from ..interventions import Kind, valid_keys, weights

    valid = valid_keys(k.shape[1], kv_len, q.device)
    s = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2)) * scale
    p_ref, p = weights(s, Intervention(Kind.EXACT), valid), weights(s, iv, valid)
    vf = v.to(torch.float32)
    acc.add(p_ref, p, valid, p_ref @ vf, p @ vf)


def _merge(into: Diagnostics, other: Diagnostics) -> None:
    for k, x in other.sums.items():
        into.sums[k] += x


def _diag_path(store, pid: str, slug_: str) -> str:
    return store.base(pid, slug_) + ".diag.json"


def run_sensitivity(pipe, spec, prompts: Sequence[str], interventions: Sequence, out: str, *,
                    steps: Optional[frozenset] = None, layers: Optional[frozenset] = None, rows: int = DEFAULT_ROWS,
                    sample_seed: int = 0, every: int = 4, lpips=None, grid_frames: int = 4, progress: bool = True,
                    warmup: bool = True) -> dict:
    """Generate the bf16 reference and one video per intervention per prompt; compare, diagnose, report.

    Parameters
    ----------
    pipe : a Wan / HunyuanVideo diffusers pipeline
    spec : VideoSpec (its ``backend`` is replaced by :data:`SENSITIVITY_BACKEND`)
    prompts : list of str
    interventions : labels or :class:`~fsattn_diffusers.interventions.Intervention` objects
    out : output folder
    steps, layers : 0-based denoising steps / transformer block indices to intervene on (None: all)
    rows : query rows per call and batch entry for the diagnostics; sample_seed their seed
    every, lpips, grid_frames, progress, warmup : as :func:`.sweep.run_sweep`

    Returns
    -------
    dict with ``sweep`` (the :class:`.sweep.SweepResult`), ``table`` (one dict per intervention:
    :data:`COLUMNS`) and ``files``.
    """
    from ..backends import Backend, register_backend, registered, unregister_backend
    from ..integration.policy import get_policy
    from .lpips_metric import unavailable
    from .metrics import frame_indices
    from .report import write_outputs
    from .store import VideoStore, slug
    from .sweep import SweepResult, compare_all, generate_all

    if not prompts:
        raise ValueError("no prompts; accepted: --prompt TEXT (repeatable) or --prompts FILE with one per line")
    if rows < 1:
        raise ValueError(f"rows={rows} is not supported; accepted: an int >= 1")
    ivs = parse_interventions(interventions)
    start = time.perf_counter()
    spec = dataclasses.replace(spec, backend=SENSITIVITY_BACKEND)
    items = [PolicyItem(REFERENCE, REFERENCE, get_policy(REFERENCE))]
    by_label = {}
    for iv in ivs:
        label = item_label(iv, steps, layers)
        by_label[label] = iv
        items.append(PolicyItem(label, slug(label), _policy(iv, steps)))
    indices = frame_indices(spec.num_frames, every)
    named = [(f"p{i:02d}", p) for i, p in enumerate(prompts)]
    store = VideoStore(out)
    lpips = lpips or unavailable("not requested")
    backend = _Backend(pipe, ivs, layers, rows, sample_seed)
    registered()
    register_backend(Backend(SENSITIVITY_BACKEND, backend, lambda device: None, lambda *a, **kw: None))
    def before_each(pid, item):
        backend.current = (pid, item.label)

    try:
        rows_out = generate_all(pipe, spec, named, items, store, indices, progress, warmup, before_each=before_each)
    finally:
        unregister_backend(SENSITIVITY_BACKEND)
    compare_all(rows_out, store, items, indices, lpips)
    result = SweepResult(out, spec, named, items, every, indices, rows_out, lpips.describe(), lpips.available)
    result.device = str(getattr(pipe, "device", "cpu"))
    diag_key = {"spec": spec.key(), "rows": rows, "sample_seed": sample_seed}
    per_video = _video_diagnostics(backend, rows_out, store, items, diag_key)
    result.seconds = time.perf_counter() - start
    files = write_outputs(result, store, grid_frames)
    table = sensitivity_table(result, per_video, by_label)

    files.update(write_sensitivity_outputs(result, table, per_video, out, dict(
        steps=_ranges(steps), layers=_ranges(layers), rows=rows, sample_seed=sample_seed)))
    return {"sweep": result, "table": table, "files": files}


def _video_diagnostics(backend: _Backend, rows, store, items, key: dict) -> Dict[tuple, dict]:
    """``{(prompt_id, label): {"diag": {field: v}, "calls": [...]}}``: from this run, else the saved file."""
    from .store import write_json_atomic

    slugs = {it.label: it.slug for it in items}
    out = {}
    for r in rows:
        if r.policy == REFERENCE or r.status != "ok":
            continue
        k = (r.prompt_id, r.policy)
        path = _diag_path(store, r.prompt_id, slugs[r.policy])
        if k in backend.acc:
            record = {"key": key, "diag": backend.acc[k].result(), "calls": backend.calls[k]}
            from .results import jsonable

            write_json_atomic(path, jsonable(record))
            out[k] = record
        elif os.path.isfile(path):
            with open(path) as fh:
                record = json.load(fh)
            if record.get("key") == json.loads(json.dumps(key)):
                from .results import from_json

                record["diag"] = {f: from_json(x) for f, x in record["diag"].items()}
                out[k] = record
    return out


def sensitivity_table(result, per_video: Dict[tuple, dict], by_label: Dict[str, Intervention]) -> List[dict]:
    """One row per intervention: mean video metrics over prompts and the mean of the videos' diagnostics."""
    from .results import policy_means

    means = {m["policy"]: m for m in policy_means(result)}
    table = []
    for label, iv in by_label.items():
        m = means.get(label, {})
        diags = [v["diag"] for (pid, lab), v in per_video.items() if lab == label]
        row = {"intervention": label, "family": iv.family, "videos": m.get("videos", 0), "psnr_db": m.get("psnr_db"),
               "ssim": m.get("ssim"), "lpips": m.get("lpips"),
               "mse": _mean([r.metrics.means["mse"] for r in result.rows
                             if r.policy == label and r.metrics is not None]),
               "calls": sum(len(v["calls"]) for (pid, lab), v in per_video.items() if lab == label)}
        for f in FIELDS:
            row[f] = _mean([d[f] for d in diags])
        table.append(row)
    return table


def _mean(values):
    import math

    vals = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else None
