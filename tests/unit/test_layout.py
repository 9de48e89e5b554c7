"""The layout's rules: which rooms (packages) may import which, no import
cycles between modules, and a lane worker never loads a faust app.

A room is ``schemas``, ``workers``, or a package (or top-level module) of
``streams``: ``streams.classify``, ``streams.ops``, ... Imports are read
with ``ast`` from the source tree, those inside functions included (a lazy
import is still a dependency); those under ``if TYPE_CHECKING:`` are names
for annotations only and are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "streams", "workers")

ALLOWED: dict[str, frozenset[str]] = {
    room: frozenset(deps)
    for room, deps in {
        # The wire: imports nothing of ours.
        "schemas": (),
        # What routing decisions are made of, shared by every room below.
        "streams.routing": ("schemas",),
        "streams.ops": ("schemas",),
        "streams.chunks": ("schemas",),
        "streams.kafka": ("schemas",),
        "streams.stores": ("schemas", "streams.ops", "streams.routing"),
        "streams.rules": ("schemas", "streams.stores"),
        # Batch jobs keep their state in Redis the way the stores do (keyspace, rounds).
        "streams.jobs": ("schemas", "streams.ops", "streams.stores"),
        "streams.client": ("schemas", "streams.chunks", "streams.jobs"),
        "streams.cache": ("schemas", "streams.client", "streams.ops", "streams.stores"),
        # The roll-out never imports the classifier; the classifier reads it.
        "streams.rollout": ("schemas", "streams.routing", "streams.stores"),
        # Distillation fits what the classifier loads; the classifier never imports it.
        "streams.distill": ("schemas", "streams.routing", "streams.rules"),
        # Lane workers: never a faust app (classify, quality).
        "workers": (
            "schemas",
            "streams.cache",
            "streams.kafka",
            "streams.ops",
            "streams.routing",
            "streams.rules",
            "streams.stores",
        ),
        "streams.classify": (
            "schemas",
            "streams.cache",
            "streams.kafka",
            "streams.ops",
            "streams.rollout",
            "streams.routing",
            "streams.rules",
            "streams.stores",
            "workers",  # workers.models: where a tokenizer's GGUF file is
        ),
        "streams.quality": (
            "schemas",
            "streams.cache",
            "streams.classify",
            "streams.kafka",
            "streams.ops",
            "streams.rollout",
            "streams.routing",
            "streams.stores",
        ),
        # The HTTP door: the SDK's client, batch jobs (the Batch API), the
        # roll-out board (/v1/models), the stores' fail-open (shared limits)
        # and the trace spans every process exports (streams.kafka: otlp,
        # tracing, spans; it imports only schemas).
        "streams.gateway": (
            "schemas",
            "streams.chunks",
            "streams.client",
            "streams.jobs",
            "streams.kafka",
            "streams.ops",
            "streams.rollout",
            "streams.routing",
            "streams.stores",
        ),
        "streams.doctor": (
            "schemas",
            "streams.distill",
            "streams.rollout",
            "streams.routing",
            "streams.rules",
            "streams.stores",
        ),
        "streams": (),  # the package itself
    }.items()
}
"""Per room, the other rooms it may import."""

ENTRY_ROOMS = frozenset({"streams.cli", "streams.bench", "streams.devstack", "streams.top"})
"""Rooms that start things (the CLI, the benches, the dev supervisor, the
live terminal view): they may import any room, and no room imports them but
another entry room."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "streams" and len(parts) > 1 else parts[0]


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(node: ast.AST) -> Iterator[str]:
    """The dotted names ``node`` and what it holds import at run time."""
    if isinstance(node, ast.If) and _under_type_checking(node):
        for child in node.orelse:
            yield from _imported(child)
        return
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names)
    for child in ast.iter_child_nodes(node):
        yield from _imported(child)


def import_graph() -> dict[str, set[str]]:
    """Per module of ours, the modules of ours it imports."""
    files = {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {name for name in _imported(tree) if name in files} - {module}
    return graph


def test_every_room_is_in_the_table() -> None:
    rooms = {room_of(module) for module in import_graph()}
    unknown = rooms - set(ALLOWED) - ENTRY_ROOMS
    assert not unknown, f"rooms with no rule in ALLOWED or ENTRY_ROOMS: {sorted(unknown)}"


def test_rooms_import_only_what_the_table_allows() -> None:
    broken = []
    for module, imports in sorted(import_graph().items()):
        room = room_of(module)
        if room in ENTRY_ROOMS:
            continue
        for target in sorted(imports):
            other = room_of(target)
            if other == room:
                continue
            if other in ENTRY_ROOMS:
                broken.append(f"{module} -> {target} (nothing imports an entry room)")
            elif other not in ALLOWED.get(room, frozenset()):
                broken.append(f"{module} -> {target} ({room} may not import {other})")
    assert not broken, "imports the layout does not allow:\n" + "\n".join(broken)


def test_no_import_cycles_between_modules() -> None:
    graph = import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from streams.a import A\nelse:\n    import streams.b\n"
        "def f():\n    from streams.c import C\n"
    )
    names = set(_imported(tree))
    assert {"streams.b", "streams.c", "streams.c.C"} <= names
    assert "streams.a" not in names


def test_workers_do_not_load_faust() -> None:
    code = (
        "import sys, workers.lane_worker, workers.serve, workers.retry;"
        "loaded = sorted(m for m in sys.modules if m == 'faust' or m.startswith('faust.'));"
        "print(loaded[:3]); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"workers load faust: {done.stdout} {done.stderr[-2000:]}"
