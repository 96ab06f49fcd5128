"""The import graph, measured: no import circle among the project's modules, and the server
loads none of indexer's write side (issue 38).

Cycles are found in grimp's graph of models, indexer, service and probsearch, which records
every import statement, those inside functions and under TYPE_CHECKING included, so an import
moved into a function still counts. The write side is the list in pyproject.toml's lint-imports
contract (lint-imports checks it statically); here the server's modules are also counted at run
time.
"""

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

PACKAGES = ("models", "indexer", "service", "probsearch")
SERVER = "service.http.main"
WRITE_SIDE_CONTRACT = "The server imports none of indexer's write side"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def write_side() -> set[str]:
    """indexer's write-side modules, as the lint-imports contract lists them."""
    config = tomllib.loads(PYPROJECT.read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"] == WRITE_SIDE_CONTRACT]
    return set(contract["forbidden_modules"])


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of two or more modules that import each other round a circle (Tarjan)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]  # (module, next edge to follow): iterative, no recursion limit
        while work:
            module, edge = work.pop()
            if edge == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            if edge < len(edges[module]):
                work.append((module, edge + 1))
                target = edges[module][edge]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            if work:  # done with `module`: its caller takes its low link
                caller = work[-1][0]
                low[caller] = min(low[caller], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_the_cycle_finder_finds_each_circle() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"),
                               ("e", "d"), ("e", "f"), ("g", "g")]:  # fmt: skip
        graph.add_import(importer=f"p.{importer}", imported=f"p.{imported}")
    assert sorted(strongly_connected(graph)) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]


def test_no_module_imports_itself_round_a_circle(graph: grimp.ImportGraph) -> None:
    assert strongly_connected(graph) == []


def test_the_server_statically_reaches_none_of_the_write_side(graph: grimp.ImportGraph) -> None:
    reached = graph.find_upstream_modules(SERVER)
    assert sorted(reached & write_side()) == []
    assert "indexer.store" in reached  # it does read index versions


def test_the_server_loads_none_of_the_write_side() -> None:
    code = f"import sys, {SERVER}; print(*sorted(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert sorted(set(done.stdout.split()) & write_side()) == []
