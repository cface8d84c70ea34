"""The house's one-way imports, checked: views and the plain-value modules never import MLX
(so a view is a function of plain state), and the command line loads MLX only when a
command runs (so --help is fast)."""

from __future__ import annotations

import subprocess
import sys

PLAIN = [
    "mlxspec.views",
    "mlxspec.measure.sides",
    "mlxspec.stats",
    "mlxspec.options",
    "mlxspec.drafting",
    "mlxspec.drafting.theory",
    "mlxspec.decoding.events",
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
