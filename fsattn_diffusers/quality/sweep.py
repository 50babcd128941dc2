"""``fsattn sweep``: every prompt under every policy, compared with the bf16 video of the same prompt.

bf16 (stock diffusers attention) is always the reference and runs first. Every policy of a prompt
starts from the same seed and the same initial latent (captured from the first run of the prompt,
stored in ``latents/`` and passed to every later run; each row records the latent's digest). Videos
that exist with the same settings are reused; a policy that fails is reported and the others'
results are kept.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .loading import VideoSpec, run_kwargs
from .metrics import DEFAULT_EVERY, compare_frames, frame_indices
from .probe import RunProbe, latent_digest
from .store import VideoStore, slug

REFERENCE = "bf16"
#: Policies swept when none are given.
DEFAULT_POLICIES = ("bf16", "mxfp8", "mxfp6", "mxfp4", "hybrid")
#: Untimed warm-up run before the first generated video.
WARMUP_STEPS, WARMUP_MP4 = 1, ".warmup.mp4"


@dataclass(frozen=True)
class PolicyItem:
    """A policy of the sweep: its label in reports, file-name slug and resolved Policy."""

    label: str
    slug: str
    policy: object


def _split_policies(text: str) -> List[str]:
    """Split one ``--policies`` value. Consecutive ``NAME:STEPS`` items form one schedule; ``;`` ends one."""
    out: List[str] = []
    for group in text.split(";"):
        schedule: List[str] = []
        for item in (p.strip() for p in group.split(",")):
            if not item:
                continue
            if ":" in item:
                schedule.append(item)
                continue
            if schedule:
                out.append(",".join(schedule))
                schedule = []
            out.append(item)
        if schedule:
            out.append(",".join(schedule))
    return out


def parse_policies(values: Sequence) -> List[PolicyItem]:
    """Resolve policy specifications; bf16 first (added when missing), duplicates dropped.

    ``values`` holds strings (comma lists as ``--policies`` takes them; see :func:`_split_policies`)
    or :class:`~fsattn_diffusers.integration.policy.Policy` objects. One-line ValueError when one is
    unknown.
    """
    from ..integration.policy import STOCK_NAMES, Policy, get_policy

    items: List[PolicyItem] = []
    labels = set()
    for value in values:
        specs = [value] if isinstance(value, Policy) else _split_policies(str(value))
        for spec in specs:
            label = spec.name if isinstance(spec, Policy) else spec.lower()
            if label in STOCK_NAMES:
                label = REFERENCE
            if label in labels:
                continue
            policy = get_policy(spec)
            labels.add(label)
            items.append(PolicyItem(label, slug(label), policy))
    if REFERENCE not in labels:
        items.insert(0, PolicyItem(REFERENCE, REFERENCE, get_policy(REFERENCE)))
    items.sort(key=lambda it: it.label != REFERENCE)  # stable: bf16 first, the rest as given
    return items


def read_prompts(path: str) -> List[str]:
    """Prompts of a text file, one per line; blank lines and ``#`` comments skipped."""
    with open(path, encoding="utf-8") as fh:
        prompts = [line.strip() for line in fh]
    return [p for p in prompts if p and not p.startswith("#")]


@dataclass
class VideoRow:
    """One prompt x policy: how it ran and, once compared, its metrics against bf16."""

    prompt_id: str
    prompt: str
    policy: str
    status: str  # "ok" or "failed"
    reused: bool = False
    video: Optional[str] = None
    wall_s: Optional[float] = None
    step_s: Optional[float] = None
    step_times: List[float] = field(default_factory=list)
    latent_digest: Optional[str] = None
    error: Optional[str] = None
    metrics: Optional[object] = None  # FrameMetrics
    note: Optional[str] = None


@dataclass
class SweepResult:
    out: str
    spec: VideoSpec
    prompts: List[Tuple[str, str]]
    policies: List[PolicyItem]
    every: int
    indices: List[int]
    rows: List[VideoRow]
    lpips_note: str
    lpips_available: bool
    files: Dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    device: str = "cpu"

    @property
    def failed(self) -> List[VideoRow]:
        return [r for r in self.rows if r.status != "ok"]


