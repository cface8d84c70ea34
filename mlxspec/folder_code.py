"""A model folder is data, never code. transformers runs a folder's own Python when its
config.json or tokenizer_config.json names classes in `auto_map` (after asking on stdout,
which corrupts `--json`), and mlx-lm imports a config's `model_file`; mlxspec refuses such a
folder before either library reads it, and loads everything else with trust_remote_code off.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from .errors import ModelLoadError

# The keys by which a folder asks to run its own code: transformers' and mlx-lm's.
CODE_KEYS = {"config.json": ("auto_map", "model_file"), "tokenizer_config.json": ("auto_map",)}
# What mlxspec passes to AutoTokenizer.from_pretrained through mlx-lm's load.
TOKENIZER_OPTIONS = {"trust_remote_code": False}


class CustomCodeRefused(ModelLoadError):
    """A model folder that asks to run Python code of its own."""


def refuse_custom_code(folder: Path) -> None:
    """Raise CustomCodeRefused when the folder's config files ask for code of its own."""
    for file, keys in CODE_KEYS.items():
        try:
            data = json.loads((Path(folder) / file).read_text())
        except (OSError, ValueError):
            continue  # absent or unreadable: the loader's own checks say so
        asked = [key for key in keys if isinstance(data, dict) and data.get(key)]
        if asked:
            raise CustomCodeRefused(
                f"{Path(folder) / file} asks to run the folder's own Python code ({asked[0]}): "
                "mlxspec never runs code from a model folder"
            )


@contextlib.contextmanager
def quiet_stdout():
    """Whatever a library prints while loading goes to stderr: stdout is the command's
    output (`--json` must stay one parseable object)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield
