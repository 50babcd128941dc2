"""Reports of the sequence-parallel scaling runs (:mod:`.cp_scaling`, :mod:`.xdit_scaling`): the summary of the
measured runs, the markdown table and the JSON/markdown recorder written after each measurement."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Dict, List, Optional

import torch

from . import e2e
from .parallel_check import RELATIVE_TOLERANCE
from .provenance import commit, recipes_markdown

#: Timestep of the one transformer call whose output is compared.
MATCH_TIMESTEP = 500.0
#: bf16 (stock attention) N GPUs vs 1 GPU: relative L2 error bound.
BF16_TOLERANCE = 1e-2
#: Absolute floor of the quantized rule (together with the measured stock-attention sharding error).
ABSOLUTE_FLOOR = 1e-3

def run_meta(opts: dict, spec, world: int, cuda: bool) -> dict:
    """The run's ``meta``: the command's ``opts["meta"]`` plus the devices and the model spec (weights and inputs
    were checked identical on every rank before this is written)."""
    return dict(opts["meta"], devices=[torch.cuda.get_device_name(i) for i in range(world)] if cuda
                else ["cpu"] * world, weights_identical=True,
                spec={"name": spec.name, "latent": list(spec.latent), "tokens": e2e.image_tokens(spec),
                      "text_tokens": spec.text_tokens, "calls_per_step": spec.calls_per_step,
                      "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.config.items()}})


def summarize(runs: List[dict], world: int, projections: Optional[Dict[str, List[str]]] = None
              ) -> Dict[str, Dict[str, dict]]:
    """Per setting (``1gpu``, then each mode): e2e's table (step, 20-step projection, speedup over bf16 of the
    same setting, ``"<name> (projected)"`` for each of ``projections``, default the paper's hybrid) plus ``scaling``
    (1-GPU step / N-GPU step) and the match row; a run recorded as ``unsupported`` keeps its reason and no numbers."""
    by: Dict[str, Dict[str, dict]] = {}
    for r in runs:
        by.setdefault(r["setting"], {})[r["policy"]] = r
    out = {}
    for setting, res in by.items():
        timed = {p: r for p, r in res.items() if not r.get("unsupported")}
        if "bf16" in timed:
            table = e2e.summarize(timed, projections=projections)
        else:  # partial run: no baseline yet
            table = {p: {"step_s": r["step_median_s"], "projected_s": r["step_median_s"] * e2e.PAPER_STEPS,
                         "speedup": None, "attention_share": r["attention_share"],
                         "rollback_rate": r["rollback_rate"]} for p, r in timed.items()}
        for p, r in res.items():
            if r.get("unsupported"):
                table[p] = {"step_s": None, "projected_s": None, "speedup": None, "attention_share": None,
                            "rollback_rate": None, "unsupported": r["unsupported"]}
        for p, row in table.items():
            row["gpus"] = 1 if setting == "1gpu" else world
            if p in res and res[p].get("match") is not None:
                row["match"] = res[p]["match"]
        out[setting] = table
    single = out.get("1gpu", {})
    for setting, table in out.items():
        for p, row in table.items():
            ok = setting != "1gpu" and p in single and single[p]["step_s"] and row["step_s"]
            row["scaling"] = single[p]["step_s"] / row["step_s"] if ok else None
    return out


def _fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def report_head(doc: dict, title: str, versions: str, model: str, notes: List[str], match_scope: str = "") -> List[str]:
    """The lines of a scaling report above its table.

    Parameters
    ----------
    doc : dict
        The run's document (its ``meta`` and ``status``).
    title : str
        What ran, after "... on N GPUs: ".
    versions : str
        Versions named after diffusers' (``"xfuser 0.4, "``), each ending in ", ".
    model : str
        The model bullet after "Model: ", built around :func:`model_facts`.
    notes : list of str
        The bullets between the model and the projections (setup, :func:`timing_note`, what each policy runs, what
        the attention share counts).
    match_scope : str
        Said of the compared outputs before "relative L2" (``"both under xDiT; "``).
    """
    m = doc["meta"]
    return [f"# Wan2.2-A14B-size transformer on {m['world']} GPUs: {title}", "",
            f"- Devices: {', '.join(m['devices'])}; torch {m['torch']}, triton {m['triton']}, "
            f"diffusers {m['diffusers']}, {versions}python {m['python']}; {m['date']}; commit {m['commit']}.",
            f"- Command: `{m['command']}`" + (f" (wrapper: `{m['wrapper']}`)" if m.get("wrapper") else "") + ".",
            f"- Model: {model}", *notes, *projection_lines(m),
            f"- Match (one transformer call, N GPUs vs 1 GPU, {match_scope}relative L2 / cosine over the whole "
            f"output): bf16 passes at rel. error <= {BF16_TOLERANCE:g}; a quantized policy P passes when err(P, N "
            f"GPUs vs bf16 1 GPU) <= {1 + RELATIVE_TOLERANCE:g} x err(P, 1 GPU vs bf16 1 GPU) + "
            f"max({ABSOLUTE_FLOOR:g}, err(bf16, N GPUs vs 1 GPU) of the same mode).",
            f"- Status: {doc['status']}.", ""]


def model_facts(meta: dict) -> str:
    """The model's size, weights and inputs, ending in "a step = N" (the forwards of one denoising step)."""
    spec = meta["spec"]
    cfg = spec["config"]
    return (f"{spec['name']} config, {cfg['num_layers']} layers, {cfg['num_attention_heads']} heads x "
            f"{cfg['attention_head_dim']}, BF16, random N(0, 0.02) weights (same seed on every rank, checksum "
            f"verified: {meta.get('weights_identical')}); latent {tuple(spec['latent'])} -> {spec['tokens']} "
            f"self-attention tokens, {spec['text_tokens']} text tokens; a step = {spec['calls_per_step']}")


