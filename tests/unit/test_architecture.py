"""The house's rules about who imports whom, checked on the real import graph (grimp).

- No import circle anywhere in ``fleet``.
- The driver side (API, CLI, campaigns, chains) never imports worker code: what a workload spec *is* lives in
  ``fleet.spec``; what a worker *does* with it lives in ``fleet.workers``.
- Workers never import the driver, the API or the CLI.
- Search strategies are plain Python: neither Celery nor the store.
- The store knows no Celery, no campaign and no CLI.
- The layers, lowest first: foundations < store < space < search < a campaign's rules < domain libraries < spec <
  workers < tasks < driving < domain applications < results < api < bench < cli.
"""

from __future__ import annotations

import grimp
import pytest

GRAPH = grimp.build_graph("fleet", include_external_packages=True)
DRIVER_SIDE = [
    "fleet.driving.campaign",
    "fleet.driving.chains",
    "fleet.spec",
    "fleet.search",
    "fleet.replay",
    "fleet.store",
]
# Who may import worker code at all: the tasks that run it, the embedded fleet and `fleet worker` that start
# worker processes, and benchmarks that time it.
WORKER_IMPORTERS = ("fleet.workers", "fleet.tasks", "fleet.local", "fleet.cli", "fleet.bench")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    modules = sorted(m for m in graph.modules if m == "fleet" or m.startswith("fleet."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c.startswith("fleet")), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_there_is_no_import_circle() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("fleet", "fleet.a", "fleet.b", "fleet.c"):
        graph.add_module(module)
    graph.add_import(importer="fleet.a", imported="fleet.b")
    graph.add_import(importer="fleet.b", imported="fleet.c")
    graph.add_import(importer="fleet.c", imported="fleet.a")
    assert _cycles(graph) == [["fleet.a", "fleet.b", "fleet.c"]]


def _chain(importer: str, imported: str) -> tuple[str, ...] | None:
    chain = GRAPH.find_shortest_chain(importer=importer, imported=imported, as_packages=True)
    return tuple(chain) if chain else None


@pytest.mark.parametrize("importer", DRIVER_SIDE)
def test_the_driver_side_never_imports_worker_code(importer: str) -> None:
    assert _chain(importer, "fleet.workers") is None


def test_only_tasks_launchers_and_benchmarks_import_worker_code() -> None:
    importers = {
        importer
        for module in GRAPH.find_descendants("fleet.workers") | {"fleet.workers"}
        for importer in GRAPH.find_modules_that_directly_import(module)
    }
    assert sorted(m for m in importers if not m.startswith(WORKER_IMPORTERS)) == []


@pytest.mark.parametrize(
    "imported", ["fleet.driving.campaign", "fleet.driving.chains", "fleet.api", "fleet.cli", "fleet.local"]
)
def test_workers_never_import_the_driver(imported: str) -> None:
    assert _chain("fleet.workers", imported) is None


@pytest.mark.parametrize("imported", ["celery", "kombu", "sqlalchemy", "fleet.store", "fleet.tasks"])
def test_search_imports_neither_celery_nor_the_store(imported: str) -> None:
    assert _chain("fleet.search", imported) is None


@pytest.mark.parametrize(
    "imported", ["celery", "kombu", "fleet.tasks", "fleet.driving.campaign", "fleet.cli", "fleet.api"]
)
def test_the_store_knows_no_celery_and_no_driver(imported: str) -> None:
    assert _chain("fleet.store", imported) is None


@pytest.mark.parametrize("imported", ["fleet.cli", "fleet.api"])
def test_nothing_below_the_cli_and_api_imports_them(imported: str) -> None:
    for module in (
        "fleet.driving.campaign",
        "fleet.driving.chains",
        "fleet.store",
        "fleet.search",
        "fleet.tasks",
        "fleet.workers",
    ):
        assert _chain(module, imported) is None, module


# Each domain package (tvm, tuna, interop, ops, miopen) has two halves. Its application half runs trials on the
# fleet (a TVM model's tuning, MetaSchedule's runner, an ad-hoc call) or shows campaigns as Optuna does (its
# storage, export and dashboard, which read a campaign's objectives from its spec): it sits above the driver. The
# rest, its library half (formats, operators, MIOpen's databases, results imported into the store), sits below the
# spec, which builds on it.
DOMAIN = ("fleet.tvm", "fleet.tuna", "fleet.interop", "fleet.ops", "fleet.miopen")
APPLICATIONS = (
    "fleet.tvm.tune",
    "fleet.tvm.metaschedule",
    "fleet.ops.call",
    "fleet.interop.optuna_storage",
    "fleet.interop.optuna_export",
    "fleet.interop.dashboard",
)
LIBRARIES = tuple(sorted(m for p in DOMAIN for m in GRAPH.find_descendants(p) if m not in APPLICATIONS))
# Each layer imports only those below it (issue 45), highest first. Every module of fleet has its layer (a
# domain package's own module, which only gathers its halves' names, and the fleet package itself excepted).
LAYERS = [
    ("fleet.cli",),
    ("fleet.bench",),
    ("fleet.api",),
    ("fleet.report", "fleet.export", "fleet.diagnose"),
    APPLICATIONS,
    ("fleet.driving",),
    ("fleet.tasks", "fleet.local"),
    ("fleet.workers",),
    ("fleet.spec",),
    LIBRARIES,
    ("fleet.targets", "fleet.keys", "fleet.limits", "fleet.provenance", "fleet.messages"),  # a campaign's rules
    ("fleet.search", "fleet.replay", "fleet.space_files", "fleet.fronts"),
    ("fleet.space",),
    ("fleet.store", "fleet.glance"),
    (  # the foundations: settings, states, errors and the small modules everything uses
        "fleet.settings",
        "fleet.celery_app",
        "fleet.services",
        "fleet.states",
        "fleet.errors",
        "fleet._version",
        "fleet.canonical",
        "fleet.clock",
        "fleet.schema",
        "fleet.expr",
        "fleet.extras",
        "fleet.trust",
        "fleet.bundle",
        "fleet.labels",
        "fleet.files",
        "fleet.objective",
        "fleet.lazy",
        "fleet.collector",
    ),
]


def test_each_layer_imports_only_those_below_it() -> None:
    layers = [grimp.Layer(*names, independent=False) for names in LAYERS]
    found = GRAPH.find_illegal_dependencies_for_layers(layers=layers)
    assert sorted((d.importer, d.imported) for d in found) == []


def test_every_module_has_its_layer() -> None:
    placed = {m for names in LAYERS for name in names for m in GRAPH.find_descendants(name) | {name}}
    modules = {m for m in GRAPH.modules if m.startswith("fleet.")}
    assert sorted(modules - placed - set(DOMAIN)) == []


def test_no_function_runs_to_80_lines_but_a_migration() -> None:
    """Long functions read as steps with names (issue 45); a migration is one schema change, written out whole."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "fleet"
    long = [
        f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(package.rglob("*.py"))
        if "migrations" not in path.parts
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (node.end_lineno or 0) - node.lineno + 1 >= 80
    ]
    assert long == []
