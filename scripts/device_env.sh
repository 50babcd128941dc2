# Shared preamble of the device scripts (sourced, not run): source "$(dirname "$0")/device_env.sh"
# Strict mode, repository root as working directory, $OUT required, carried wheels (.whl/*.whl) installed to
# /tmp/site, SageAttention 2 built from a carried .sage/ folder, the package importable exactly as installed (fsattn_diffusers.kernels / .pipelines, no setuptools,
# no network), `fsattn` on PATH, the environment appended to $OUT/env.txt; defines run_logged and finish.
set -euo pipefail

# Parts: a script sets PARTS_ALL (what `all`, the default, runs) and optionally PARTS_MORE (parts outside `all`)
# before sourcing; its arguments are parts, then optionally `--` and flags for the one part's command (EXTRA).
PARTS=() EXTRA=()
if [[ -n ${PARTS_ALL:-} ]]; then
  while (($#)) && [[ $1 != -- ]]; do PARTS+=("$1"); shift; done
  (($#)) && { shift; EXTRA=("$@"); }
  ((${#PARTS[@]})) || PARTS=(all)
  for part in "${PARTS[@]}"; do
    if [[ " $PARTS_ALL ${PARTS_MORE:-} all " != *" $part "* ]]; then
      echo "$(basename "$0"): unknown part '$part'; accepted: $PARTS_ALL ${PARTS_MORE:+$PARTS_MORE }all (default all)" >&2
      exit 2
    fi
  done
  [[ " ${PARTS[*]} " == *" all "* ]] && read -ra PARTS <<< "$PARTS_ALL"
  if ((${#EXTRA[@]})) && ((${#PARTS[@]} != 1)); then
    echo "$(basename "$0"): flags after -- go to one part's command; got parts: ${PARTS[*]}" >&2
    exit 2
  fi
fi

: "${OUT:?is not set; run as OUT=DIR bash scripts/NAME.sh [part ...]}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the cd below must not move it
export OUT
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The device's copy has no .git: result files take their commit from FSATTN_COMMIT (measure.provenance.COMMIT_ENV),
# which the caller writes into the command: FSATTN_COMMIT=<git rev-parse --short HEAD of the tree sent> OUT=$OUT ...
if [[ -z ${FSATTN_COMMIT:-} && ! -e .git ]]; then
  echo "$(basename "$0"): FSATTN_COMMIT is not set; result files will record no commit" >&2
fi

# Once per machine and set of wheels, under a lock: two scripts started side by side both ran `pip --upgrade` into
# /tmp/site, and one of them failed in pip's removal of the other's fresh copy (diffusers' package tree).
if compgen -G ".whl/*.whl" >/dev/null; then
  wheels_id=$(ls .whl/*.whl | sort | cksum | cut -d' ' -f1)
  (
    command -v flock >/dev/null && flock 9
    if [[ ! -e /tmp/site/.fsattn-wheels-$wheels_id ]]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      touch "/tmp/site/.fsattn-wheels-$wheels_id"
    fi
  ) 9>/tmp/fsattn-site.lock
fi

# The installed layout: fsattn_diffusers/ with kernels/ and pipelines/ inside it (pyproject's package-dir),
# assembled from symlinks. PYTHONSAFEPATH (Python >= 3.11) keeps the working directory off sys.path, so the
# repository's own fsattn_diffusers/ (which has no kernels/) cannot shadow it.
# Links are replaced in place (no rm -rf), so two scripts started side by side on one machine do not race.
FSATTN_SRC=/tmp/fsattn_src
mkdir -p "$FSATTN_SRC/fsattn_diffusers" /tmp/fsattn_bin
find "$FSATTN_SRC/fsattn_diffusers" -mindepth 1 -maxdepth 1 -xtype l -delete  # entries gone from the checkout
for entry in "$PWD"/fsattn_diffusers/*; do
  ln -sfn "$entry" "$FSATTN_SRC/fsattn_diffusers/${entry##*/}"
done
ln -sfn "$PWD/kernels" "$FSATTN_SRC/fsattn_diffusers/kernels"
ln -sfn "$PWD/pipelines" "$FSATTN_SRC/fsattn_diffusers/pipelines"
export PYTHONPATH=/tmp/site:$FSATTN_SRC PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
printf '#!/bin/sh\nexec python3 -m fsattn_diffusers "$@"\n' > /tmp/fsattn_bin/fsattn
chmod +x /tmp/fsattn_bin/fsattn
export PATH=/tmp/fsattn_bin:$PATH

python3 - "$PWD" <<'PY' || { echo "device_env.sh: the package is not importable from $PWD (see above)" >&2; exit 1; }
import importlib, os, sys
if sys.version_info < (3, 11):
    sys.exit(f"Python {sys.version.split()[0]}: PYTHONSAFEPATH needs >= 3.11 (else the repository shadows the package)")
from fsattn_diffusers.backends import registered
# the kernels and every backend's own kernel package resolve to this checkout's kernels/
for name in ["fsattn_diffusers.kernels"] + [b.kernels for b in registered().values() if b.kernels]:
    where = os.path.realpath(importlib.import_module(name).__file__)
    if not where.startswith(os.path.join(sys.argv[1], "kernels") + os.sep):
        sys.exit(f"{name} resolves to {where}, not {sys.argv[1]}/kernels")
PY

# SageAttention 2 as a baseline: when the folder of ../shared/baselines/sageattention is carried as .sage/, build it
# once per machine (~85 s, under a lock) into /tmp/sage with its Hopper build script (integration/sage.py's
# BUILD_SCRIPT) and put it on PYTHONPATH (the sage columns and policy).
if [[ -d .sage && ${SAGE_BUILD:-1} == 1 ]]; then
  sage_build=.sage/$(python3 -c 'from fsattn_diffusers.integration.sage import BUILD_SCRIPT; print(BUILD_SCRIPT)')
  if [[ -f $sage_build ]]; then
    (
      command -v flock >/dev/null && flock 9
      [[ -e /tmp/sage/sageattention/__init__.py ]] || bash "$sage_build" /tmp/sage > /tmp/sage_build.log 2>&1 || {
        echo "device_env.sh: the SageAttention 2 build failed (/tmp/sage_build.log):" >&2
        tail -5 /tmp/sage_build.log >&2
      }
    ) 9>/tmp/fsattn-sage.lock
    [[ -e /tmp/sage/sageattention/__init__.py ]] && export PYTHONPATH=/tmp/sage:$PYTHONPATH
  else
    echo "device_env.sh: $sage_build is absent; SageAttention 2 is not built" >&2
  fi
fi

{
  echo "== $(basename "$0") $* ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.max.sm,memory.total --format=csv,noheader
  else
    echo "nvidia-smi: not present"
  fi
  python3 - <<'PY'
import platform
from importlib import metadata
print("python", platform.python_version())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
except ImportError:
    print("torch absent")
for dist in ("triton", "diffusers", "fa3-fwd", "sageattention", "torchao", "xfuser", "yunchang"):
    try:
        print(dist, metadata.version(dist))
    except metadata.PackageNotFoundError:
        print(dist, "absent")
PY
  # The working tree travels without always updating .git: the commit is the one .git names, plus what differs.
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo 'unknown (no git repository here)')" \
       "($(git status --porcelain 2>/dev/null | wc -l) paths differ from it in this tree)"
} >> "$OUT/env.txt" 2>&1

FSATTN_FAILED=()
FSATTN_DONE=()

# run_logged NAME CMD...: runs CMD with stdout and stderr teed to $OUT/NAME (NAME.log when NAME has no
# extension); a failure is recorded and the script goes on. `finish` prints the summary and sets the exit code.
run_logged() {
  local name=$1 rc=0 t0=$SECONDS
  shift
  [[ $name == *.* ]] || name=$name.log
  echo "== $name: $* ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))" | tee "$OUT/$name"
  "$@" 2>&1 | tee -a "$OUT/$name" || rc=$?
  echo "== $name: rc=$rc$([[ $rc == 124 ]] && echo ' (timed out)') after $((SECONDS - t0)) s" | tee -a "$OUT/$name"
  if [[ $rc == 0 ]]; then FSATTN_DONE+=("$name"); else FSATTN_FAILED+=("$name (rc $rc)"); fi
  return 0
}

finish() {
  echo "== done: ${FSATTN_DONE[*]:-none}"
  if ((${#FSATTN_FAILED[@]})); then
    echo "== FAILED: ${FSATTN_FAILED[*]}"
    exit 1
  fi
  exit 0
}
