"""``fsattn sensitivity --attention-only``: per-call diagnostics of each intervention in one transformer forward.

The Wan2.2-T2V-A14B transformer (one expert, :data:`fsattn_diffusers.measure.e2e.WAN22_A14B`) is built with
random N(0, 0.02) weights by :func:`fsattn_diffusers.measure.e2e.build_transformer` (``tiny``: a 2-layer,
2-head model of the same architecture for CPU checks) and run once at timestep ``t`` on random
latents of the given frames x height x width. Every self-attention call runs stock attention (torch
SDPA in the model's dtype) so the forward is the unmodified model; on the side, sampled query rows of
each call (all heads, all keys) give, for each intervention, the diagnostics of :mod:`.diagnostics`
against exact fp32 softmax and the relative error of the attention output of those rows.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch

from ..backends.contract import AttentionRequest, AttentionResult
from ..quality.diagnostics import FIELDS
from .provenance import commit

ATTENTION_BACKEND = "fsattn-sensitivity-attention"
MODEL_SIZES = ("wan22", "tiny")
#: The tiny CPU configuration (same architecture, small widths).
TINY_SCALE = dict(num_attention_heads=2, attention_head_dim=64, ffn_dim=256, num_layers=2, text_dim=64)
#: Default (frames, height, width) per model size: the paper's 81 x 720x1280 (75,600 tokens) for wan22; for tiny,
#: 17 x 256x256 (1,280 tokens), a few seconds on a CPU.
DEFAULT_SHAPES = {"wan22": (81, 720, 1280), "tiny": (17, 256, 256)}
ATTN_JSON, ATTN_MD = "attention.json", "attention.md"
#: Per-intervention summary columns: each diagnostic's mean over calls, and the maximum output error.
SUMMARY_FIELDS = FIELDS + ("max_out_rel_err",)


class _Observer:
    def __init__(self, model, interventions, rows: int, seed: int, bar=None):
        self.model, self.ivs, self.rows, self.seed, self.bar = model, interventions, rows, seed, bar
        self.calls: List[Dict] = []
        self.seconds = 0.0

    def __call__(self, request: AttentionRequest) -> AttentionResult:  # the backend contract
        q, k, v, recipe, scale, kv_lens = (request.q, request.k, request.v, request.recipe, request.scale,
                                           request.kv_lens)
        from ..integration.install import installed
        from ..quality.analysis import sample_rows
        from ..quality.diagnostics import call_diagnostics

        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
        t0 = time.perf_counter()
        handle = installed(self.model)
        rec = handle.tracker.records[-1] if handle is not None and handle.tracker.records else None
        for b in range(q.shape[0]):
            n = len(self.calls)
            lens = None if kv_lens is None else int(kv_lens[b])
            sel = sample_rows(q.shape[2], self.rows, self.seed + 7919 * n).to(q.device)
            diag = call_diagnostics(q[b][:, sel], k[b], v[b], self.ivs, scale=scale, kv_len=lens)
            self.calls.append({"call": n, "layer": None if rec is None else rec.layer, "batch": b,
                               "heads": q.shape[1], "s_q": q.shape[2], "s_k": k.shape[2], "head_dim": q.shape[3],
                               "rows": int(sel.numel()), "diagnostics": diag})
        if q.is_cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t0
        if self.bar is not None:
            self.bar.update(1)
        return AttentionResult(out.to(q.dtype))


def _model_spec(model_size: str, frames: int, height: int, width: int, layers: Optional[int]):
    from . import e2e

    if model_size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {model_size!r}; accepted: {', '.join(MODEL_SIZES)}")
    scale = dict(TINY_SCALE) if model_size == "tiny" else {}
    if layers is not None:
        scale["num_layers"] = layers
    spec = e2e.wan22_spec(frames=frames, height=height, width=width, scale=scale)
    if model_size == "tiny":
        spec.name = "wan2.2-t2v-a14b-architecture-tiny"
        spec.text_tokens = 16
    return spec


def summarize(calls: List[Dict], labels: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """Per intervention: the mean over calls of each diagnostic, and the largest output error."""
    out = {}
    for label in labels:
        per = [c["diagnostics"][label] for c in calls]
        row = {}
        for f in FIELDS:
            vals = [d[f] for d in per if isinstance(d[f], float) and not math.isnan(d[f])]
            row[f] = statistics.fmean(vals) if vals else math.nan
        errs = [d["out_rel_err"] for d in per if not math.isnan(d["out_rel_err"])]
        row["max_out_rel_err"] = max(errs) if errs else math.nan
        out[label] = row
    return out


def run_attention_only(interventions: Sequence, *, model_size: str = "wan22", frames: Optional[int] = None,
                       height: Optional[int] = None, width: Optional[int] = None, layers: Optional[int] = None,
                       rows: int = 256, sample_seed: int = 0, timestep: float = 999.0, device: str = "cuda",
                       dtype=torch.bfloat16, seed: int = 0, progress: bool = False) -> Dict:
    """One forward of the random-weight transformer with every self-attention call diagnosed.

    ``frames``, ``height`` and ``width`` default to :data:`DEFAULT_SHAPES` of ``model_size``; with ``progress``,
    a bar on stderr counts the self-attention calls of the forward (total and time left).

    Returns
    -------
    dict with ``meta`` (device, versions, date, tokens, config, seconds), ``summary``
    (``{label: {field: value}}``, :data:`SUMMARY_FIELDS`) and ``calls`` (per call and batch entry).
    """
    from . import e2e
    from ..backends import Backend, register_backend, registered, unregister_backend
    from ..integration.install import apply, remove
    from ..interventions import parse_interventions
    from ..recipe import PRESETS

    ivs = parse_interventions(interventions)
    if rows < 1:
        raise ValueError(f"rows={rows} is not supported; accepted: an int >= 1")
    if model_size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {model_size!r}; accepted: {', '.join(MODEL_SIZES)}")
    default = DEFAULT_SHAPES[model_size]
    frames, height, width = (default[i] if v is None else v for i, v in enumerate((frames, height, width)))
    for name, value in (("height", height), ("width", width)):
        if value < 16 or value % 16:
            raise ValueError(f"{name} {value} is not a positive multiple of 16")
    if frames < 1 or (frames - 1) % 4:
        raise ValueError(f"frames {frames} is not 4k + 1 (the VAE compresses time by 4)")
    spec = _model_spec(model_size, frames, height, width, layers)
    dev = torch.device(device)
    t0 = time.perf_counter()
    model = e2e.build_transformer(spec, dev, dtype=dtype, seed=seed)
    inputs = e2e.make_inputs(spec, dev, dtype=dtype, seed=seed)
    build_s = time.perf_counter() - t0
    from tqdm import tqdm

    bar = tqdm(total=spec.config["num_layers"], desc="attention calls", unit="call", file=sys.stderr,
               disable=not progress)
    observer = _Observer(model, ivs, rows, sample_seed, bar)
    registered()
    register_backend(Backend(ATTENTION_BACKEND, observer, lambda d: None, lambda *a, **kw: None))
    try:
        apply(model, policy=PRESETS["exact"], backend=ATTENTION_BACKEND)
        t1 = time.perf_counter()
        with torch.no_grad():
            model(**inputs(timestep))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        forward_s = time.perf_counter() - t1
    finally:
        bar.close()
        remove(model)
        unregister_backend(ATTENTION_BACKEND)
    import diffusers

    labels = [iv.label for iv in ivs]
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv,
            "command": "fsattn " + " ".join(sys.argv[1:]), "commit": commit(),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "diffusers": diffusers.__version__},
            "model": spec.name, "model_size": model_size, "dtype": str(dtype).replace("torch.", ""),
            "frames": frames, "height": height, "width": width, "latent": list(spec.latent),
            "tokens": e2e.image_tokens(spec), "timestep": timestep, "weight_std": e2e.WEIGHT_STD, "seed": seed,
            "rows": rows, "sample_seed": sample_seed, "config": spec.config, "build_s": build_s,
            "forward_s": forward_s, "diagnostics_s": observer.seconds, "interventions": labels}
    return {"meta": meta, "summary": summarize(observer.calls, labels), "calls": observer.calls}


def _cell(x, digits: int = 3) -> str:
    if not isinstance(x, float):
        return str(x)
    return "nan" if math.isnan(x) else f"{x:.{digits}g}"


def _command(argv: List[str]) -> str:
    """``fsattn ...`` for a run through the CLI (``python -m fsattn_diffusers`` or the script), else argv."""
    if argv and (argv[0].endswith("__main__.py") or os.path.basename(argv[0]) == "fsattn"):
        return " ".join(["fsattn"] + list(argv[1:]))
    return " ".join(argv)


def attention_markdown(result: Dict) -> str:
    m = result["meta"]
    lines = ["# fsattn sensitivity --attention-only", "",
             f"* {m['model']} ({m['config']['num_layers']} layers, {m['config']['num_attention_heads']} heads of "
             f"{m['config']['attention_head_dim']}), random N(0, {m['weight_std']}) weights, {m['dtype']}; "
             f"{m['frames']} frames {m['width']}x{m['height']} = {m['tokens']} tokens; one forward at t = "
             f"{m['timestep']}",
             f"* device `{m['device']}`; torch {m['versions']['torch']}, diffusers {m['versions']['diffusers']}, "
             f"Python {m['versions']['python']}; {m['date']}",
             f"* command: `{_command(m['argv'])}`",
             f"* {len(result['calls'])} self-attention calls (stock SDPA in the forward); per call {m['rows']} "
             f"sampled query rows (seed {m['sample_seed']}), all heads and keys, against exact fp32 softmax",
             f"* build {m['build_s']:.1f} s, forward {m['forward_s']:.1f} s (diagnostics {m['diagnostics_s']:.1f} s "
             "of it)", "",
             "Means over calls (out err: relative error of the rows' attention output; max: the worst call):", "",
             "| intervention | JSD | log RMSE | weighted | out err | max out err | zeroed | zeroed mass | "
             "share >= 0.1 | mass >= 0.1 | share < 1e-4 | mass < 1e-4 |", "| --- " * 12 + "|"]
    for label, r in result["summary"].items():
        lines.append("| " + " | ".join([label] + [_cell(r[f]) for f in (
            "jsd", "log_rmse", "weighted_log_err", "out_rel_err", "max_out_rel_err", "zero_share", "dropped_mass",
            "share_hi", "mass_hi", "share_lo", "mass_lo")]) + " |")
    first = next(iter(result["summary"].values()), None)
    if first is not None:
        lines += ["", f"Exact softmax: {_cell(100 * first['ref_share_hi'])}% of positions have p >= 0.1 and carry "
                  f"{_cell(100 * first['ref_mass_hi'])}% of the weight per row; {_cell(100 * first['ref_share_lo'])}% "
                  f"have p < 1e-4 and carry {_cell(100 * first['ref_mass_lo'])}%."]
    return "\n".join(lines) + "\n"


def write_attention_outputs(result: Dict, out: str) -> Dict[str, str]:
    from ..quality.results import json_numbers

    os.makedirs(out, exist_ok=True)
    files = {"json": os.path.join(out, ATTN_JSON), "report": os.path.join(out, ATTN_MD)}
    with open(files["json"], "w") as fh:
        json.dump(json_numbers(result), fh, indent=1, allow_nan=False, default=str)
    with open(files["report"], "w", encoding="utf-8") as fh:
        fh.write(attention_markdown(result))
    return files
