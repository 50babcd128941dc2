"""Numeric tolerances of the tests live in one home: ``tests/tolerances.py`` (named constants, each with its reason)
and ``fsattn_diffusers/testing.py`` (the kernel rule and the split rule). This test counts the numeric tolerance
literals written anywhere else in ``tests/`` and holds the count at or below :data:`INLINE_TOLERANCE_BAR`.

What counts (an AST scan; run ``python tests/test_tolerance_home.py`` for the list with file:line):

* a float literal (``1e-3``, ``0.05``; not an integer, not ``0.0`` or ``1.0``, which bound ranges) that is the
  value of a ``atol=``, ``rtol=``, ``rel=`` or ``abs=`` keyword argument of any call;
* a float literal in a tolerance position of ``allclose``, ``isclose``, ``assert_close`` (third argument on) or
  ``approx`` (second on);
* a float literal inside an ordering comparison (``<``, ``<=``, ``>``, ``>=``) of an ``assert`` statement,
  arithmetic around it included (``e < 1.25 * e_ref + 5e-3`` counts two);
* a float literal in an expression of literals (no call, list or tuple: not input data) assigned to a name that
  such an assert comparison or keyword argument reads (``tol = 1e-3``).

Not counted: exact checks (``==``, ``torch.equal``), the expected value of ``pytest.approx(x)``, positional
arguments of calls (inputs such as ``exact_attention(q, k, v, 0.125)``; but ``torch.allclose(a, b, 1e-5)``'s
tolerances count), members of set displays, and literals outside asserts (``torch.rand(n) < 0.5``).
"""

from __future__ import annotations

import ast
import pathlib
import sys
from typing import List, Tuple

TESTS = pathlib.Path(__file__).resolve().parent
#: Files allowed to hold tolerance literals: the named constants of the tests (the kernel rule sits in the package).
HOMES = ("tolerances.py",)
TOLERANCE_KEYWORDS = ("atol", "rtol", "rel", "abs")
#: Numeric tolerance literals allowed in tests outside their home (issue 52's bar).
INLINE_TOLERANCE_BAR = 10


#: Calls whose positional arguments from this index on are tolerances (``torch.allclose(a, b, rtol, atol)``).
TOLERANCE_POSITIONS = {"allclose": 2, "isclose": 2, "assert_close": 2, "approx": 1}


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _inputs(node: ast.AST) -> set:
    """ids of the nodes below ``node`` that are inputs, not bounds: positional arguments of calls (but the
    tolerance positions of :data:`TOLERANCE_POSITIONS`) and the members of set displays (``{1.0, 1.25}``)."""
    skip = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            for arg in n.args[:TOLERANCE_POSITIONS.get(_name(n), len(n.args))]:
                skip |= {id(m) for m in ast.walk(arg)}
        elif isinstance(n, ast.Set):
            skip |= {id(m) for m in ast.walk(n)}
    return skip


def _float_literals(node: ast.AST) -> List[ast.Constant]:
    skip = _inputs(node)
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is float
            and n.value not in (0.0, 1.0) and id(n) not in skip]


def _is_ordering(node: ast.AST) -> bool:
    return isinstance(node, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops)


def tolerance_literals(source: str) -> List[Tuple[int, float]]:
    """``(line, value)`` of each numeric tolerance literal in one test module's source (rules: module docstring)."""
    tree = ast.parse(source)
    found, read_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            for cmp in filter(_is_ordering, ast.walk(node.test)):
                found += _float_literals(cmp)
                read_names |= {n.id for n in ast.walk(cmp) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.keyword) and node.arg in TOLERANCE_KEYWORDS:
            found += _float_literals(node.value)
            read_names |= {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Call) and _name(node) in TOLERANCE_POSITIONS:
            for arg in node.args[TOLERANCE_POSITIONS[_name(node)]:]:
                found += _float_literals(arg)
                read_names |= {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if (any(isinstance(t, ast.Name) and t.id in read_names for t in targets) and node.value is not None
                    and not any(isinstance(n, (ast.Call, ast.List, ast.Tuple)) for n in ast.walk(node.value))):
                found += _float_literals(node.value)
    unique = {id(c): c for c in found}.values()
    return sorted((c.lineno, c.value) for c in unique)


def inline_tolerances() -> List[Tuple[str, int, float]]:
    """``(file, line, value)`` of every tolerance literal in ``tests/*.py`` outside :data:`HOMES`."""
    rows = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name not in HOMES:
            rows += [(path.name, line, value) for line, value in tolerance_literals(path.read_text())]
    return rows


def test_scan_finds_each_kind_of_tolerance():
    src = ("tol = 2e-3\n"
           "def test():\n"
           "    assert err < 0.05 and e < 1.25 * r + 5e-3\n"
           "    assert torch.allclose(a, b, atol=1e-5, rtol=0) and x == pytest.approx(0.5, rel=1e-9)\n"
           "    assert d < tol and 0.0 <= p <= 1.0 and n > 3 and y == 0.25\n"
           "    mask = torch.rand(8) < 0.5\n"
           "    s = torch.tensor([2.0, 5.0])\n"
           "    assert s.max() < 6 and f(x, 0.125) < 0.5 and torch.allclose(a, b, 1e-4) and set(s) <= {1.5}\n")
    assert tolerance_literals(src) == [(1, 2e-3), (3, 5e-3), (3, 0.05), (3, 1.25), (4, 1e-9), (4, 1e-5),
                                       (8, 1e-4), (8, 0.5)]


def test_inline_tolerances_stay_within_the_bar():
    rows = inline_tolerances()
    print(f"{len(rows)} inline tolerance literals in {len({f for f, _, _ in rows})} files:")
    for name, line, value in rows:
        print(f"  tests/{name}:{line}  {value!r}")
    assert len(rows) <= INLINE_TOLERANCE_BAR, "name the tolerance in tests/tolerances.py (with its reason)"


if __name__ == "__main__":
    found = inline_tolerances()
    for file_name, lineno, literal in found:
        print(f"tests/{file_name}:{lineno}  {literal!r}")
    print(f"{len(found)} inline tolerance literals in {len({f for f, _, _ in found})} files")
    sys.exit(0)
