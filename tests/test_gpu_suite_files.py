"""scripts/gpu_suite_h200.sh's ``tests`` part runs every single-GPU kernel test module by default: each module that
skips without an sm_90 GPU (``kernel_device.skip_module_without_sm90()``), the fuzz apart (its own ``fuzz`` part)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _default_test_files():
    text = (ROOT / "scripts" / "gpu_suite_h200.sh").read_text()
    m = re.search(r'default="([^"]*)"', text)
    assert m, "scripts/gpu_suite_h200.sh: no default=\"...\" test list in its tests part"
    return set(m.group(1).split())


def test_the_gpu_suite_runs_every_sm90_test_module():
    modules = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
               if re.search(r"^skip_module_without_sm90\(\)", p.read_text(), re.M)}
    listed = _default_test_files()
    expected = modules - {"tests/test_kernel_fuzz_gpu.py"}
    print(f"sm90 modules {sorted(expected)}; listed {sorted(listed)}")
    assert listed == expected, f"missing {sorted(expected - listed)}, not a module {sorted(listed - expected)}"
