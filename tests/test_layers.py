"""Layers import downward only (issue 8, finding 11).

grid -> controls -> operators -> solvers -> schemes -> propagator -> models; control
(training), data and the CLI above (docs/design.md).  Every module under ``opsplit/`` is
parsed with ``ast``, imports inside functions and ``if TYPE_CHECKING:`` blocks included,
and no module may import from a unit of a higher layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "opsplit"

#: rank of each top-level unit of the package; a module may import from its own unit and
#: from units of a lower rank only.
LAYERS = {
    "_checks": 0,  # shared argument checks, used by every layer
    "_compile": 0,  # torch.compile markers that do not import dynamo at import time
    "_memory": 0,  # the memory available to an allocation, for the size guards
    "_files": 0,  # file digests shared by the data caches and the checkpoints
    "functional": 1,  # attention kernels on plain tensors (no grid)
    "grid": 2,  # where
    "controls": 3,  # with what
    "operators": 4,  # what moves u
    "solvers": 5,  # how one substep is advanced
    "schemes": 6,  # in what order
    "revolve": 7,  # binomial checkpointing of a time loop (used by the propagator)
    "propagator": 7,  # the composed map
    "solution": 7,  # what a solve returns: states, statistics (Propagator.solve)
    "adaptive": 7,  # adaptive time steps beside the propagator (error estimate, controller)
    "coarse": 7,  # coarse solves that read piecewise controls averaged over each step
    "reference": 8,  # the unsplit model solved by torchdiffeq (terms, solvers, schemes)
    "models": 9,  # named discretisations and converters
    "analysis": 10,  # measuring: convergence studies, spline degree
    "data": 11,  # bundled and generated datasets
    "control": 12,  # training: objective, trainer, gradient modes, checkpoints
    "cli": 13,  # the `opsplit` command: configs, jobs, output folders, reports
    "__main__": 14,  # `python -m opsplit`, the same command
    "": 15,  # the package root, opsplit/__init__.py
}

#: names that any layer may read from the package root: metadata, not code
ROOT_METADATA = {"__version__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def opsplit_imports(source: str, module: str, is_package: bool):
    """``(line, target module, imported names)`` of every import of ``opsplit`` in a
    module's source, at any depth (functions, classes, conditionals), relative imports
    resolved, ``importlib.import_module("...")`` with a literal name included."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            if target == "opsplit":
                # `from opsplit import solvers` imports the unit `opsplit.solvers`
                for n in names:
                    out.append((node.lineno, f"opsplit.{n}" if n not in ROOT_METADATA else "opsplit", [n]))
            elif target.startswith("opsplit."):
                out.append((node.lineno, target, names))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "opsplit" or a.name.startswith("opsplit."):
                    out.append((node.lineno, a.name, []))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("opsplit")
        ):
            out.append((node.lineno, node.args[0].value, []))
    return out


def upward_imports(source: str, module: str, is_package: bool = False):
    """The imports of ``module`` that reach a unit of a higher layer."""
    unit = _unit(module)
    bad = []
    for line, target, names in opsplit_imports(source, module, is_package):
        t_unit = _unit(target)
        if t_unit == unit:
            continue
        if t_unit == "" and names and set(names) <= ROOT_METADATA:
            continue
        if LAYERS[t_unit] > LAYERS[unit]:
            bad.append(f"{module}:{line} imports {target} ({', '.join(names) or 'module'})")
    return bad


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)) for p in MODULES}
    assert units - set(LAYERS) == set(), "new top-level unit: give it a layer in LAYERS"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_module_imports_downward_only(path):
    module = _module_name(path)
    bad = upward_imports(path.read_text(), module, path.name == "__init__.py")
    assert bad == [], "upward imports:\n" + "\n".join(bad)


def test_the_checker_sees_function_level_and_relative_imports():
    # the finding itself: an operator importing Substep inside a function
    src = "def f():\n    from ..solvers import Substep\n"
    assert upward_imports(src, "opsplit.operators.relaxation") == [
        "opsplit.operators.relaxation:2 imports opsplit.solvers (Substep)"
    ]
    # absolute, package-root and importlib forms, under TYPE_CHECKING too
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import opsplit.models\n"
        "from opsplit import propagator\n"
        "import importlib\nimportlib.import_module('opsplit.schemes.lie')\n"
    )
    assert len(upward_imports(src, "opsplit.solvers.euler")) == 3
    # downward and same-unit imports are fine; so is the package's version string
    src = "from ..operators import ProjectionS1\nfrom .base import Solver\nfrom .. import __version__\n"
    assert upward_imports(src, "opsplit.solvers.catch_up") == []


