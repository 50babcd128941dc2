"""``fsattn accuracy``: reproduce paper Table 8 (proxy widths) or Table 4 (component ablation)."""

from __future__ import annotations

import json
import platform
import sys
import time

import torch

from ..cli import UsageError

NAME = "accuracy"
HELP = "reproduce the paper's accuracy tables (Table 8: proxy widths, Table 4: component ablation)"


def add_arguments(p) -> None:
    p.add_argument("--table", type=int, choices=(4, 8), default=4, help="which paper table (default 4)")
    p.add_argument("--shape", default="1,2,4096,128", help="B,H,S,D for Table 4 (paper: 1,24,32768,128)")
    p.add_argument("--seeds", type=int, default=1, help="input seeds averaged for Table 4 (paper: 10)")
    p.add_argument("--query-rows", type=int, default=None,
                   help="evaluate a fixed random subset of this many query rows (all keys); default all")
    p.add_argument("--device", default="cpu", help="torch device for Table 4 (cpu, cuda, ...)")
    p.add_argument("--json", dest="json_path", default=None, help="also write the rows as JSON to this file")
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
    if args.replay:
        from ..quality.replay import replay_command

        return replay_command(args.replay, device=args.device, json_path=args.json_path)
    meta = {"command": "fsattn " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("fsattn") else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "python": platform.python_version()}
    if args.table == 8:
        from ..accuracy import table8

        rows = table8()
        _print_table8(rows)
        payload = {"table": 8, "meta": meta, "rows": rows}
    else:
        from ..accuracy import TABLE4_COLUMNS, table4

        shape = _parse_shape(args.shape)
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
        payload = {"table": 4, "meta": meta, "rows": rows}
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(payload, fh, indent=1)
        print(f"wrote {args.json_path}")
    return 0
