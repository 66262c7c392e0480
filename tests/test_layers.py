"""The package's layers hold: no module imports a layer above its own, and no import cycle.

The pipeline reads bottom-up (docs/architecture.md): records, cost models,
capture, transforms, the simulator, placement, the runtime, reports, the
measuring harnesses, the API and the command line. Every ``import`` of a
``placer`` module counts, the ones inside functions included, so a cycle
cannot hide behind a function-local import.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "placer"

#: Bottom-up; a module may import its own layer and the ones below it.
LAYERS = (
    ("base", ("placer.errors", "placer.io", "placer.show", "placer.gcpause", "placer.terminate")),
    ("records", ("placer.graph", "placer.paths", "placer.cluster", "placer.plan", "placer.generate")),
    ("cost", ("placer.cost",)),
    ("capture", ("placer.capture",)),
    ("transform", ("placer.transform",)),
    ("sim", ("placer.sim", "placer.feasibility")),
    ("place", ("placer.algorithms", "placer.learn")),
    ("run", ("placer.runtime",)),
    ("report", ("placer.report",)),
    ("harness", ("placer.harness",)),
    ("api", ("placer.api",)),
    ("cli", ("placer.cli", "placer.__main__", "placer")),
)


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the longest prefix that names ``module``'s layer."""
    best = max(
        (
            (len(prefix), k)
            for k, (_, prefixes) in enumerate(LAYERS)
            for prefix in prefixes
            if module == prefix or (prefix != "placer" and module.startswith(prefix + "."))
        ),
        default=None,
    )
    if best is None:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS and docs/architecture.md")
    return best[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


class Import(NamedTuple):
    """One import of a placer module: what it imports, where, and whether only type checkers run it."""

    target: str
    line: int
    typing_only: bool


def imports(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """Every import of a placer module in ``path``, at any depth of the file."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found += [
            Import(target, node.lineno, id(node) in typing_only) for target in targets if target.startswith("placer")
        ]
    return found


def import_graph() -> nx.DiGraph:
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        for target, line, typing_only in imports(name, path, known):
            if target != name and not name.startswith(target + "."):  # a package's own __init__
                graph.add_edge(name, target, line=line, typing_only=typing_only)
    return graph


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{a}:{d['line']} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, b, d in import_graph().edges(data=True)
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle_between_modules():
    graph = import_graph()
    graph.remove_edges_from([(a, b) for a, b, typing_only in graph.edges(data="typing_only") if typing_only])
    graph.remove_node("placer")  # the package re-exports its layers
    cycles = list(nx.simple_cycles(graph, length_bound=6))
    assert not cycles, "\n".join(" -> ".join(c + [c[0]]) for c in cycles[:10])


def test_every_module_has_a_layer_and_the_order_is_the_pipeline():
    for module in modules():
        layer_of(module)
    assert layer_of("placer.plan") < layer_of("placer.sim.simulator") < layer_of("placer.cli.core")
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("placer.somewhere_new")