def test_the_scan_reads_real_imports():
    # guards against a scan that passes because it finds nothing: known downward edges
    edges = {
        (_module_name(p), target)
        for p in MODULES
        for _, target, _ in opsplit_imports(p.read_text(), _module_name(p), p.name == "__init__.py")
    }
    assert ("opsplit.solvers.catch_up", "opsplit.operators") in edges
    assert ("opsplit.propagator", "opsplit.schemes.base") in edges or any(
        m == "opsplit.propagator" and t.startswith("opsplit.schemes") for m, t in edges
    )
    assert any(m.startswith("opsplit.models") and t.startswith("opsplit.operators") for m, t in edges)


def test_relaxation_lives_with_the_schemes():
    # eq. (16) composes substeps (operator, solver): a step of the scheme, above the solvers
    import opsplit.operators
    from opsplit.models.paper import paper_scheme  # noqa: F401  (the paper model uses it)
    from opsplit.operators import Operator
    from opsplit.schemes import Relaxation

    assert Relaxation.__module__ == "opsplit.schemes.relaxation"
    assert issubclass(Relaxation, Operator)
    assert "Relaxation" not in opsplit.operators.__all__
    # the old path says where it went instead of a bare AttributeError
    with pytest.raises(AttributeError, match=r"moved to opsplit\.schemes\.Relaxation"):
        opsplit.operators.Relaxation  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'Nonexistent'"):
        opsplit.operators.Nonexistent  # noqa: B018


# -- import circles (issue 43) ------------------------------------------------------------------
#: circles among the package's modules tolerated by the scan: none (every module imports
#: downward only; a circle is broken by moving what both sides need into a module below them)
KNOWN_CIRCLES: list = []


def import_graph(modules: dict) -> dict:
    """``{module: {modules it imports}}`` for ``{module: (source, is_package)}``: every import
    of :func:`opsplit_imports` (module level, inside functions, under ``TYPE_CHECKING``), an
    imported name that is a submodule (``from . import euler``) an edge to that submodule,
    else to the module named (a package: its ``__init__``); self-edges dropped."""
    graph = {}
    for module, (source, is_package) in modules.items():
        out = set()
        for _, target, names in opsplit_imports(source, module, is_package):
            for t in [f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names] or [target]:
                while t not in modules and "." in t:
                    t = t.rpartition(".")[0]
                if t in modules and t != module:
                    out.add(t)
        graph[module] = out
    return graph


def import_circles(graph: dict) -> list[set]:
    """The circles of ``graph``: its strongly connected components of two or more modules
    (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_modules() -> dict:
    return {_module_name(p): (p.read_text(), p.name == "__init__.py") for p in MODULES}


def test_no_new_import_circle():
    """No circle among the package's modules (module-level and function-level imports alike)
    but those of :data:`KNOWN_CIRCLES`: a circle is broken by moving what both sides need
    down into a module both import, not by moving an import into a function."""
    new = [sorted(c) for c in import_circles(import_graph(_package_modules()))
           if not any(c <= known for known in KNOWN_CIRCLES)]
    assert new == [], "new import circles (move what both sides need downwards):\n" + "\n".join(map(str, new))


def test_the_circle_scan_finds_circles_through_functions_and_submodules():
    # a function-level import closes a circle as well as a module-level one
    mods = {
        "opsplit.solvers": ("from .base import Solver\n", True),
        "opsplit.solvers.base": ("def solver_for():\n    from .euler import ExplicitEuler\n", False),
        "opsplit.solvers.euler": ("from .base import Solver\n", False),
        "opsplit.solvers.heun": ("from . import euler\n", False),
        "opsplit.grid": ("import opsplit.solvers.heun\n", False),
    }
    graph = import_graph(mods)
    assert graph["opsplit.solvers.heun"] == {"opsplit.solvers.euler"}  # a submodule, not the package
    assert graph["opsplit.grid"] == {"opsplit.solvers.heun"}
    assert import_circles(graph) == [{"opsplit.solvers.base", "opsplit.solvers.euler"}]
    # through the package's __init__: a module importing its own package closes a circle
    mods["opsplit.solvers.euler"] = ("from opsplit.solvers import Solver\n", False)
    assert import_circles(import_graph(mods)) == [{"opsplit.solvers", "opsplit.solvers.base", "opsplit.solvers.euler"}]
    # and the real package is read: known downward edges are there
    real = import_graph(_package_modules())
    assert "opsplit.solvers.solver" in real["opsplit.solvers.euler"]
    assert "opsplit.operators" in real["opsplit.solvers.catch_up"]
