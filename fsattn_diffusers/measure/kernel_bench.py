"""Kernel timing for ``fsattn bench``: our recipes against torch SDPA (cuDNN, flash), FlashAttention-3 (bf16 and
FP8) and SageAttention, in one process.

For each shape: median time of ``triton.testing.do_bench``, TFLOP/s = 4 B H S_q S_k D / t, and the relative
error and cosine against exact attention (float64 softmax) on sampled query rows. Every row carries three
ratios: against SDPA-cuDNN, against the fastest bf16 baseline of the run (cuDNN, flash or FA3 bf16, named in
``best_bf16``) and against FA3 FP8. Our rows include the pre-pass (Hadamard + MX quantization); FA3 FP8's row
includes the quantization of Q, K and V to E4M3 with one scale per (batch, head) (what the ``fa3-fp8`` policy
runs); both are also timed apart (``prepass_ms``: pre-pass or quantization, ``kernel_ms``: attention alone).
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Callable, Dict, List

from ..formats import QKFormat
from . import provenance

#: Named shapes (B, H, S, D): paper Table 5; Wan2.1-1.3B 480p; Wan2.2-A14B 720p; HunyuanVideo 720p 129f.
SHAPES = {
    "paper": (1, 24, 32768, 128),
    "wan21": (1, 12, 32760, 128),
    "wan22": (1, 40, 75600, 128),
    "hunyuan": (1, 24, 119040, 128),
}
RECIPES = ("mxfp8", "mxfp6", "mxfp4")
#: Baselines by their ``--baselines`` name -> the method name of their rows.
BASELINE_METHODS = {"cudnn": "sdpa-cudnn", "flash": "sdpa-flash", "fa3": "fa3-bf16", "fa3-fp8": "fa3-fp8",
                    "sage": "sageattention"}
BASELINES = tuple(BASELINE_METHODS)
SAGE_METHOD = BASELINE_METHODS["sage"]
#: The bf16 baselines; the fastest of them in a run is the ``best_bf16`` reference.
BF16_METHODS = ("sdpa-cudnn", "sdpa-flash", "fa3-bf16")
# Query rows sampled per (batch, head) for the accuracy columns.
SAMPLE_ROWS = 256


def exact_rows(q, k, v, rows, scale):
    """Exact attention (float64 softmax on the bf16 inputs) for query rows ``rows``; (B, H, len(rows), D)."""
    from ..testing import exact_attention

    return exact_attention(q[:, :, rows], k, v, scale)[0]


def timed(fn, warmup, rep) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def sdpa_fn(q, k, v, backend_name: str):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend_name]

    def run():
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return run


def sage_fn(q, k, v, scale=None):
    """SageAttention's ``sageattn`` on BHSD (``tensor_layout='HND'``), or the one-line reason (str) when
    ``sageattention`` is not importable (:mod:`fsattn_diffusers.integration.sage` says which one runs)."""
    from ..integration.sage import sage_call, sage_missing

    why = sage_missing()
    if why is not None:
        return why
    return lambda: sage_call(q, k, v, scale)


def sage_record() -> Dict:
    """``{"sageattention": which SageAttention is imported (its identity dict, None when absent)}``."""
    from ..integration.sage import sage_identity

    return {"sageattention": sage_identity()}


def fa3_fns(q, k, v, scale):
    """FlashAttention-3 callables on (B, H, S, D) bf16 ``q, k, v`` (their BSHD copies are made once, untimed).

    Returns
    -------
    ``{"fa3": run, "fa3-fp8": (run, quantize, kernel)}``, each ``run`` giving a (B, H, S_q, D) view, or a
    one-line reason (str) when ``fa3-fwd`` is not importable. ``fa3-fp8``'s ``run`` quantizes Q, K, V to E4M3
    (one scale per batch and head, :func:`~fsattn_diffusers.backends.fa3_backend.fp8_per_head`) and calls the
    kernel; ``quantize`` and ``kernel`` are the two halves, timed apart.
    """
    from ..backends.fa3_backend import fa3_missing, fa3_module, fp8_per_head

    why = fa3_missing()
    if why is not None:
        return why
    fa3 = fa3_module()
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def bf16():
        return fa3.flash_attn_func(qs, ks, vs, softmax_scale=scale, causal=False).transpose(1, 2)

    def quantize():
        return [fp8_per_head(t) for t in (qs, ks, vs)]

    held = quantize()

    def fp8_call(parts):
        (q8, qd), (k8, kd), (v8, vd) = parts
        return fa3.flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=False, q_descale=qd, k_descale=kd,
                                   v_descale=vd).transpose(1, 2)

    return {"fa3": bf16, "fa3-fp8": (lambda: fp8_call(quantize()), quantize, lambda: fp8_call(held))}


def baseline_callables(q, k, v, scale, baselines) -> Dict:
    """``{name: (run, {part: function}, row fields) or the one-line reason it is skipped}`` for the ``--baselines``
    names ``baselines`` on (B, H, S, D) ``q, k, v``; SageAttention's row fields say which one runs
    (:func:`sage_record`)."""
    fa3 = fa3_fns(q, k, v, scale) if {"fa3", "fa3-fp8"} & set(baselines) else None
    out = {}
    for name in baselines:
        parts, extra = {}, {}
        if name in ("fa3", "fa3-fp8"):
            if isinstance(fa3, str):
                out[name] = fa3
                continue
            fn = fa3[name]
            if name == "fa3-fp8":
                fn, quantize, kernel = fn
                parts = {"prepass_ms": quantize, "kernel_ms": kernel}
        elif name == "sage":
            fn = sage_fn(q, k, v, scale)
            if isinstance(fn, str):
                out[name] = fn
                continue
            extra = sage_record()
        else:
            fn = sdpa_fn(q, k, v, name)
        out[name] = (fn, parts, extra)
    return out


def add_ratios(results: List[Dict]) -> List[Dict]:
    """Set ``speedup_vs_cudnn``, ``speedup_vs_best_bf16`` (+ ``best_bf16``, its method), ``speedup_vs_fa3_fp8``
    (FA3 FP8 with its Q/K/V quantization), ``speedup_vs_fa3_fp8_kernel`` (FA3 FP8's kernel alone, inputs already in
    E4M3) and ``speedup_vs_sage`` (SageAttention's whole call, its quantization included) on every row of one shape's
    ``results`` (None where that baseline did not run); returns ``results``."""
    ms = {r["method"]: r["ms"] for r in results}
    fp8_kernel = next((r.get("kernel_ms") for r in results if r["method"] == "fa3-fp8"), None)
    bf16 = [(ms[m], m) for m in BF16_METHODS if m in ms]
    best_ms, best = min(bf16) if bf16 else (None, None)
    for r in results:
        r["speedup_vs_cudnn"] = ms["sdpa-cudnn"] / r["ms"] if "sdpa-cudnn" in ms else None
        r["best_bf16"] = best
        r["speedup_vs_best_bf16"] = best_ms / r["ms"] if best_ms else None
        r["speedup_vs_fa3_fp8"] = ms["fa3-fp8"] / r["ms"] if "fa3-fp8" in ms else None
        r["speedup_vs_fa3_fp8_kernel"] = fp8_kernel / r["ms"] if fp8_kernel else None
        r["speedup_vs_sage"] = ms[SAGE_METHOD] / r["ms"] if SAGE_METHOD in ms else None
    return results


def make_inputs(b, h, s_q, s_k, d, inputs="gaussian", seed=0):
    """bf16 (B, H, S, D) q, k, v on the GPU: ``gaussian`` draws N(0, 1) there; any other name is a family of
    :mod:`fsattn_diffusers.measure.structured_inputs` (drawn on the CPU, S_q == S_k)."""
    import torch

    from .structured_inputs import get_family

    if inputs == "gaussian":
        gen = torch.Generator(device="cuda").manual_seed(seed)
        return tuple(torch.randn((b, h, s, d), generator=gen, device="cuda", dtype=torch.bfloat16)
                     for s in (s_q, s_k, s_k))
    family = get_family(inputs)
    if s_q != s_k:
        raise ValueError(f"inputs {inputs!r} need S_q == S_k, got {s_q}:{s_k}; accepted: gaussian for S_q != S_k")
    return family(b, h, s_q, d, torch.bfloat16, "cuda", seed)


#: What ``rounds`` may be (:func:`interleaved_samples`, ``fsattn bench --rounds``).
ROUNDS_ACCEPTED = "1 or an even number (forward and reverse rounds in pairs)"


def rounds_accepted(rounds: int) -> bool:
    """Whether :func:`interleaved_samples` takes ``rounds``: 1, or an even number (see :func:`paired_median`)."""
    return rounds == 1 or (rounds > 1 and rounds % 2 == 0)


def interleaved_samples(timers: Dict[str, Dict[str, Callable[[], float]]],
                        rounds: int) -> Dict[str, Dict[str, List[float]]]:
    """Run every timer once per round, the methods in turn within a round and in reverse order every other round
    (A B C, C B A, A B C, ...), so that drift of the GPU's clock and power state over the run, and within a round,
    reaches every method alike instead of favouring the ones timed first or last.

    ``timers``: method -> {part: a zero-argument function returning milliseconds}, parts in the order to time them.
    ``rounds``: :data:`ROUNDS_ACCEPTED`.
    Returns method -> {part: ``rounds`` samples in round order}."""
    if not rounds_accepted(rounds):
        raise ValueError(f"rounds must be {ROUNDS_ACCEPTED}, got {rounds}")
    samples = {name: {part: [] for part in parts} for name, parts in timers.items()}
    names = list(timers)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            parts = timers[name]
            for part, timer in parts.items():
                samples[name][part].append(float(timer()))
    return samples


def paired_median(values: List[float]) -> float:
    """The time one method reports from its :func:`interleaved_samples`: the median, over the (forward, reverse)
    round pairs, of the pair's mean; one round's value as it is.

    A method's time depends on what ran just before it (likely the GPU's clock and power state carrying over;
    docs/design.md, "Run-to-run spread"), and its place in the round alternates between the two orders. Averaging
    within a pair gives every method each place once; a plain median of an odd number of rounds would keep the
    majority order's place.
    """
    if len(values) == 1:
        return float(values[0])
    if not rounds_accepted(len(values)):
        raise ValueError(f"paired_median needs {ROUNDS_ACCEPTED}, got {len(values)} rounds")
    return float(statistics.median((values[i] + values[i + 1]) / 2 for i in range(0, len(values), 2)))


def bench_shape(b, h, s_q, s_k, d, recipes, baselines, layout="bhsd", warmup=100.0, rep=500.0, seed=0,
                log=print, inputs="gaussian", rounds=1) -> List[Dict]:
    """Rows of results (dicts) for one shape and one input family (:func:`make_inputs`), SDPA's default scale; our
    rows also carry the kernel's ``rollback_rate`` on these inputs (a separate, untimed call).

    Every method is first called once (its accuracy on the sampled rows), then timed in ``rounds`` interleaved rounds
    (:func:`interleaved_samples`): ``ms``, ``prepass_ms`` and ``kernel_ms`` are :func:`paired_median` of the rounds'
    ``do_bench`` medians, the per-round values in ``rounds_ms`` (``{part: [...]}``) when ``rounds`` > 1."""
    import torch

    from .. import attention
    from ..backends import LAST_RAN, registered
    from ..quality.analysis import sample_rows
    from ..recipe import get_recipe
    from ..testing import error_and_cosine
    from . import KERNEL_BACKEND

    kernels = registered()[KERNEL_BACKEND]
    kernel_ops, plan_for = kernels.kernel("ops"), kernels.kernel("plan").plan_for
    attention_from_operands, prepass = kernel_ops.attention_from_operands, kernel_ops.prepass

    q, k, v = make_inputs(b, h, s_q, s_k, d, inputs, seed)
    scale = 1.0 / math.sqrt(d)
    flops = 4.0 * b * h * s_q * s_k * d
    rows = sample_rows(s_q, SAMPLE_ROWS, seed)
    ref = exact_rows(q, k, v, rows.cuda(), scale)
    methods = {}  # method -> (the whole call, {part: function}, row fields known before timing)

    def checked(name, fn, parts, extra=None):
        """Call ``fn`` once for its accuracy; keep the method for timing."""
        torch.cuda.synchronize()
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        err, cos = error_and_cosine(out[:, :, rows.cuda()], ref)
        del out
        methods[name] = (fn, parts, {"rel_err": err, "cos": cos, **(extra or provenance.baseline_record())})

    for name, got in baseline_callables(q, k, v, scale, baselines).items():
        if isinstance(got, str):
            log(f"  {name:<14} skipped: {got}")
            continue
        fn, parts, extra = got
        try:
            checked(BASELINE_METHODS[name], fn, parts, {**provenance.baseline_record(), **extra})
        except Exception as exc:  # noqa: BLE001 - report and continue with the rest
            log(f"  {name:<14} failed: {type(exc).__name__}: {exc}")
    qq, kk, vv = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)) if layout == "bshd" else (q, k, v)
    for rname in recipes:
        recipe = get_recipe(rname)
        lay_args = dict(layout="bhsd", backend=KERNEL_BACKEND)

        def full(recipe=recipe):
            return attention(qq, kk, vv, recipe, **lay_args)
        out = torch.empty_like(q)
        if recipe.qk_format == QKFormat.INT8:  # the INT8 Q/K kernel and its own pre-pass
            ops_int8 = kernels.kernel("ops_int8")
            key = ops_int8.settings_key(recipe)
            ops, launch = ops_int8.prepass_for(qq, kk, vv, scale, key)
            parts = {"prepass_ms": lambda key=key: ops_int8.prepass_for(qq, kk, vv, scale, key),
                     "kernel_ms": lambda ops=ops, out=out, a=launch:
                     ops_int8.attention_int8_from_operands(ops, out, s_q, s_k, **a)}
        else:
            plan = plan_for(recipe)
            ops = prepass(qq, kk, vv, plan, scale, None)
            parts = {"prepass_ms": lambda plan=plan: prepass(qq, kk, vv, plan, scale, None),
                     "kernel_ms": lambda ops=ops, out=out, plan=plan: attention_from_operands(ops, out, plan, s_q,
                                                                                             s_k, None, None, None)}
        # Peak extra memory of one call (output included), measured outside do_bench (its L2-flush
        # buffer and the previous call's output would count otherwise).
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        one = full()
        torch.cuda.synchronize()
        peak_extra = int(torch.cuda.max_memory_allocated() - base)
        del one
        _, stats = attention(qq, kk, vv, recipe, return_stats=True, **lay_args)
        checked(rname, full, parts, {"rollback_rate": stats["rollback_rate"], "peak_extra_bytes": peak_extra,
                                     "qkv_bf16_bytes": int(2 * b * h * (s_q + 2 * s_k) * d),
                                     **provenance.recipe_record(recipe, LAST_RAN.get(recipe.name, KERNEL_BACKEND))})
    samples = interleaved_samples(
        {name: {"ms": (lambda fn=fn: timed(fn, warmup, rep)),
                **{part: (lambda f=f: timed(f, warmup, rep)) for part, f in parts.items()}}
         for name, (fn, parts, _) in methods.items()}, rounds)
    results = []
    for name, (_, _, known) in methods.items():
        times = {part: paired_median(values) for part, values in samples[name].items()}
        row = {"shape": [b, h, s_q, s_k, d], "inputs": inputs, "method": name, "ms": times["ms"],
               "tflops": flops / times["ms"] * 1e-9, **known}
        kernel = ""
        if "kernel_ms" in times:
            row.update(prepass_ms=times["prepass_ms"], kernel_ms=times["kernel_ms"],
                       kernel_tflops=flops / times["kernel_ms"] * 1e-9)
            kernel = f", pre-pass {times['prepass_ms']:.3f} ms, kernel {times['kernel_ms']:.3f} ms"
        if rounds > 1:
            row["rounds_ms"] = samples[name]
        results.append(row)
        log(f"  {name:<14} {row['ms']:9.3f} ms {row['tflops']:8.1f} TFLOP/s  err {row['rel_err']:.4f} "
            f"cos {row['cos']:.5f}{kernel}")
    del methods
    return add_ratios(results)


def environment(baselines=()) -> Dict:
    """The file's header (:func:`~fsattn_diffusers.measure.provenance.header`: device, versions, date, commit,
    command) with the GPU's capability and cuDNN version; with ``sage`` among ``baselines``, ``sageattention``: which
    SageAttention runs (:func:`~fsattn_diffusers.integration.sage.sage_identity`), or ``{"missing": reason}``."""
    import torch

    from ..integration.sage import sage_identity, sage_missing

    env = provenance.header(" ".join(["fsattn"] + sys.argv[1:]) if sys.argv else "fsattn bench")
    if torch.cuda.is_available():
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["cudnn"] = torch.backends.cudnn.version()
    if "sage" in baselines:
        env["sageattention"] = sage_identity() or {"missing": sage_missing()}
    return env


def _ratio(x) -> str:
    return f"{x:.3f}x" if x else "-"


def _rounds_text(rounds: int) -> str:
    if rounds <= 1:
        return "one round (the methods timed one after another)"
    return (f"{rounds} interleaved rounds (every method once per round, in turn, the order reversed every other "
            f"round), reported as the median over the {rounds // 2} (forward, reverse) pairs of the pair's mean, so "
            "that every method is timed in each place of the round alike; per-round values in the JSON's `rounds_ms`")


def _sage_line(env: Dict) -> List[str]:
    """The header line naming the SageAttention of the ``sageattention`` rows (none when not asked for)."""
    sage = env.get("sageattention")
    if not sage:
        return []
    if "missing" in sage:
        return [f"- sage: not run ({sage['missing']})"]
    return [f"- sage (`{SAGE_METHOD}` rows, `sageattn` whole call, its quantization included): {sage['label']}"]


def markdown(env: Dict, results: List[Dict]) -> str:
    """The results as a markdown report: environment lines, then one table row per method and shape."""
    lines = [f"# fsattn bench — {env.get('device', '?')}", "",
             f"- date: {env['date']}", f"- commit: {env.get('commit')}", f"- command: `{env['command']}`",
             f"- torch {env['torch']} (CUDA {env['cuda']}, cuDNN {env.get('cudnn')}), triton {env['triton']}, "
             f"python {env['python']}", f"- kernel variant: {env.get('kernel_variant', 'triton')}",
             f"- timing: `do_bench` median per method and part, {_rounds_text(env.get('rounds', 1))}",
             "- inputs: bf16, BHSD (FA3: BSHD copies), non-causal, default scale; `gaussian` = random normal, other "
             "names = families of `fsattn_diffusers.measure.structured_inputs`; accuracy on "
             f"{SAMPLE_ROWS} sampled query rows per head against float64 softmax; rollbacks = share of (128-row "
             "query tile, key tile) pairs whose reference moved (our kernel, on these inputs)",
             "- ratios: time of the baseline / time of the row, measured in this run; best bf16 = the fastest of "
             "SDPA cuDNN, SDPA flash and FA3 bf16 at that shape; ours include the pre-pass, FA3 FP8 its "
             "Q/K/V quantization (both also timed apart); FA3 FP8 kernel = its kernel alone on inputs already in E4M3 "
             "(the FP8 baseline with a quantization that costs nothing, e.g. fused into the projection before it); "
             "vs SageAttention = SageAttention's whole `sageattn` call", *_sage_line(env), "",
             "| shape (B,H,Sq,Sk,D) | inputs | method | ms | TFLOP/s | vs cuDNN | vs best bf16 | vs FA3 FP8 "
             "| vs FA3 FP8 kernel | vs SageAttention | rel. err | cos | pre-pass ms | kernel ms | rollbacks |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        best = f" ({r['best_bf16']})" if r.get("speedup_vs_best_bf16") else ""
        rb = r.get("rollback_rate")
        sage = r.get("sageattention")
        method = r["method"] + (f" ({sage['kind']} {sage['version'] or ''})".replace(" )", ")") if sage else "")
        lines.append(f"| {','.join(map(str, r['shape']))} | {r.get('inputs', 'gaussian')} | {method} "
                     f"| {r['ms']:.3f} | {r['tflops']:.0f} "
                     f"| {_ratio(r.get('speedup_vs_cudnn'))} | {_ratio(r.get('speedup_vs_best_bf16'))}{best} "
                     f"| {_ratio(r.get('speedup_vs_fa3_fp8'))} | {_ratio(r.get('speedup_vs_fa3_fp8_kernel'))} "
                     f"| {_ratio(r.get('speedup_vs_sage'))} "
                     f"| {r['rel_err']:.4f} | {r['cos']:.5f} "
                     f"| {r.get('prepass_ms', float('nan')):.3f} | {r.get('kernel_ms', float('nan')):.3f} "
                     f"| {'-' if rb is None else f'{rb:.4f}'} |".replace("nan", "-"))
    return "\n".join(lines + provenance.recipes_markdown(results)) + "\n"