def _one_line_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _generate(pipe, store: VideoStore, spec: VideoSpec, pid: str, prompt: str, item: PolicyItem,
              latent, indices, progress: bool) -> Tuple[VideoRow, Optional[object]]:
    """Run one video; return its row and the latent it started from."""
    from ..integration.runner import generate_video, to_uint8_frames

    out = store.mp4(pid, item.slug)
    extra = {} if latent is None else {"latents": latent}
    with RunProbe(pipe) as probe:
        result = generate_video(pipe, prompt, out=out, policy=item.policy, progress=progress,
                                callback_on_step_end=probe.step_end, **run_kwargs(spec), **extra)
    if probe.frames is None or probe.latent is None:
        raise RuntimeError("the pipeline did not go through prepare_latents / postprocess_video")
    frames = to_uint8_frames(probe.frames)
    store.save_frames(pid, item.slug, frames, indices)
    steps = probe.step_seconds
    row = VideoRow(pid, prompt, item.label, "ok", video=out, wall_s=result.seconds,
                   step_s=sum(steps) / len(steps) if steps else None, step_times=steps,
                   latent_digest=latent_digest(probe.latent))
    store.save_sidecar(pid, item.slug, {
        "key": dict(spec.key(), prompt=prompt, policy=item.label), "prompt": prompt, "policy": item.label,
        "wall_s": row.wall_s, "step_s": row.step_s, "step_times": steps, "latent_digest": row.latent_digest,
        "frame_indices": list(indices), "num_frames": int(frames.shape[0]), "height": int(frames.shape[1]),
        "width": int(frames.shape[2]), "summary": result.summary,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return row, probe.latent


def _reused_row(store: VideoStore, record: dict, pid: str, prompt: str, item: PolicyItem) -> VideoRow:
    return VideoRow(pid, prompt, item.label, "ok", reused=True, video=store.mp4(pid, item.slug),
                    wall_s=record.get("wall_s"), step_s=record.get("step_s"),
                    step_times=record.get("step_times") or [], latent_digest=record.get("latent_digest"))


def warm_up(pipe, spec: VideoSpec, prompt: str, store: VideoStore) -> None:
    """One untimed 1-step bf16 run at the sweep's size, so the first timed video (bf16, the reference
    of every speed ratio) does not pay the process's one-time costs."""
    from ..integration.runner import generate_video

    path = os.path.join(store.out, WARMUP_MP4)
    kwargs = dict(run_kwargs(spec), steps=WARMUP_STEPS)
    try:
        generate_video(pipe, prompt, out=path, policy=REFERENCE, progress=False, **kwargs)
    finally:
        if os.path.exists(path):
            os.remove(path)


def generate_all(pipe, spec: VideoSpec, prompts: List[Tuple[str, str]], policies: List[PolicyItem],
                 store: VideoStore, indices: List[int], progress: bool = True,
                 warmup: bool = True, before_each=None) -> List[VideoRow]:
    """Every prompt x policy, reusing finished videos; failures become rows with ``status="failed"``.

    With ``warmup``, one untimed 1-step bf16 run precedes the first video that is generated.
    ``before_each(prompt_id, item)``, when given, is called before each video (reused or generated); one
    progress bar counts every video.
    """
    from tqdm import tqdm

    rows: List[VideoRow] = []
    latent_key = {k: spec.key()[k] for k in ("model", "height", "width", "num_frames", "seed")}
    bar = tqdm(total=len(prompts) * len(policies), desc="sweep", unit="video", file=sys.stderr,
               disable=not progress)
    with bar:
        for pid, prompt in prompts:
            latent = store.load_latent(pid, latent_key)
            for item in policies:
                if before_each is not None:
                    before_each(pid, item)
                bar.set_postfix_str(f"{pid} {item.label}")
                key = dict(spec.key(), prompt=prompt, policy=item.label)
                record = store.reusable(pid, item.slug, key, indices)
                if record is not None:
                    rows.append(_reused_row(store, record, pid, prompt, item))
                    bar.update(1)
                    continue
                try:
                    if warmup:
                        warmup = False
                        bar.set_postfix_str("warm-up (1 step, bf16, untimed)")
                        warm_up(pipe, spec, prompt, store)
                        bar.set_postfix_str(f"{pid} {item.label}")
                    row, used = _generate(pipe, store, spec, pid, prompt, item, latent, indices, progress)
                except Exception as exc:  # a failing policy must not lose the others' results
                    row, used = VideoRow(pid, prompt, item.label, "failed", error=_one_line_error(exc)), None
                    bar.write(f"fsattn sweep: {pid} / {item.label} failed: {row.error}", file=sys.stderr)
                if latent is None and used is not None:
                    latent = used
                    store.save_latent(pid, latent_key, latent)
                rows.append(row)
                bar.update(1)
    return rows


def compare_all(rows: List[VideoRow], store: VideoStore, policies: List[PolicyItem], indices: List[int],
                lpips=None) -> None:
    """Fill ``row.metrics`` with each video's metrics against the bf16 video of its prompt."""
    slugs = {it.label: it.slug for it in policies}
    refs = {r.prompt_id: r for r in rows if r.policy == REFERENCE and r.status == "ok"}
    for row in rows:
        if row.status != "ok":
            continue
        ref = refs.get(row.prompt_id)
        if ref is None:
            row.note = "no bf16 reference (its run failed)"
            continue
        if ref.latent_digest != row.latent_digest:
            row.note = f"initial latent differs from bf16's ({row.latent_digest} vs {ref.latent_digest})"
        ref_frames = store.load_frames(row.prompt_id, REFERENCE, indices)
        frames = store.load_frames(row.prompt_id, slugs[row.policy], indices)
        if ref_frames.shape != frames.shape:
            row.note = f"frame shape {frames.shape} differs from bf16's {ref_frames.shape}"
            continue
        row.metrics = compare_frames(ref_frames, frames, indices, lpips)


def run_sweep(pipe, spec: VideoSpec, prompts: Sequence[str], policies: Sequence, out: str,
              every: int = DEFAULT_EVERY, lpips=None, grid_frames: int = 4, progress: bool = True,
              warmup: bool = True) -> SweepResult:
    """Generate, compare and report (see the module docstring).

    Parameters
    ----------
    pipe : a Wan / HunyuanVideo diffusers pipeline
    spec : VideoSpec
        Size, frames, steps, guidance, seed and attention backend of every video.
    prompts : list of str
    policies : list of str or Policy
        As :func:`parse_policies` takes them; bf16 is added first when missing.
    out : str
        Output folder (created).
    every : int
        Metrics on frames 0, every, 2*every, ...
    lpips : LpipsMetric, optional
        Without one, LPIPS is reported unavailable.
    grid_frames : int
        Frames per row of the frame grid.
    warmup : bool
        One untimed 1-step bf16 run before the first generated video (see :func:`warm_up`).

    Returns
    -------
    SweepResult
        Rows (one per prompt x policy) with metrics; the written files in ``files``.
    """
    from .lpips_metric import unavailable
    from .report import write_outputs

    start = time.perf_counter()
    items = policies if policies and all(isinstance(p, PolicyItem) for p in policies) else parse_policies(policies)
    if not prompts:
        raise ValueError("no prompts; accepted: --prompt TEXT (repeatable) or --prompts FILE with one per line")
    indices = frame_indices(spec.num_frames, every)
    named = [(f"p{i:02d}", p) for i, p in enumerate(prompts)]
    store = VideoStore(out)
    lpips = lpips or unavailable("not requested")
    from ..integration.runner import announce_backend

    announce_backend([it.policy for it in items], spec.backend, getattr(pipe, "device", "cpu"))
    rows = generate_all(pipe, spec, named, items, store, indices, progress, warmup)
    compare_all(rows, store, items, indices, lpips)
    result = SweepResult(out, spec, named, items, every, indices, rows, lpips.describe(), lpips.available)
    result.seconds = time.perf_counter() - start
    result.device = str(getattr(pipe, "device", "cpu"))
    result.files = write_outputs(result, store, grid_frames)
    return result
