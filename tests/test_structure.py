"""The package's layers point one way: no import cycles, and no engine that reads the reports or the planner; and
no product of parallel degrees outside the mesh.

Every import counts: module level, inside functions (lazy) and under ``TYPE_CHECKING``, since each is a dependency
a reader must follow. The walks read the source with ``ast``; nothing of the package is imported but the mesh's
axis names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

from plansim.strategy.mesh import AXIS_ORDER, DP_PARTS, EXPERT_AXES

PACKAGE = Path(__file__).resolve().parents[1] / "plansim"

#: Modules that price a step (the engines and what they read), and the layers above them they must not import.
ENGINE_PREFIXES = ("plansim.analytic", "plansim.des", "plansim.step", "plansim.costs", "plansim.pipeline",
                   "plansim.strategy")  # fmt: skip
ABOVE_ENGINES = ("plansim.report", "plansim.planner", "plansim.comparison", "plansim.sweep", "plansim.cli",
                 "plansim.validation", "plansim.api")  # fmt: skip
ABOVE_REPORTS = ("plansim.planner", "plansim.comparison", "plansim.sweep", "plansim.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (``from pkg import mod`` names the module ``pkg.mod``)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph() -> nx.DiGraph:
    """Module -> the package's modules it imports."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(paths)
    for name, path in paths.items():
        graph.add_edges_from((name, target) for target in _imports(path, name, set(paths)))
    return graph


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_walk_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The walker itself: a function-level and a TYPE_CHECKING import are both edges."""
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from plansim.a import X\n"
        "def f():\n    from plansim import b\n"
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    assert _imports(path, "plansim.m", {"plansim.a", "plansim.b", "plansim.m"}) == {"plansim.a", "plansim.b"}


def test_no_import_cycles() -> None:
    cycles = sorted(nx.simple_cycles(import_graph()), key=len)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:10])


def _folder(name: str) -> str:
    """The package folder a module sits in (``plansim.des.engine`` -> ``plansim.des``); a top-level module is its
    own."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_import_cycles_between_folders() -> None:
    """Collapsed to folders (``plansim.des``, ``plansim.step``, ...), the imports still point one way."""
    folders = nx.DiGraph()
    for a, b in import_graph().edges:
        if _folder(a) != _folder(b):
            folders.add_edge(_folder(a), _folder(b))
    cycles = sorted(nx.simple_cycles(folders), key=len)
    assert not cycles, "folder cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:10])


def test_package_inits_hold_names_only() -> None:
    """A package's ``__init__.py`` holds its docstring and the names it exports: imports, ``__all__`` and the lazy
    loader of ``plansim`` itself; no function or class of its own."""
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE:
            continue  # the public API's lazy loader
        defs = [n.name for n in ast.parse(init.read_text(encoding="utf-8")).body
                if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)]  # fmt: skip
        assert not defs, f"{init.relative_to(PACKAGE.parent)} defines {defs}: move them into a module"


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        (ENGINE_PREFIXES, ABOVE_ENGINES),
        (("plansim.report",), ABOVE_REPORTS),
        (("plansim.des",), ("plansim.analytic",)),
    ],
    ids=["engines-below-reports-planner-api", "reports-below-planner", "lowering-apart-from-analytic"],
)
def test_layers_point_one_way(lower: tuple[str, ...], upper: tuple[str, ...]) -> None:
    graph = import_graph()
    wrong = sorted((a, b) for a, b in graph.edges if _within(a, lower) and _within(b, upper) and not _within(a, upper))
    assert not wrong, "imports against the layering: " + ", ".join(f"{a} -> {b}" for a, b in wrong)


#: The parallel degrees by name: the mesh's axes, hybrid sharding's two data-parallel parts, the expert axes and the
#: strategy's resolved expert tensor parallelism.
DEGREES = frozenset((*AXIS_ORDER, *DP_PARTS, *EXPERT_AXES, "expert_tp"))

#: The one module that multiplies parallel degrees: the mesh, which every GPU count and group size is asked of.
MESH_MODULE = PACKAGE / "strategy" / "mesh.py"


def _degree(node: ast.expr) -> bool:
    """Whether ``node`` reads a parallel degree: a name or an attribute named after a mesh axis (``dp``, ``s.tp``),
    or one with a default (``s.dp or 1``)."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _degree(node.values[0])
    return (isinstance(node, ast.Name) and node.id in DEGREES) or (
        isinstance(node, ast.Attribute) and node.attr in DEGREES
    )


def _factors(node: ast.expr) -> list[ast.expr]:
    """The operands of a chain of multiplications (``a * dp * pp`` -> a, dp, pp), in any grouping."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def degree_products(source: str) -> list[int]:
    """Lines of ``source`` that multiply two or more parallel degrees in one chain (``s.dp * s.tp``, ``tp * pp``,
    ``s.micro_batch * dp * s.pp``): a GPU count written out instead of asked of the mesh
    (``plansim.strategy.mesh.ranks_of``, ``Strategy.num_gpus``)."""
    tree = ast.parse(source)
    inner = {
        id(operand)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
        for operand in (node.left, node.right)
    }
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and id(node) not in inner
        and sum(map(_degree, _factors(node))) >= 2
    )


def test_the_degree_check_sees_products() -> None:
    snippet = "def f(s, tp):\n    a = s.dp * s.tp\n    b = 2 * s.tp\n    return a * s.pp, tp * s.pp * 3, b * 4\n"
    assert degree_products(snippet) == [2, 4]
    assert degree_products("copies = s.tp * (s.dp or 1) * m") == [1]
    assert degree_products("x = s.micro_batch * dp * s.pp\ny = (s.micro_batch * dp) * 2") == [1]


def test_no_product_of_parallel_degrees_outside_the_mesh() -> None:
    """A new parallel axis is an entry of the mesh (``AXIS_ORDER``): no module re-derives a GPU count or a replica's
    width by multiplying degrees, which the new axis would silently miss."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != MESH_MODULE
        for line in degree_products(path.read_text(encoding="utf-8"))
    ]
    assert not found, "products of parallel degrees (ask the mesh): " + ", ".join(found)
