"""Model-pair presets: the models.toml shipped with the package, plus the user's own file
(~/.config/mlxspec/models.toml, or $MLXSPEC_MODELS), whose tables add or override ones of
the same name."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PresetError, UnknownPreset
from ..options import MOST_GAMMA

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BUILTIN = Path(__file__).parent / "models.toml"
ASSETS = Path(__file__).parents[1] / "assets"
_REQUIRED = ("target", "draft")


@dataclass(frozen=True)
class Preset:
    name: str
    target: str
    draft: str
    # where the hub cannot be reached: a registry package (pypi:NAME) or a .gguf file
    target_fallback: str | None = None
    gamma: int = 4
    ngram: bool = False  # prompt-lookup proposals beside the draft by default (--no-ngram: off)
    dflash: str | None = None  # a DFlash block drafter for the target, in place of the draft: --draft dflash
    raw: bool = False  # a base model: prompts are used as text, without the chat template
    tools: bool = False  # its chat template has a tool-call format mlx-lm reads (`serve` takes `tools`)
    memory_gb: float | None = None
    suits: tuple[str, ...] = ()
    description: str = ""
    source: str = field(default="", compare=False)

    @property
    def bundled(self) -> bool:
        return self.target.startswith("bundled:")


def user_file() -> Path:
    override = os.environ.get("MLXSPEC_MODELS")
    if override:
        return Path(override).expanduser()
    config_home = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return config_home / "mlxspec" / "models.toml"


def resolve_name(name: str) -> str:
    """A preset's model name as load_pair takes it: bundled:X is a folder in the package."""
    return str(ASSETS / name.removeprefix("bundled:")) if name.startswith("bundled:") else name


def shown_name(name: str) -> str:
    """A model's name as a user gives it: a bundled one as bundled:NAME, not its folder deep
    inside the installed package."""
    path = Path(name)
    return f"bundled:{path.name}" if path.is_absolute() and path.parent == ASSETS else name


def read_file(path: Path) -> dict[str, Preset]:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{path}: {e}") from None  # tomllib names the line and column
    except OSError as e:
        raise PresetError(f"cannot read {path}: {e.strerror}") from None
    presets = {}
    for name, table in data.items():
        if not isinstance(table, dict):
            raise PresetError(f"{path}: '{name}' must be a table ([{name}]) with target and draft")
        missing = [key for key in _REQUIRED if not isinstance(table.get(key), str)]
        if missing:
            raise PresetError(f"{path}: preset [{name}] needs {' and '.join(missing)} (a repo id or folder)")
        gamma = table.get("gamma", 4)
        if isinstance(gamma, bool) or not isinstance(gamma, int) or not 0 <= gamma <= MOST_GAMMA:
            raise PresetError(f"{path}: preset [{name}]: gamma must be a whole number from 0 to {MOST_GAMMA}")
        memory = table.get("memory_gb")
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0):
            raise PresetError(f"{path}: preset [{name}]: memory_gb must be a positive number")
        fallback = table.get("target_fallback")
        if fallback is not None and not isinstance(fallback, str):
            raise PresetError(f"{path}: preset [{name}]: target_fallback must be a string (pypi:NAME or a .gguf file)")
        dflash = table.get("dflash")
        if dflash is not None and not isinstance(dflash, str):
            raise PresetError(
                f"{path}: preset [{name}]: dflash must be a string (a DFlash drafter's repo id or folder)"
            )
        ngram = table.get("ngram", False)
        if not isinstance(ngram, bool):
            raise PresetError(f"{path}: preset [{name}]: ngram must be true or false")
        raw, tools = table.get("raw", False), table.get("tools", False)
        for key, value in (("raw", raw), ("tools", tools)):
            if not isinstance(value, bool):
                raise PresetError(f"{path}: preset [{name}]: {key} must be true or false")
        suits = table.get("suits", [])
        if not isinstance(suits, list) or not all(isinstance(s, str) for s in suits):
            raise PresetError(f"{path}: preset [{name}]: suits must be a list of strings")
        presets[name] = Preset(
            name=name,
            target=table["target"],
            draft=table["draft"],
            target_fallback=fallback,
            gamma=gamma,
            ngram=ngram,
            dflash=dflash,
            raw=raw,
            tools=tools,
            memory_gb=float(memory) if memory is not None else None,
            suits=tuple(suits),
            description=str(table.get("description", "")),
            source=str(path),
        )
    return presets


def load_presets() -> dict[str, Preset]:
    presets = read_file(BUILTIN)
    mine = user_file()
    if mine.exists():
        presets.update(read_file(mine))
    return presets


def find_preset(name: str) -> Preset:
    presets = load_presets()
    if name not in presets:
        raise UnknownPreset(f"no preset named {name!r}; known: {', '.join(sorted(presets))} (see `mlxspec models`)")
    preset = presets[name]
    names = {"target": resolve_name(preset.target), "draft": resolve_name(preset.draft)}
    return Preset(**{**preset.__dict__, **names, "dflash": preset.dflash and resolve_name(preset.dflash)})


def with_dflash() -> list[str]:
    """The presets that name a DFlash drafter (--pair NAME --draft dflash)."""
    return sorted(name for name, preset in load_presets().items() if preset.dflash)
