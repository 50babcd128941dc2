"""What every result file records besides its numbers: the run's header and, per row, the recipe that ran.

* :func:`header`: device, versions, date, commit and command of a run (the result file's ``meta``).
* :func:`recipe_record`: the fields a result row adds for an fsattn recipe: ``recipe`` (the full resolved
  :class:`~fsattn_diffusers.recipe.Recipe`, every field) and ``computed_numerics`` (what the backend that ran
  computes: the Hopper kernels compute their own variant whatever ``Recipe.numerics`` says, NUMERICS.md §6).
* :func:`baseline_record`: the same fields for a row that no fsattn recipe produced (SDPA, FA3, stock attention).
* :func:`recipes_markdown`: the same for a markdown report (one line per recipe).
* :func:`result_rows`: every row of a committed result file, for the check that each carries both fields.
* :func:`module_command` and :func:`finish`: the end of a measurement module's ``main`` (its command line, what it
  prints, the JSON it writes).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

#: ``computed_numerics`` of a row that no fsattn recipe produced.
BASELINE = "baseline"


#: Where a copy of the repository without its ``.git`` (the device machine's) learns its commit: the device scripts'
#: caller sets it to ``git rev-parse --short HEAD`` of the tree it sent.
COMMIT_ENV = "FSATTN_COMMIT"


def commit() -> Optional[str]:
    """The short commit of the checkout this package runs from, ``+dirty`` when its tracked files differ; outside a
    git checkout, :data:`COMMIT_ENV` when set (the device's copy), else None."""
    sent = os.environ.get(COMMIT_ENV, "").strip() or None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        if head.returncode:
            return sent
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return sent
    return head.stdout.strip() + ("+dirty" if dirty else "")


def header(command: Optional[str] = None) -> Dict:
    """Device, versions, date (UTC), commit and command of this run."""
    import torch

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "command": command or " ".join(["fsattn"] + sys.argv[1:]),
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    meta["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return meta


def recipe_record(recipe, backend: str) -> Dict:
    """``{"recipe": every field of the resolved recipe, "computed_numerics": ...}`` for a row that ``backend``
    (a registered backend name) computed; ``recipe`` is a :class:`Recipe` or a name :func:`get_recipe` takes."""
    from ..backends import computed_numerics
    from ..recipe import get_recipe

    r = get_recipe(recipe)
    return {"recipe": dataclasses.asdict(r), "computed_numerics": computed_numerics(backend, r)}


def policy_record(policy: str, steps: int = 20) -> Dict:
    """The two fields for a row that ran ``policy`` (a policy name of :func:`fsattn_diffusers.apply`, or a recipe name
    :func:`~fsattn_diffusers.recipe.get_recipe` resolves): one recipe's
    record for a fixed policy, ``{recipe name: ...}`` maps for a step schedule (over ``steps`` steps), the baseline
    record for stock attention, with ``attention_backend`` and ``sageattention`` (which SageAttention is imported) for
    a diffusers-backend policy (``sage``). The backend is the one that ran each recipe last in this process
    (:data:`fsattn_diffusers.backends.LAST_RAN`); ``computed_numerics`` is None for a recipe that has not run."""
    from ..backends import LAST_RAN, computed_numerics
    from ..backends.fa3_backend import FA3_RECIPES
    from ..integration.policy import BASELINE_POLICIES, DIFFUSERS_BACKEND_POLICIES, get_policy
    from ..recipe import Recipe

    if policy in BASELINE_POLICIES:  # FlashAttention-3 through our processors (no import of fa3-fwd needed here)
        recipe_name, backend = BASELINE_POLICIES[policy]
        return recipe_record(FA3_RECIPES[recipe_name], backend)
    if policy in DIFFUSERS_BACKEND_POLICIES:  # stock processors on a diffusers backend: which one, and what it ran
        from ..integration.sage import sage_identity

        return {**baseline_record(), "attention_backend": f"diffusers:{DIFFUSERS_BACKEND_POLICIES[policy]}",
                "sageattention": sage_identity()}
    try:
        resolved = get_policy(policy)
    except ValueError:  # a recipe name that is no policy name (``int8-bf16+exponential=exact``)
        from ..recipe import get_recipe

        resolved = get_policy(get_recipe(policy))
    recipes = {e.name: e for e in resolved.schedule(steps) if isinstance(e, Recipe)}
    if not recipes:
        return baseline_record()
    fields = {name: dataclasses.asdict(r) for name, r in recipes.items()}
    numerics = {name: computed_numerics(LAST_RAN[name], r) if name in LAST_RAN else None
                for name, r in recipes.items()}
    if len(recipes) == 1:
        (name,) = recipes
        return {"recipe": fields[name], "computed_numerics": numerics[name]}
    return {"recipe": fields, "computed_numerics": numerics}


def baseline_record() -> Dict:
    """The two fields for a row that no fsattn recipe produced."""
    return {"recipe": None, "computed_numerics": BASELINE}


def recipes_markdown(rows: Iterable[Dict]) -> List[str]:
    """Markdown lines for a report's end: every distinct recipe of ``rows`` (records of :func:`recipe_record` /
    :func:`policy_record`) with every field and the numerics its backend computed."""
    seen: Dict[str, str] = {}
    for row in rows:
        recipe, numerics = row.get("recipe"), row.get("computed_numerics")
        pairs = [(recipe, numerics)] if recipe is None or "name" in recipe else \
            [(recipe[name], numerics[name]) for name in recipe]
        for r, n in pairs:
            if r is not None and r["name"] not in seen:
                fields = ", ".join(f"{k}={v}" for k, v in r.items() if k != "name")
                seen[r["name"]] = f"- `{r['name']}` (computed: {n}): {fields}"
    return ["", "Recipes (every field, and the numerics the backend that ran computed):", *seen.values()] if seen else []


def result_rows(doc: Dict) -> Iterator[Tuple[str, Dict]]:
    """``(where, row)`` for every row of a result file's JSON: the lists and maps of per-method, per-policy or
    per-cell dicts that the result writers produce (``results``, ``rows``, ``runs``, ``schedules``, the structured suite's columns,
    the e2e check's ``fa3`` and ``graph_breaks``)."""
    for key in ("results", "rows", "runs", "schedules"):
        rows = doc.get(key)
        if isinstance(rows, list):
            for i, row in enumerate(rows):
                if isinstance(row, dict):
                    yield f"{key}[{i}]", row
        elif isinstance(rows, dict):
            for name, row in rows.items():
                if isinstance(row, dict):
                    yield f"{key}.{name}", row
    result = doc.get("result")
    if isinstance(result, dict) and isinstance(result.get("columns"), list):  # the structured suite: per column
        recipes, numerics = result.get("recipes", {}), result.get("computed_numerics", {})
        for name in result["columns"]:
            yield f"result.columns.{name}", {"recipe": recipes.get(name), "computed_numerics": numerics.get(name),
                                             **({"recipe_source": result["recipe_source"]}
                                                if "recipe_source" in result else {})}
    for key in ("fa3", "graph_breaks"):  # the e2e check
        if isinstance(doc.get(key), list):
            for i, row in enumerate(doc[key]):
                yield f"{key}[{i}]", row


def module_command(module: str, argv: Optional[Sequence[str]] = None) -> str:
    """``python -m MODULE ARGS`` of this run, ARGS ``argv`` (else ``sys.argv[1:]``) quoted for a shell."""
    return f"python -m {module} " + shlex.join(argv or sys.argv[1:])


def finish(out: Dict, json_path: Optional[str], shown: Optional[Dict] = None) -> None:
    """Print ``shown`` as indented JSON (when given) and write ``out`` to ``json_path`` (when given)."""
    if shown is not None:
        print(json.dumps(shown, indent=1))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(out, fh, indent=1)
