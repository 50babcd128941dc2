"""``fsattn accuracy``: the accuracy measurements of the recipes against exact attention.

Three modes, one per invocation:

* ``--table 4`` (the default): the paper's component ablation (Table 4), each pipeline component switched on in
  turn, on random normal inputs of shape (B, H, S, D) (``--shape``, default (1, 2, 4096, 128); the paper's is
  (1, 24, 32768, 128)) over ``--seeds`` seeds, on ``--device`` (:mod:`fsattn_diffusers.measure.accuracy_tables`).
  A note says where the setting differs from the paper's.
* ``--table 8``: the paper's proxy-width table (Table 8): the relative error of Schraudolph's exponential per
  proxy width (continuous, U32, U16 on FP16 and BF16, U8), beside the paper's values.
* ``--suite structured``: every structured input family (:mod:`fsattn_diffusers.measure.structured_inputs`; shape
  (B, H, S) with head dims ``--head-dims``, dtypes ``--dtypes``) through each fsattn preset on ``--backend``, beside
  FlashAttention-3 FP8 and SageAttention when they are installed; relative Frobenius error and cosine against
  float64 attention per cell, and the bar checks (each preset within its margin of FA3 FP8).
  ``--numerics`` overrides the recipes' numerics target (:class:`~fsattn_diffusers.recipe.Numerics`).

``--replay FILE`` instead reruns the attention calls that ``fsattn capture --save-worst`` saved.

Output
------
Tables on stdout. ``--json``: the rows with the run's metadata (command, date, versions, device, shape, seeds);
the suite's file also holds every recipe's resolved fields and its checks, and is rewritten after each case so an
interrupted run keeps what it measured. ``--markdown`` (suite): the same as a markdown report.

Raises ``UsageError`` (exit 2, one line) for malformed shapes or lists, suite-only flags without ``--suite``, and an
unusable device.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import torch

from ..cli import UsageError, check_output_path
from ..recipe import NUMERICS

NAME = "accuracy"
HELP = ("reproduce the paper's accuracy tables (Table 8: proxy widths, Table 4: component ablation) or run "
        "the structured-input suite (--suite structured)")


def add_arguments(p) -> None:
    p.add_argument("--table", type=int, choices=(4, 8), default=None, help="which paper table (default 4)")
    p.add_argument("--shape", default=None,
                   help="B,H,S,D for Table 4 (default 1,2,4096,128; paper: 1,24,32768,128); for the suite "
                        "B,H,S or B,H,S,D (default 1,2,2048; D then comes from --head-dims)")
    p.add_argument("--seeds", type=int, default=1,
                   help="input seeds averaged per cell (Table 4: the paper used 10; the structured suite: its error and "
                        "cosine columns and bar checks)")
    p.add_argument("--query-rows", type=int, default=None,
                   help="evaluate a fixed random subset of this many query rows (all keys); default all "
                        "(the suite on the CPU: 256)")
    p.add_argument("--device", default="cpu", help="torch device for Table 4 (cpu, cuda, ...)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the rows as JSON to this file")
    p.add_argument("--markdown", dest="markdown_path", default=None, help="suite: also write a markdown report")
    g = p.add_argument_group("structured-input suite (--suite structured)")
    g.add_argument("--suite", choices=("structured",), default=None,
                   help="run the structured-input suite instead of a paper table")
    g.add_argument("--families", default=None, help="comma-separated input families (default all; see --list-families)")
    g.add_argument("--list-families", action="store_true", help="print the input families and exit")
    g.add_argument("--recipes", default=None,
                   help="comma-separated fsattn presets (default: every preset whose name starts with mxfp)")
    g.add_argument("--dtypes", default="float16,bfloat16", help="input dtypes (default float16,bfloat16)")
    g.add_argument("--head-dims", default=None,
                   help="head dims (default 64,128, or the D of a four-number --shape)")
    g.add_argument("--backend", default="auto",
                   help="fsattn backend (default auto: the Triton kernels on a Hopper GPU, else the emulator)")
    g.add_argument("--numerics", choices=NUMERICS, default=None,
                   help="override the recipes' numerics (default: each recipe's own)")
    g.add_argument("--no-external", action="store_true", help="skip FlashAttention-3 and SageAttention columns")
    p.add_argument("--replay", metavar="FILE", default=None,
                   help="rerun the attention calls saved by `fsattn capture --save-worst` (safetensors)")


def _parse_shape(text: str):
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise UsageError(f"--shape must be four positive integers B,H,S,D, got {text!r}")
    return shape


def _int_list(text: str, flag: str):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def _name_list(text: str, flag: str, accepted):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in accepted]
    if not names or bad:
        raise UsageError(f"{flag}: unknown {', '.join(bad) or 'empty list'}; accepted: {', '.join(accepted)}")
    return names


def _recipe_list(text: str):
    """Preset names, optionally with changes (``mxfp8+smooth_q``, :func:`fsattn_diffusers.recipe.parse_recipe_name`)."""
    from ..recipe import get_recipe

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise UsageError(f"--recipes: empty list; accepted: presets (or e.g. mxfp8+smooth_q)")
    for name in names:
        try:
            get_recipe(name)
        except ValueError as exc:
            raise UsageError(f"--recipes: {exc}") from None
    return names


def _device(text: str):
    try:
        device = torch.device(text)
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise UsageError(f"--device {text!r} is not usable here ({str(exc).splitlines()[0]})") from None
    return device


def _versions(meta) -> None:
    from importlib import metadata

    for key, dist in (("triton", "triton"), ("fa3_fwd", "fa3-fwd")):
        try:
            meta[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            meta[key] = None
    from ..integration.sage import sage_identity, sage_missing

    # which SageAttention is imported, from the module itself (a PyPI 1.0.6 beside a source build misreports)
    meta["sageattention"] = sage_identity() or {"missing": sage_missing()}


def _run_suite(args, meta) -> int:
    from ..recipe import PRESETS
    from ..measure.structured_inputs import DESCRIPTIONS, FAMILIES
    from ..measure.structured_report import checks_text, markdown, text_table
    from ..measure.structured_suite import DTYPES, bar_checks, default_recipes, run_suite

    if args.list_families:
        for name in FAMILIES:
            print(f"{name:<22} {DESCRIPTIONS[name]}")
        return 0
    text = args.shape or "1,2,2048"
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise UsageError(f"--shape must be B,H,S or B,H,S,D (positive integers), got {text!r}")
    if args.head_dims is not None:
        head_dims = _int_list(args.head_dims, "--head-dims")
    else:
        head_dims = [shape[3]] if len(shape) == 4 else [64, 128]
    families = None if args.families is None else _name_list(args.families, "--families", list(FAMILIES))
    recipes = default_recipes() if args.recipes is None else _recipe_list(args.recipes)
    dtypes = _name_list(args.dtypes, "--dtypes", list(DTYPES))
    if args.seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
    if args.query_rows is not None and args.query_rows < 1:
        raise UsageError(f"--query-rows must be at least 1, got {args.query_rows}")
    device = _device(args.device)
    query_rows = args.query_rows if args.query_rows is not None or device.type != "cpu" else 256
    if device.type == "cuda":
        meta["device"] = torch.cuda.get_device_name(device)
    _versions(meta)
    meta.update(suite="structured", shape=list(shape[:3]), head_dims=head_dims, dtypes=dtypes, seeds=args.seeds,
                query_rows=query_rows, backend=args.backend, numerics=args.numerics, recipes=recipes)
    from tqdm import tqdm

    def write(result, final):
        payload = {"suite": "structured", "complete": final, "meta": meta, "result": result,
                   "checks": bar_checks(result["cases"], result["recipe_formats"])}
        if args.json_path:
            with open(args.json_path, "w") as fh:
                json.dump(payload, fh, indent=1, default=str)
        if args.markdown_path:
            with open(args.markdown_path, "w") as fh:
                fh.write(markdown(payload))
        return payload

    with tqdm(desc="structured suite", unit="cell", file=sys.stderr) as bar:  # files rewritten after every case
        result = run_suite(shape[:3], head_dims, dtypes, families, recipes, args.seeds, str(device), args.backend,
                           query_rows, args.numerics, external=not args.no_external,
                           progress=lambda *a: bar.update(1), on_case=lambda partial: write(partial, False),
                           on_total=lambda n: bar.reset(total=n))
    payload = write(result, True)
    print(text_table(result))
    print(checks_text(payload["checks"]))
    for note in result["notes"]:
        print(f"note: {note}")
    for path in (args.json_path, args.markdown_path):
        if path:
            print(f"wrote {os.path.abspath(path)}")
    return 0


def _fmt(v, digits):
    return "   -  " if v is None else f"{v:.{digits}f}"


def _print_table8(rows) -> None:
    print("Table 8: relative error of the Schraudolph proxy over one doubling (%), ours | paper")
    print(f"{'proxy':<11}{'M':>3}{'E':>3}  {'reach':>7}  {'min':>15}  {'max':>15}  {'RMS':>15}  {'added RMS':>15}")
    for r in rows:
        o, p = r["ours"], r["paper"]
        reach = "-" if r["reach_log2"] is None else f"2^{r['reach_log2']}"
        cells = [f"{_fmt(o[k], 3)} | {_fmt(p[k], 3)}" for k in ("min", "max", "rms", "added_rms")]
        print(f"{r['proxy']:<11}{r['M'] if r['M'] is not None else '-':>3}{r['E'] if r['E'] is not None else '-':>3}"
              f"  {reach:>7}  " + "  ".join(f"{c:>15}" for c in cells))


def _print_table4(rows, columns) -> None:
    print("Table 4: global relative error % / cosine vs BF16 conventional attention, ours | paper")
    print(f"{'components':<20}" + "".join(f"{c:>30}" for c in columns))
    for name in dict.fromkeys(r["row"] for r in rows):
        cells = {r["column"]: r for r in rows if r["row"] == name}
        line = f"{name:<20}"
        for c in columns:
            o, p = cells[c]["ours"], cells[c]["paper"]
            line += f"{o['err_pct']:>7.3f}/{o['cos']:.5f} | {p['err_pct']:>6.3f}/{p['cos']:.5f}"
        print(line)


def run(args) -> int:
    for flag, path in (("--json", args.json_path), ("--markdown", args.markdown_path)):
        if path is not None:
            check_output_path(path, flag, folder=False)
    if args.replay:
        from ..quality.replay import replay_command

        return replay_command(args.replay, device=args.device, json_path=args.json_path)
    from ..measure import provenance

    meta = {"command": "fsattn " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("fsattn") else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": provenance.commit(),
            "torch": torch.__version__, "python": platform.python_version()}
    if args.suite is not None and args.table is not None:
        raise UsageError("--suite and --table are exclusive; accepted: one of them")
    suite_only = {"--families": args.families, "--recipes": args.recipes, "--head-dims": args.head_dims,
                  "--numerics": args.numerics, "--markdown": args.markdown_path}
    used = [flag for flag, value in suite_only.items() if value is not None]
    if args.suite is None and not args.list_families and used:
        raise UsageError(f"{', '.join(used)} need --suite structured")
    if args.suite == "structured" or args.list_families:
        if meta["command"] is None:
            meta["command"] = "python -m fsattn_diffusers " + " ".join(sys.argv[1:])
        return _run_suite(args, meta)
    if args.table == 8:
        from ..measure.accuracy_tables import table8

        rows = table8()
        _print_table8(rows)
        payload = {"table": 8, "meta": meta, "rows": rows}
    else:
        from ..measure.accuracy_tables import TABLE4_COLUMNS, table4, table4_setting_note

        shape = _parse_shape(args.shape or "1,2,4096,128")
        if args.seeds < 1:
            raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
        try:
            device = torch.device(args.device)
            torch.empty(1, device=device)
        except (RuntimeError, AssertionError) as exc:
            raise UsageError(f"--device {args.device!r} is not usable here ({str(exc).splitlines()[0]})") from None
        if device.type == "cuda":
            meta["device"] = torch.cuda.get_device_name(device)
        meta.update(shape=list(shape), seeds=args.seeds, query_rows=args.query_rows)
        from tqdm import tqdm

        total = args.seeds * 6 * len(TABLE4_COLUMNS)
        with tqdm(total=total, desc="table 4", unit="cell", file=sys.stderr) as bar:
            rows = table4(shape, args.seeds, str(device), args.query_rows, progress=lambda *a: bar.update(1))
        _print_table4(rows, TABLE4_COLUMNS)
        note = table4_setting_note(shape, args.seeds, args.query_rows)
        if note:
            print(note)
        meta["differs_from_paper"] = note
        payload = {"table": 4, "meta": meta, "rows": rows}
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(payload, fh, indent=1)
        print(f"wrote {os.path.abspath(args.json_path)}")
    return 0