def timing_note(meta: dict) -> str:
    """The bullet saying what is timed per (setting, policy)."""
    return (f"- Per (setting, policy): {meta['warmup']} untimed forward(s) (the first is the compared one-call "
            f"output, t = {MATCH_TIMESTEP:g}), then {meta['steps']} timed step(s); step = median.")


def to_markdown(doc: dict) -> str:
    m = doc["meta"]
    notes = [timing_note(m) + " 1-GPU runs: policies split over the ranks, each on its own GPU without "
             "communication.",
             "- bf16 = stock diffusers attention on cuDNN SDPA (N GPUs: `_native_cudnn` backend); sage = stock "
             "attention on diffusers' `sage` backend (`set_attention_backend`, every attention module, cross-attention "
             "included); others = "
             f"`WanFSAttnProcessor` (backend `{m['backend']}`) on self-attention; cross-attention stays bf16.",
             "- Attention share: 1 GPU as `fsattn e2e` (CUDA events around each attention kernel call); N GPUs: "
             "around diffusers' ring / Ulysses template, i.e. self-attention including its communication."]
    head = report_head(doc, "diffusers context parallelism (Ulysses / ring), fsattn policies", "",
                       f"{model_facts(m)} forwards (CFG).", notes)
    return "\n".join(head + table_lines(doc) + recipes_markdown(doc["runs"]))


def projections_of(meta: dict) -> Dict[str, List[str]]:
    """The step-scheduled policies of a run (name -> recipe per step); a run that predates the record: the paper's
    hybrid (``2 * HYBRID_ENDS`` mxfp6 + the rest mxfp4 of ``PAPER_STEPS``), projected when both were measured."""
    if meta.get("projections") is not None:
        return meta["projections"]
    n6 = 2 * e2e.HYBRID_ENDS
    return {"hybrid": ["mxfp6"] * n6 + ["mxfp4"] * (e2e.PAPER_STEPS - n6)}


def projection_lines(meta: dict) -> List[str]:
    """One markdown bullet per projected policy of the run."""
    return [f"- {name} (projected) = projection, not a timed policy: "
            f"{' + '.join(f'{plan.count(p)} {p}' for p in dict.fromkeys(plan))} steps of the measured step times of "
            "the same setting." for name, plan in projections_of(meta).items()]


def table_lines(doc: dict) -> List[str]:
    """The results table of :func:`to_markdown` (one row per setting and policy), ending in an empty line."""
    lines = ["| GPUs | mode | policy | step (s) | 20 steps (s) | speedup vs bf16 (same setting) | scaling 1->N GPU "
             "| attention share | rel. err vs 1 GPU | cosine vs 1 GPU | err vs 1-GPU bf16 (1 GPU -> N GPU) | match |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setting, table in doc["summary"].items():
        for p, row in table.items():
            mt = row.get("match") or {}
            errs = "-" if mt.get("e_sharded") is None else \
                f"{_fmt(mt.get('e_single'), '.3e')} -> {mt['e_sharded']:.3e}"
            ok = {True: "yes", False: "**NO**", None: "-"}[mt.get("ok")]
            if row.get("unsupported"):
                ok = row["unsupported"]
            share = None if row["attention_share"] is None else 100 * row["attention_share"]
            lines.append(f"| {row['gpus']} | {'-' if setting == '1gpu' else setting} | {p} | "
                         f"{_fmt(row['step_s'])} | {_fmt(row['projected_s'], '.1f')} | "
                         f"{_fmt(row['speedup'], '.2f', 'x')} | {_fmt(row['scaling'], '.2f', 'x')} | "
                         f"{_fmt(share, '.0f', '%')} | {_fmt(mt.get('rel_err_vs_1gpu'), '.3e')} | "
                         f"{_fmt(mt.get('cos_vs_1gpu'), '.6f')} | {errs} | {ok} |")
    lines.append("")
    return lines


class Recorder:
    """Rank 0's document; rewritten (JSON and markdown) after every measurement."""

    def __init__(self, meta: dict, json_path: Optional[str], md_path: Optional[str], render=None):
        self.doc = {"meta": meta, "status": "running", "runs": [], "summary": {}}
        self.json_path, self.md_path = json_path, md_path
        self.render = render or to_markdown  # doc -> markdown text

    def add(self, run: dict) -> None:
        self.doc["runs"].append(run)
        self.write()

    def write(self, status: Optional[str] = None) -> None:
        if status:
            self.doc["status"] = status
        self.doc["summary"] = summarize(self.doc["runs"], self.doc["meta"]["world"], projections_of(self.doc["meta"]))
        if self.json_path:
            with open(self.json_path + ".tmp", "w") as fh:
                json.dump(self.doc, fh, indent=1)
            os.replace(self.json_path + ".tmp", self.json_path)
        if self.md_path:
            with open(self.md_path, "w") as fh:
                fh.write(self.render(self.doc))


def _versions() -> dict:
    import diffusers

    try:
        import triton
        tv = triton.__version__
    except Exception:  # noqa: BLE001 - CPU-only installs
        tv = "none"
    return {"torch": torch.__version__, "triton": tv, "diffusers": diffusers.__version__,
            "python": platform.python_version(), "commit": commit() or "?"}


# ------------------------------------------------------------------------------------------------ workers

def _log(rank: int, msg: str) -> None:
    print(f"[rank {rank} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
