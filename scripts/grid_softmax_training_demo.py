"""Train a tiny causal transformer with exact softmax and with grid-softmax variants; plot the losses.

Task: associative recall. A sequence holds ``pairs`` (key, value) pairs with distinct keys and random
values, then ``queries`` keys from those pairs, each followed by its value. The loss and accuracy count
only the answer tokens (the value after a queried key), which a model can get right only by attending
back to the matching pair. Every variant trains from the same initial weights on the same batches.

Usage (CPU, a few minutes)::

    python scripts/grid_softmax_training_demo.py \
        --out benchmarks/results/grid_softmax_training_cpu

writes ``<out>.json`` (curves, final numbers, command, date, machine, torch version) and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from fsattn_diffusers.measure.provenance import commit
from fsattn_diffusers.training import Calibration, EndsFeedback, GridSoftmaxConfig, Rounding, grid_ends, grid_softmax

VARIANTS = {
    "softmax": None,
    "K32 minmax lerp keep": GridSoftmaxConfig(32, Calibration.MINMAX, EndsFeedback.KEEP, Rounding.LERP),
    "K32 minmax lerp detach": GridSoftmaxConfig(32, Calibration.MINMAX, EndsFeedback.DETACH, Rounding.LERP),
    "K4 minmax hard_pre keep": GridSoftmaxConfig(4, Calibration.MINMAX, EndsFeedback.KEEP, Rounding.HARD_PRE),
    "K4 minmax hard_post keep": GridSoftmaxConfig(4, Calibration.MINMAX, EndsFeedback.KEEP, Rounding.HARD_POST),
    "K4 fixed6 hard_pre keep": GridSoftmaxConfig(4, Calibration.FIXED_WINDOW, EndsFeedback.KEEP, Rounding.HARD_PRE),
    "K4 fixed6 hard_post keep": GridSoftmaxConfig(4, Calibration.FIXED_WINDOW, EndsFeedback.KEEP, Rounding.HARD_POST),
    "K4 minmax hard_post detach": GridSoftmaxConfig(4, Calibration.MINMAX, EndsFeedback.DETACH, Rounding.HARD_POST),
}


def recall_batch(gen: torch.Generator, batch: int, n_keys: int, pairs: int, queries: int):
    """Token ids (batch, 2*(pairs+queries)) and the answer mask over next-token targets."""
    keys = torch.argsort(torch.rand(batch, n_keys, generator=gen), dim=1)[:, :pairs]
    vals = n_keys + torch.randint(0, n_keys, (batch, pairs), generator=gen)
    pick = torch.randint(0, pairs, (batch, queries), generator=gen)
    qk, qv = keys.gather(1, pick), vals.gather(1, pick)
    tokens = torch.cat([torch.stack([keys, vals], 2).flatten(1), torch.stack([qk, qv], 2).flatten(1)], 1)
    answer = torch.zeros_like(tokens, dtype=torch.bool)
    answer[:, 2 * pairs + 1::2] = True  # the value after each queried key
    return tokens, answer


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.grid: GridSoftmaxConfig | None = None
        self.score_range: list[float] = []  # mean (max - min) of valid scores per forward, when recording
        self.record = False

    def forward(self, x, causal):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        if self.record:
            lo, hi = grid_ends(scores.detach(), Calibration.MINMAX, mask=causal)
            self.score_range.append((hi - lo)[..., 1:, :].mean().item())  # rows with >= 2 valid keys
        if self.grid is None:
            p = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        else:
            p = grid_softmax(scores, self.grid, causal)
        x = x + self.proj((p @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.causal[:t, :t])
        return self.head(self.ln(x))


def loss_acc(model, tokens, answer):
    logits = model(tokens[:, :-1])
    m = answer[:, 1:]
    tgt = tokens[:, 1:][m]
    out = logits[m]
    return F.cross_entropy(out, tgt), (out.argmax(-1) == tgt).float().mean()


def train_one(name, grid, args, seed):
    n_keys = args.keys
    seq = 2 * (args.pairs + args.queries)
    torch.manual_seed(seed)
    model = TinyLM(2 * n_keys, seq, args.width, args.heads, args.layers)
    for blk in model.blocks:
        blk.grid = grid
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    gen = torch.Generator().manual_seed(1000 + seed)
    eval_tokens, eval_answer = recall_batch(torch.Generator().manual_seed(99), args.eval_batch, n_keys,
                                            args.pairs, args.queries)
    curve = {"step": [], "train_loss": [], "eval_loss": [], "eval_acc": [], "score_range": []}
    run_loss, t0 = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        tokens, answer = recall_batch(gen, args.batch, n_keys, args.pairs, args.queries)
        loss, _ = loss_acc(model, tokens, answer)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        run_loss.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            for blk in model.blocks:
                blk.record, blk.score_range = True, []
            with torch.no_grad():
                el, ea = loss_acc(model, eval_tokens, eval_answer)
            rng = sum(sum(b.score_range) for b in model.blocks) / sum(len(b.score_range) for b in model.blocks)
            for blk in model.blocks:
                blk.record = False
            model.train()
            curve["step"].append(step)
            curve["train_loss"].append(sum(run_loss) / len(run_loss))
            curve["eval_loss"].append(el.item())
            curve["eval_acc"].append(ea.item())
            curve["score_range"].append(rng)
            run_loss = []
    secs = time.perf_counter() - t0
    print(f"{name:28s} seed {seed}: eval loss {curve['eval_loss'][-1]:.4f} acc {curve['eval_acc'][-1]:.3f} "
          f"score range {curve['score_range'][-1]:.1f} nats ({secs:.0f} s)", flush=True)
    return {"variant": name, "seed": seed, "config": None if grid is None else grid.label(), "seconds": secs,
            "curve": curve}


def plot(runs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["variant"] for r in runs))
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    for i, name in enumerate(names):
        for j, r in enumerate(x for x in runs if x["variant"] == name):
            c = r["curve"]
            style = dict(color=cmap(i % 10), lw=1.5, alpha=0.85, ls=("-", "--", ":", "-.")[j % 4],
                         label=name if j == 0 else None)
            axes[0].plot(c["step"], c["eval_loss"], **style)
            axes[1].plot(c["step"], c["eval_acc"], **style)
            axes[2].plot(c["step"], c["score_range"], **style)
    axes[0].set(yscale="log", xlabel="training step", ylabel="eval loss on answer tokens (nats)")
    axes[1].set(xlabel="training step", ylabel="eval recall accuracy")
    axes[2].set(yscale="log", xlabel="training step", ylabel="mean row score range max-min (nats)")
    axes[0].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _title(meta):
    m, o, t = meta["model"], meta["optim"], meta["task"]
    return (f"Tiny transformer ({m['layers']} layers x {m['width']}, {m['heads']} heads), associative recall "
            f"({t['pairs']} pairs, {t['queries']} queries), {o['steps']} steps; seeds {meta['seeds']} = solid, dashed, "
            f"dotted; {meta['date_utc'][:10]}, torch {meta['torch']}, CPU")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output path without extension (.json and .png are written)")
    ap.add_argument("--replot", action="store_true", help="redraw <out>.png from an existing <out>.json; no training")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from: " + ", ".join(VARIANTS))
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (init and data)")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--eval-batch", type=int, default=1024)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--keys", type=int, default=16, help="distinct keys (and values)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        print(f"error: unknown variant(s) {bad}; accepted: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"error: --seeds {args.seeds!r} is not a comma-separated list of integers", file=sys.stderr)
        return 2
    if args.replot:
        try:
            with open(args.out + ".json") as fh:
                saved = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"error: cannot read {args.out}.json ({exc})", file=sys.stderr)
            return 2
        plot(saved["runs"], args.out + ".png", _title(saved["meta"]))
        print(f"wrote {args.out}.png")
        return 0
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    runs = [train_one(n, VARIANTS[n], args, s) for s in seeds for n in names]
    summary = {}
    for n in names:
        rs = [r for r in runs if r["variant"] == n]
        summary[n] = {k: [r["curve"][k][-1] for r in rs] for k in ("eval_loss", "eval_acc", "score_range")}
    meta = {
        "command": "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]) if argv is None else argv,
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": f"CPU ({os.cpu_count()} cores, {platform.machine()})", "commit": commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": args.threads},
        "torch": torch.__version__,
        "task": {"name": "associative recall", "keys": args.keys, "pairs": args.pairs, "queries": args.queries,
                 "seq_len": 2 * (args.pairs + args.queries), "loss": "cross-entropy on answer tokens"},
        "model": {"layers": args.layers, "width": args.width, "heads": args.heads, "mlp": "4x GELU, pre-LN"},
        "optim": {"name": "AdamW", "lr": args.lr, "weight_decay": 0.01, "warmup_steps": 100, "clip": 1.0,
                  "batch": args.batch, "steps": args.steps},
        "eval": {"batch": args.eval_batch, "every": args.eval_every, "data_seed": 99},
        "seeds": seeds,
        "total_seconds": time.perf_counter() - t0,
    }
    for r in runs:  # the result rows' record: these are training variants, not attention Recipes
        r.update(recipe=None, computed_numerics=f"training.grid_softmax variant {r['variant']!r} (no attention Recipe)")
    with open(args.out + ".json", "w") as fh:
        json.dump({"meta": meta, "summary_final": summary, "runs": runs}, fh, indent=1)
    plot(runs, args.out + ".png", _title(meta))
    print(f"wrote {args.out}.json and .png ({meta['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
