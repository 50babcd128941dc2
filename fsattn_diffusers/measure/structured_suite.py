"""The structured-input accuracy suite: every input family against exact attention.

For each case — an input family of :mod:`fsattn_diffusers.measure.structured_inputs` at one dtype and head
dim — the suite computes exact attention (float64, :func:`fsattn_diffusers.testing.exact_attention`)
and, against it, the global relative error and the cosine of

* every fsattn recipe given (``fsattn_diffusers.attention`` with the chosen backend),
* ``conventional-<recipe>``: the conventional softmax on the same quantized operands as each recipe
  (paper Table 4's "conventional" row applied to the recipe, :func:`conventional_recipe`; for a
  ``-paper`` preset this is exactly Table 4's cell), computed by the emulator,
* when importable on a CUDA device: FlashAttention-3 (``fa3_fwd_interface.flash_attn_func``) in BF16
  (``fa3-bf16``; fp16 inputs are rounded to BF16 first, since the ``fa3-fwd`` build has no FP16 kernels)
  and in FP8 E4M3 with per-(batch, head) scales ``amax / 448`` and the matching descales (``fa3-fp8``),
  and SageAttention's ``sageattn`` (``sage``: SageAttention 2 where its Hopper build is importable, else the
  installed one, e.g. PyPI's 1.0.6; the result's ``sageattention`` says which,
  :func:`fsattn_diffusers.integration.sage.sage_identity`).

Every column also records how many output elements are NaN/inf where exact attention is finite, and
whether the call left its inputs unchanged (compared with a copy taken before the call).
:func:`bar_checks` turns the table into pass/fail checks per case.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .accuracy_tables import TABLE4_ROWS
from ..recipe import PRESETS, Recipe, get_recipe
from .structured_inputs import FAMILIES, get_family
from ..testing import cosine, exact_attention, nonfinite_where_finite, relative_error

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
FP8_MAX = 448.0
#: Bar tolerances: fsattn error <= FA3-FP8 error + FA3_MARGIN, and <= GAUSS_RATIO x its Gaussian error
#: where FA3-FP8 stays within GAUSS_RATIO x its own Gaussian error; MXFP6 gets EXTRA_MXFP6 on both.
FA3_MARGIN = 0.005
GAUSS_RATIO = 1.5
EXTRA_MXFP6 = 0.01
FA3_FP8 = "fa3-fp8"


def default_recipes() -> List[str]:
    """Every preset of :data:`fsattn_diffusers.recipe.PRESETS` whose name starts with ``mxfp``."""
    return [name for name in PRESETS if name.startswith("mxfp")]


# --------------------------------------------------------------------------------------------------
# Other attention implementations (columns present only where importable)

def _fa3_module():
    from fa3_fwd_interface import flash_attn_func  # noqa: F401

    return flash_attn_func


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _fp8_per_head(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """BSHD ``x`` -> (E4M3 tensor, descale (B, H) float32) with scale amax/448 per (batch, head)."""
    amax = x.float().abs().amax(dim=(1, 3)).clamp_min(1e-12)  # (B, H)
    descale = (amax / FP8_MAX).float()
    x8 = (x.float() / descale[:, None, :, None]).to(torch.float8_e4m3fn)
    return x8, descale.contiguous()


def external_columns(device: torch.device) -> Tuple[Dict[str, Callable], List[str]]:
    """Columns of other implementations usable on ``device``: ``{name: fn(q, k, v, scale) -> out}``.

    ``q, k, v`` are (B, H, S, D); ``out`` is (B, H, S, D). Also returns one note per absent column.
    """
    cols, notes = {}, []
    if device.type != "cuda":
        return cols, ["fa3-bf16, fa3-fp8, sage: skipped (need a CUDA device)"]
    try:
        fa3 = _fa3_module()
    except Exception as exc:  # noqa: BLE001 - any import failure means "absent"
        notes.append(f"fa3-bf16, fa3-fp8: skipped (fa3_fwd_interface not importable: {str(exc).splitlines()[0]})")
    else:
        def fa3_bf16(q, k, v, scale):
            q2, k2, v2 = (t.transpose(1, 2).to(torch.bfloat16).contiguous() for t in (q, k, v))
            return _first(fa3(q2, k2, v2, softmax_scale=scale, causal=False)).transpose(1, 2)

        def fa3_fp8(q, k, v, scale):
            (q8, qd), (k8, kd), (v8, vd) = (_fp8_per_head(t.transpose(1, 2).contiguous()) for t in (q, k, v))
            out = fa3(q8, k8, v8, softmax_scale=scale, causal=False, q_descale=qd, k_descale=kd, v_descale=vd)
            return _first(out).transpose(1, 2)
        cols["fa3-bf16"], cols[FA3_FP8] = fa3_bf16, fa3_fp8
    from ..integration.sage import sage_call, sage_missing

    why = sage_missing()
    if why is not None:
        notes.append(f"sage: skipped ({why})")
    else:
        cols["sage"] = sage_call
    return cols, notes


# --------------------------------------------------------------------------------------------------
# The suite

#: Recipe fields that make one query row's output depend on the other rows (Q statistics over tokens).
ROW_COUPLING_FIELDS = ("smooth_q",)


def _rows_per_row_exact(recipe: Recipe, backend: str, device: torch.device) -> bool:
    """True when the recipe's output rows do not depend on other query rows (so q may be subset):
    the emulator in ``mi355x`` numerics (the Hopper mode shares exponents across a query tile), no
    statistic over the queries (:data:`ROW_COUPLING_FIELDS`) and the natural key order (the diagonal one visits a
    row's key tiles from its query tile's position)."""
    on_emulator = backend == "emulator" or (backend == "auto" and device.type == "cpu")
    coupled = any(getattr(recipe, f, False) for f in ROW_COUPLING_FIELDS)
    return on_emulator and recipe.numerics == "mi355x" and not coupled and recipe.key_order == "natural"


def conventional_recipe(recipe: Recipe) -> Recipe:
    """The conventional softmax on ``recipe``'s quantized operands: Table 4's "conventional" row
    (exact exponential, running maximum, row sum of the unquantized P) applied to the recipe, in the
    emulator's ``mi355x`` numerics (the Hopper mode covers the kernel's pipeline only), keys in the natural order
    (a running maximum has no first tile to choose nor a frozen reference to raise; the emulator's per-query-tile
    ``diagonal`` path would only make the column slower, ~30x on the H200 at S = 8192)."""
    return recipe.replace(name=f"conventional-{recipe.name}", numerics="mi355x", key_order="natural",
                          frozen_max_offset_log2=0.0,
                          **TABLE4_ROWS["conventional"])


def _measure(fn, q, k, v, rows, ref, subset_q: bool) -> Dict:
    """Run ``fn(q, k, v) -> (B, H, S_q', D)`` and compare rows ``rows`` with ``ref``."""
    copies = [t.clone() for t in (q, k, v)]
    sync = torch.cuda.synchronize if q.device.type == "cuda" else (lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sync()
            t0 = time.perf_counter()
            out = fn(q[:, :, rows] if (subset_q and rows is not None) else q, k, v)
            sync()
            seconds = time.perf_counter() - t0
        except (ValueError, RuntimeError, NotImplementedError) as exc:
            return {"err": None, "cos": None, "nonfinite": None, "inputs_unchanged": None,
                    "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    notes = sorted({str(w.message).splitlines()[0] for w in caught})
    if rows is not None and not subset_q:
        out = out[:, :, rows]
    unchanged = all(torch.equal(a, b) for a, b in zip(copies, (q, k, v)))
    cell = {"err": relative_error(out, ref), "cos": cosine(out, ref), "seconds": seconds,
            "nonfinite": nonfinite_where_finite(out, ref), "inputs_unchanged": unchanged}
    if notes:
        cell["warnings"] = notes
    return cell


def run_suite(shape: Sequence[int] = (1, 2, 2048), head_dims: Sequence[int] = (64, 128),
              dtypes: Sequence[str] = ("float16", "bfloat16"), families: Optional[Sequence[str]] = None,
              recipes: Optional[Sequence] = None, seeds: int = 1, device: str = "cpu", backend: str = "auto",
              query_rows: Optional[int] = None, numerics: Optional[str] = None, conventional: bool = True,
              external: bool = True, exact_dtype: torch.dtype = torch.float64, progress=None,
              on_case=None, on_total=None) -> Dict:
    """Measure every (family, dtype, head dim) case; errors and cosines are averaged over seeds.

    Parameters
    ----------
    shape : (B, H, S); S_q = S_k = S.
    head_dims, dtypes : the D values and input dtypes (``"float16"``, ``"bfloat16"``) of the cases.
    families : family names (default: all of :data:`~fsattn_diffusers.measure.structured_inputs.FAMILIES`);
        ``gaussian`` is always included (the bar checks compare against it).
    recipes : preset names or Recipes (default :func:`default_recipes`).
    seeds : input seeds 0 .. seeds-1.
    backend : fsattn backend (``auto``: the Triton kernels on a Hopper GPU, else the emulator).
    query_rows : evaluate a fixed random subset of this many query rows (all keys); ``None``: all.
        Recipes computed by the emulator in ``mi355x`` numerics, whose rows are independent, then run on
        those rows only; the others run on all rows and are compared on the subset.
    numerics : override ``Recipe.numerics`` (a value of :class:`~fsattn_diffusers.recipe.Numerics`) of the fsattn recipes.
    conventional, external : include the conventional-softmax and the other-implementation columns.
    progress : optional callable ``progress(case_label, column)`` after every column.
    on_case : optional callable taking the result so far (same form as the return value) after every case.
    on_total : optional callable taking the number of ``progress`` calls to come, once, before the first.

    Returns
    -------
    dict with ``cases`` (list of {family, dtype, head_dim, columns: {name: {err, cos, nonfinite,
    inputs_unchanged, ...}}}), ``columns`` (names in order), ``recipes`` (every field of each fsattn column's
    recipe), ``computed_numerics`` ({column: what its backend computed, ``"baseline"`` for FA3/SageAttention}),
    ``recipe_formats`` ({recipe column: MX format}), ``sageattention`` (which SageAttention the ``sage`` column ran,
    :func:`~fsattn_diffusers.integration.sage.sage_identity`; None without that column), ``notes`` (absent
    columns, fallbacks), ``exact`` (how the reference was computed) and ``seconds``.
    """
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be (B, H, S) of positive ints, got {tuple(shape)}")
    b, h, s = (int(x) for x in shape)
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    for dt in dtypes:
        if dt not in DTYPES:
            raise ValueError(f"unknown dtype {dt!r}; accepted: {', '.join(DTYPES)}")
    families = list(FAMILIES) if families is None else list(dict.fromkeys(families))
    for name in families:
        get_family(name)
    if "gaussian" not in families:
        families.insert(0, "gaussian")
    recipe_objs = [get_recipe(r) for r in (default_recipes() if recipes is None else recipes)]
    if numerics is not None:
        recipe_objs = [r.replace(numerics=numerics) for r in recipe_objs]
    if query_rows is not None and query_rows < 1:
        raise ValueError(f"query_rows must be at least 1, got {query_rows}")
    dev = torch.device(device)
    import fsattn_diffusers as fsa

    columns: Dict[str, Tuple[Callable, bool]] = {}
    formats: Dict[str, str] = {}
    ours: Dict[str, Recipe] = {r.name: r for r in recipe_objs}  # the fsattn columns' recipes
    for r in recipe_objs:
        columns[r.name] = ((lambda q, k, v, sc, r=r: fsa.attention(q, k, v, r, layout="bhsd", scale=sc,
                                                                   backend=backend)),
                           _rows_per_row_exact(r, backend, dev))
        formats[r.name] = r.qk_format
    notes: List[str] = []
    if conventional:
        seen = []
        for r in recipe_objs:
            conv = conventional_recipe(r)
            if not r.is_quantized or any(conv == c.replace(name=conv.name) for c in seen):
                continue  # the same operands as an earlier column
            seen.append(conv)
            ours[conv.name] = conv
            columns[conv.name] = ((lambda q, k, v, sc, c=conv: fsa.attention(
                q, k, v, c, layout="bhsd", scale=sc, backend="emulator")),
                _rows_per_row_exact(conv, "emulator", dev))
    if external:
        ext, ext_notes = external_columns(dev)
        notes += ext_notes
        columns.update({name: (fn, False) for name, fn in ext.items()})
    sage = None
    if "sage" in columns:
        from ..integration.sage import sage_identity

        sage = sage_identity()
    t_start = time.perf_counter()
    exact = (f"{str(exact_dtype).replace('torch.', '')} softmax attention on the rounded inputs, "
             f"{'all' if query_rows is None or query_rows >= s else query_rows} query rows, all keys")

    def assemble(cases):
        all_notes = list(notes)
        for case in cases:
            for name, cell in case["columns"].items():
                for w in cell.get("warnings", ()):
                    if f"{name}: {w}" not in all_notes:
                        all_notes.append(f"{name}: {w}")
        return {"cases": list(cases), "columns": list(columns), "recipe_formats": formats, "notes": all_notes,
                "sageattention": sage,
                "exact": exact, "seconds": time.perf_counter() - t_start,
                "recipes": {name: dataclasses.asdict(r) for name, r in ours.items()},
                "computed_numerics": {name: _computed(ours.get(name)) for name in columns}}

    cases: List[Dict] = []
    if on_total is not None:
        on_total(len(dtypes) * len(head_dims) * len(families) * seeds * len(columns))
    for dt in dtypes:
        for d in head_dims:
            for fam in families:
                label = f"{fam} {dt} D={d}"
                acc: Dict[str, List[Dict]] = {name: [] for name in columns}
                for seed in range(seeds):
                    q, k, v = FAMILIES[fam](b, h, s, int(d), DTYPES[dt], dev, seed)
                    rows = None
                    if query_rows is not None and query_rows < s:
                        gen = torch.Generator().manual_seed(10_000 + seed)
                        rows = torch.randperm(s, generator=gen)[:query_rows].sort().values.to(dev)
                    scale = 1.0 / math.sqrt(d)
                    ref = exact_attention(q if rows is None else q[:, :, rows], k, v, scale=scale,
                                          dtype=exact_dtype)[0]
                    for name, (fn, subset_q) in columns.items():
                        cell = _measure(lambda a, bb, c, fn=fn: fn(a, bb, c, scale), q, k, v, rows, ref, subset_q)
                        acc[name].append(cell)
                        if progress is not None:
                            progress(label, name)
                    del q, k, v, ref
                cases.append({"family": fam, "dtype": dt, "head_dim": int(d),
                              "columns": {name: _average(cells) for name, cells in acc.items()}})
                if on_case is not None:
                    on_case(assemble(cases))
    return assemble(cases)


def _computed(recipe: Optional[Recipe]) -> Optional[str]:
    """What the backend that ran ``recipe``'s column computes (:data:`provenance.BASELINE` for the external
    columns; None before the column ran)."""
    from ..backends import LAST_RAN, computed_numerics
    from .provenance import BASELINE

    if recipe is None:
        return BASELINE
    ran = LAST_RAN.get(recipe.name)
    return computed_numerics(ran, recipe) if ran else None


def _average(cells: List[Dict]) -> Dict:
    """Mean err/cos over seeds; worst case of the flags; the first error message, if any."""
    errs = [c for c in cells if c.get("err") is not None]
    if not errs:
        return {"err": None, "cos": None, "nonfinite": None, "inputs_unchanged": None,
                "error": next((c.get("error") for c in cells if c.get("error")), None)}
    out = {"err": sum(c["err"] for c in errs) / len(errs), "cos": sum(c["cos"] for c in errs) / len(errs),
           "nonfinite": sum(c["nonfinite"] for c in errs), "seconds": sum(c["seconds"] for c in errs),
           "inputs_unchanged": all(c["inputs_unchanged"] for c in errs)}
    w = sorted({x for c in cells for x in c.get("warnings", ())})
    if w:
        out["warnings"] = w
    return out


# --------------------------------------------------------------------------------------------------
# Bar checks

def _verdict(ok: Optional[bool]) -> str:
    return "n/a" if ok is None else ("pass" if ok else "fail")


def bar_checks(cases: List[Dict], recipe_formats: Dict[str, str], fa3_column: str = FA3_FP8) -> List[Dict]:
    """Pass/fail per (case, fsattn recipe).

    Rules (errors as fractions; G = the ``gaussian`` case of the same dtype and head dim):

    * ``vs_fa3``: err <= err(FA3-FP8) + 0.5 pp (MXFP8 recipes), + 1.5 pp (MXFP6: 1 pp more).
    * ``vs_gaussian``: where err_FA3(case) <= 1.5 err_FA3(G): err <= 1.5 err(G), plus 1 pp for MXFP6;
      ``n/a`` where FA3-FP8 itself degrades by more than that.
    * Both are ``n/a`` without an FA3-FP8 value, and for other formats (MXFP4 is reported only).
    * ``finite``: no NaN/inf where exact attention is finite; ``inputs``: q, k, v unchanged by the call;
      ``ran``: the call returned (``fail`` when it raised; the other checks are then ``n/a``).

    Returns
    -------
    list of dict: family, dtype, head_dim, recipe, format, err, fa3_err, gauss_err, vs_fa3,
    vs_gaussian, finite, inputs, ran (each ``pass``/``fail``/``n/a``), and ``limit_fa3``/``limit_gauss``.
    """
    gauss = {(c["dtype"], c["head_dim"]): c for c in cases if c["family"] == "gaussian"}
    rows = []
    for case in cases:
        g = gauss.get((case["dtype"], case["head_dim"]))
        fa3 = case["columns"].get(fa3_column, {}).get("err")
        fa3_g = None if g is None else g["columns"].get(fa3_column, {}).get("err")
        for name, fmt in recipe_formats.items():
            cell = case["columns"].get(name, {})
            err = cell.get("err")
            own_g = None if g is None else g["columns"].get(name, {}).get("err")
            extra = {"mxfp8": 0.0, "mxfp6": EXTRA_MXFP6}.get(fmt)
            vs_fa3 = vs_g = None
            lim_fa3 = lim_g = None
            if extra is not None and err is not None and fa3 is not None:
                lim_fa3 = fa3 + FA3_MARGIN + extra
                vs_fa3 = err <= lim_fa3
                if fa3_g is not None and own_g is not None and fa3 <= GAUSS_RATIO * fa3_g:
                    lim_g = GAUSS_RATIO * own_g + extra
                    vs_g = err <= lim_g
            finite = None if cell.get("nonfinite") is None else cell["nonfinite"] == 0
            rows.append({"family": case["family"], "dtype": case["dtype"], "head_dim": case["head_dim"],
                         "recipe": name, "format": fmt, "err": err, "fa3_err": fa3, "gauss_err": own_g,
                         "limit_fa3": lim_fa3, "limit_gauss": lim_g, "vs_fa3": _verdict(vs_fa3),
                         "vs_gaussian": _verdict(vs_g), "finite": _verdict(finite),
                         "inputs": _verdict(cell.get("inputs_unchanged")), "ran": _verdict(err is not None)})
    return rows


def summarize_checks(checks: List[Dict]) -> Dict[str, Dict[str, int]]:
    """Counts of pass / fail / n/a per recipe and check."""
    out: Dict[str, Dict[str, int]] = {}
    for row in checks:
        for key in ("vs_fa3", "vs_gaussian", "finite", "inputs", "ran"):
            d = out.setdefault(row["recipe"], {})
            tag = f"{key}:{row[key]}"
            d[tag] = d.get(tag, 0) + 1
    return out
