"""The house's one-way imports, checked: the packages stand in layers and every import runs
down (or stays on its floor), no modules or packages import each other in a circle, views
and the plain-value modules never import MLX (so a view is a function of plain state), and
the command line loads MLX only when a command runs (so --help is fast)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "mlxspec"

# From the top floor down: a module may import its own floor's and the floors below. A
# floor is a package of mlxspec or a module at its top (the part of a name after
# "mlxspec."); mlxspec/__init__.py, the public API's lazy face, imports nothing itself.
LAYERS = [
    ["__main__", "cli"],  # the commands (blas: only the command re-executes under OpenBLAS)
    ["server"],
    ["views"],  # rich renderables, never MLX
    ["measure"],  # bench, costs, peers, prompts, race, sides: they run the API
    ["generation", "chat", "batching"],  # the API: stream, generate, Session; a conversation; many at once
    ["prompt_cache", "training"],  # prompt caches in files; distilling heads
    ["models"],  # loading, pairs, presets, imports, memory, the drafter kinds' registry
    ["distributed"],  # the target split across ranks (models load a share of it)
    ["drafters"],  # one module per kind; the step loop they share
    ["drafting"],  # the policy: plans, the controller, the cost model (pure Python)
    ["options"],  # Options, Auto
    ["decoding"],  # the core: engine, rounds, the rule, sampling, cursors, caches, events
    ["grammar", "tool_calls", "folder_code", "stats", "text", "errors"],
]
FLOOR = {part: floor for floor, parts in enumerate(LAYERS) for part in parts}

PLAIN = [
    "mlxspec.views",
    "mlxspec.measure.sides",
    "mlxspec.stats",
    "mlxspec.options",
    "mlxspec.drafting",
    "mlxspec.drafting.theory",
    "mlxspec.drafters",
    "mlxspec.decoding",
    "mlxspec.decoding.events",
    "mlxspec.decoding.plan",
    "mlxspec.decoding.cache_options",
    "mlxspec.distributed.ranks",
    "mlxspec.cli",
    "mlxspec.server.schema",
    "mlxspec.server.limits",
    "mlxspec.server.length",
    "mlxspec.server.offload",
    "mlxspec.server.protocol",
    "mlxspec.server.tools",
    "mlxspec.tool_calls",
]


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its dotted name, its file, whether it is a package."""
    found = {}
    for file in PACKAGE.rglob("*.py"):
        parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (file, package)
    return found


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's modules: at its top, inside functions, or
    for type checking alike (each is a dependency), `from P import M` naming module P.M."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, (file, package) in known.items():
        here = name.split(".") if package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    graph[name].add(target)
    return graph


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_part_has_a_floor():
    parts = {part_of(name) for name in modules()} - {"__init__"}
    assert sorted(parts - set(FLOOR)) == []


def test_no_module_imports_itself_in_a_circle():
    assert circles(imports()) == []


def test_no_package_imports_itself_in_a_circle():
    graph: dict[str, set[str]] = {}
    for module, targets in imports().items():
        graph.setdefault(part_of(module), set()).update(part_of(t) for t in targets if part_of(t) != part_of(module))
    assert circles(graph) == []


def test_every_import_runs_down():
    up = [
        f"{module} -> {target}"
        for module, targets in imports().items()
        for target in targets
        if "__init__" not in (part_of(module), part_of(target)) and FLOOR[part_of(target)] < FLOOR[part_of(module)]
    ]
    assert sorted(up) == []


def test_the_check_sees_a_circle_and_an_import_up():
    """The negative control: a made-up graph with both is caught."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert part_of("mlxspec.decoding.rounds") == "decoding" and FLOOR["decoding"] > FLOOR["drafters"]


def test_the_top_of_the_package_holds_few_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


MOST_POSITIONAL = 6  # beyond this a call reads as a row of values: name them (keyword-only)


def many_positional(source: str) -> list[str]:
    """Functions of `source` taking more than MOST_POSITIONAL positional parameters (self and
    cls not counted)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
            if len(names) > MOST_POSITIONAL:
                found.append(f"{node.name}:{node.lineno}")
    return found


def test_no_function_takes_more_than_six_positional_parameters():
    over = [f"{name} {where}" for name, (file, _) in modules().items() for where in many_positional(file.read_text())]
    assert over == []
    # the negative control
    assert many_positional("def f(a, b, c, d, e, g, h): pass\ndef k(a, *, b, c, d, e, g, h): pass") == ["f:1"]


def imported_mlx(modules: list[str]) -> list[str]:
    code = (
        "import importlib, pkgutil, sys\n"
        "import mlxspec.views as views\n"
        "for m in pkgutil.iter_modules(views.__path__): importlib.import_module('mlxspec.views.' + m.name)\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(' '.join(sorted(k for k in sys.modules if k.split('.')[0] in ('mlx', 'mlx_lm'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_views_and_plain_modules_never_import_mlx():
    assert imported_mlx(PLAIN) == []


def test_help_does_not_load_mlx():
    code = "import sys\nfrom mlxspec.cli import app\nprint(any(k.split('.')[0] == 'mlx' for k in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
