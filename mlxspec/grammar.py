"""Constrained decoding: a grammar (a JSON schema, a regex, Lark) decides which ids may come
next, and both the target and the draft only ever see the ids it allows.

Why speculative decoding stays exact under a grammar. Constrained decoding *defines* the
distribution at reply position t as

    p~_t = warp(logits_t with every id the matcher forbids in state s_t set to -inf)

where s_t is the matcher's state after the reply's ids before t: a function of the prefix
alone. Standard decoding draws from p~_t. Leviathan et al.'s rule (arXiv 2211.17192,
Algorithm 1; verify.py) asks of its target and draft distributions only that, at each
drafted position, both are distributions over the next id given the same prefix. So take
p~ as the target and q~_t = warp(draft logits_t masked by the same state s_t) as the draft:

- the draft's matcher advances through its own proposals, so drafted position i is masked by
  the state after the context and drafts 1..i-1, the very prefix the target is verified on
  there; the target's mask at each verify position (the bonus one included) is that state's;
- a drafted id was sampled from q~ and so is allowed; a proposal that is not sampled (prompt
  lookup) is cut before its first forbidden id, never sent to verify;
- the rule's accepted ids, recovered row norm(max(0, p~ - q~)) and bonus row p~_{n+1} then
  have, by the theorem, exactly the law of standard decoding under the grammar;
- after the round the matcher rolls back over the drafts and reads the ids emitted, so its
  state follows the ids kept (`Matcher.mark` / `rollback_to`).

At temperature 0 both sides take the argmax of masked logits: greedy ids are identical.
The mask goes on before warping (temperature, top-k, top-p, min-p) everywhere
(`sampling.constrain`). End of sequence is allowed only where the grammar accepts; once it
has stopped only end of sequence is, so a constrained reply ends when its grammar does.

The engine is llguidance (used by llama.cpp and vLLM): a grammar compiles in milliseconds
and a mask costs tens of microseconds, computed on the host while the device runs the
forward (docs/grammar.md has the measurements and why not xgrammar). This module holds no
MLX: masks are numpy booleans, applied by the callers.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from urllib.parse import unquote

import numpy as np

from .errors import InvalidOption
from .text import ascii_digits

KINDS = ("json_schema", "json_object", "regex", "lark", "llguidance")
# any JSON object: OpenAI's {"type": "json_object"}
JSON_OBJECT_SCHEMA = {"type": "object"}
# JSON written compactly ("," and ":", no whitespace outside strings): with whitespace left
# free, small models fill a reply with newlines until max tokens (measured on the bundled
# pair: 8 of 8 greedy replies); vLLM offers the same switch (disable_any_whitespace)
JSON_OPTIONS = {"whitespace_flexible": False}

# llguidance compiles a grammar by recursion, in Rust: measured on 1.9.1, 2 to 4 KiB of stack
# per level of a JSON schema's nesting (objects and arrays along a path, $refs followed) and
# 3 KiB per rule of a chained Lark grammar. A chain of 1,000 $defs (3,000 levels) overflowed
# a thread's 8 MiB stack, which kills the process: there is no error to catch. So every
# compile runs on a thread with COMPILE_STACK_BYTES of stack (address space, touched only as
# used), and what reaches it is bounded well inside that: MAX_SCHEMA_DEPTH levels need about
# 2 MiB (within even an 8 MiB stack), MAX_GRAMMAR_BYTES of Lark about 130 MiB (3 KiB per rule,
# and a chained rule fits in 6 bytes, "ab: ac"), so a shape these bounds do not foresee still
# has room. demos/hostile_server.py throws such shapes at the server.
COMPILE_STACK_BYTES = 512 << 20
MAX_SCHEMA_DEPTH = 512
MAX_GRAMMAR_BYTES = 256 << 10  # a Lark or llguidance grammar, or a regex, as text
# Before answering, the engine is walked from a reply's start through every id it allows
# where it allows at most START_BRANCHES, START_STEPS ids in all: enough to enter a recursive
# $ref, a pattern it cannot build or an object too wide for its parser, which it gives up on
# there (a grammar it would give up on only after the model's own choices still can, mid-reply)
START_STEPS = 32
START_BRANCHES = 4


@dataclass(frozen=True)
class GrammarSpec:
    """What a reply must match, as given: a plain value, compiled per tokenizer (`compile`)."""

    kind: str  # one of KINDS
    source: str  # the schema as JSON text, the regex, or the Lark (or llguidance) grammar
    label: str = ""  # how errors name it ("the JSON schema 'weather'", "--regex")

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidOption(f"a grammar's kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise InvalidOption("a grammar's source must be text")
        if self.kind in ("json_schema", "json_object"):
            check_schema_depth(_read_json(self.source, self.name), self.name)
        elif len(self.source.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
            raise InvalidOption(
                f"{self.name} is {len(self.source.encode('utf-8', 'surrogatepass')) >> 10} KiB: the grammar engine "
                f"takes at most {MAX_GRAMMAR_BYTES >> 10} KiB (it compiles by recursion, and a longer grammar could "
                "overflow its stack)"
            )

    @classmethod
    def json_schema(cls, schema: dict | str, *, label: str = "the JSON schema") -> GrammarSpec:
        if isinstance(schema, str):
            schema = _read_json(schema, label)
        if not isinstance(schema, (dict, bool)):
            raise InvalidOption(f"{label} must be a JSON object")
        if schema is False:
            raise InvalidOption(f"{label} is false, which no value matches")
        if schema is True:  # any JSON value; the engine takes only objects (its options go in one)
            schema = {}
        check_schema_depth(schema, label)  # before json.dumps, which recurses too
        return cls("json_schema", json.dumps(schema), label)

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object", json.dumps(JSON_OBJECT_SCHEMA), "a JSON object")

    @classmethod
    def grammar_file(cls, text: str, *, label: str = "the grammar") -> GrammarSpec:
        """A grammar file's text: llguidance's own JSON format ({"grammars": [...]}), else Lark."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and "grammars" in data:
            return cls("llguidance", text, label)
        return cls("lark", text, label)

    @property
    def name(self) -> str:
        return self.label or self.kind

    def describe(self) -> str:
        """One short line for the console and `--json` output."""
        names = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex"}
        return names.get(self.kind, "grammar")

    def llguidance_grammar(self) -> str:
        from llguidance import LLMatcher

        if self.kind in ("json_schema", "json_object"):
            try:
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            except ValueError as e:
                raise InvalidOption(f"{self.name} is not one the grammar engine accepts: {_first_line(e)}") from None
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "llguidance":
            return self.source
        return LLMatcher.grammar_from_lark(self.source)


def _read_json(text: str, label: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidOption(f"{label} is not JSON ({e})") from None
    except RecursionError:  # Python's reader recurses once per level
        raise InvalidOption(
            f"{label} nests deeper than {MAX_SCHEMA_DEPTH} levels, the most the grammar engine takes"
        ) from None


def check_schema_depth(schema, label: str) -> None:
    """InvalidOption naming `label` if `schema` nests deeper than MAX_SCHEMA_DEPTH."""
    depth = schema_depth(schema, limit=MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidOption(
            f"{label} nests deeper than {MAX_SCHEMA_DEPTH} levels (objects and arrays along a path, $refs "
            "followed): the grammar engine compiles by recursion, and a deeper schema could overflow its stack"
        )


def schema_depth(schema, *, limit: int | None = None) -> int:
    """The most objects and arrays nested along any path of `schema`, a local `$ref` ("#...")
    followed as if its target were written there; a reference back into its own path (a
    recursive schema) is not followed again. Iterative: a schema may nest past Python's
    recursion limit. Stops counting once past `limit`."""
    if not isinstance(schema, (dict, list)):
        return 0
    done: dict[int, int] = {}  # id(node) -> its depth
    path: list[tuple[object, object, int]] = [(schema, _children(schema, schema), 0)]  # (node, children, deepest)
    on_path = {id(schema)}
    while path:
        node, children, deepest = path[-1]
        child = next(children, None)
        if child is None:
            path.pop()
            on_path.discard(id(node))
            done[id(node)] = deepest + 1
            if path:
                parent, rest, best = path[-1]
                path[-1] = (parent, rest, max(best, deepest + 1))
            continue
        if id(child) in done:
            path[-1] = (node, children, max(deepest, done[id(child)]))
        elif id(child) not in on_path:
            if limit is not None and len(path) > limit:
                return len(path) + 1
            on_path.add(id(child))
            path.append((child, _children(child, schema), 0))
    return done[id(schema)]


def _children(node, root):
    """The objects and arrays inside `node`, and the target of its local `$ref`."""
    values = node.values() if isinstance(node, dict) else node
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        target = _pointer(root, node["$ref"])
        if target is not None:
            yield target
    for value in values:
        if isinstance(value, (dict, list)):
            yield value


def _pointer(root, ref: str):
    """The object or array a local reference ("#", "#/$defs/a") names, else None."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:] if ref[1:] else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and ascii_digits(part) and int(part) < len(node):  # not "²"
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, (dict, list)) else None


def on_compile_stack(fn, /, *args, **kwargs):
    """`fn(*args, **kwargs)` on a thread with COMPILE_STACK_BYTES of stack (where the grammar
    engine's recursion has room), waited for; its result, or what it raised."""
    if threading.current_thread().name == _COMPILE_THREAD:
        return fn(*args, **kwargs)
    box: dict[str, object] = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    with _STACK_SIZE:  # the size is the process's setting for new threads: set it back at once
        try:
            previous = threading.stack_size(COMPILE_STACK_BYTES)
        except (ValueError, RuntimeError):  # a platform that cannot set it: the bounds alone hold
            return fn(*args, **kwargs)
        try:
            thread = threading.Thread(target=run, name=_COMPILE_THREAD, daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


_COMPILE_THREAD = "mlxspec-grammar-compile"
_STACK_SIZE = threading.Lock()


def _first_line(error, limit: int = 240) -> str:
    """An engine's message on one line (its parse errors span several), cut to `limit`."""
    text = " ".join(line.strip() for line in str(error).strip().splitlines() if line.strip())
    text = text or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


_BRIDGES: dict[int, tuple[object, object]] = {}  # id(tokenizer) -> (tokenizer, LLTokenizer)


def bridge(tokenizer, *, width: int, eos_ids: frozenset[int]):
    """The llguidance tokenizer for an mlx-lm TokenizerWrapper (its Hugging Face fast tokenizer
    serialised to tokenizer.json, as llguidance.hf does), `width` ids wide (the target's
    logits: ids past the tokenizer's own are never allowed). Built once per tokenizer (~1 s)."""
    key = id(tokenizer)
    cached = _BRIDGES.get(key)
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    from copy import copy

    from llguidance import LLTokenizer

    fast = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(fast, "backend_tokenizer", None)
    if backend is None:
        raise InvalidOption("constrained decoding needs a fast (tokenizer.json) tokenizer, and this model has none")
    backend = copy(backend)
    backend.no_padding()
    backend.no_truncation()
    eos = sorted(eos_ids) or None
    try:
        built = LLTokenizer(backend.to_str(), n_vocab=max(width, backend.get_vocab_size()), eos_token=eos)
    except Exception as e:  # llguidance cannot read this tokenizer's pieces
        raise InvalidOption(f"the grammar engine cannot read this model's tokenizer: {_first_line(e)}") from None
    _BRIDGES[key] = (tokenizer, built)
    return built


def compile_spec(spec: GrammarSpec, tokenizer) -> str:
    """The llguidance grammar for `spec`, checked against `tokenizer` (an LLTokenizer):
    InvalidOption naming the spec if the engine rejects it. Compiled on a big stack."""
    return on_compile_stack(_compile, spec, tokenizer)


def _compile(spec: GrammarSpec, tokenizer) -> str:
    from llguidance import LLMatcher

    grammar = spec.llguidance_grammar()
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if failed:
        raise InvalidOption(f"{spec.name} is not one the grammar engine accepts: {_first_line(messages[0])}")
    return grammar


class Matcher:
    """One reply's grammar state, following the ids the reply keeps.

    `allowed()` is the mask of the current state (cached per depth: the draft computes it at
    each drafted position and the verify reads the same arrays back); `consume`/`rollback_to`
    move the state; `trail(mark)` is the stack of masks from a mark to now, the rows the
    target is verified with."""

    def __init__(self, tokenizer, grammar: str, *, width: int):
        from llguidance import LLMatcher

        self.width = width
        self._matcher = on_compile_stack(LLMatcher, tokenizer, grammar, log_level=0)  # compiles it again
        if self._matcher.is_error():
            raise InvalidOption(f"the grammar engine rejected the grammar: {_first_line(self._matcher.get_error())}")
        self._words = (tokenizer.vocab_size + 31) // 32
        self._ids: list[int] = []  # the ids consumed
        # whether llguidance recorded each: an id read once the grammar has stopped (end of
        # sequence again, drafted past the end) is not, and a rollback must not count it
        self._recorded: list[bool] = []
        self._masks: dict[int, np.ndarray] = {}  # depth -> allowed ids there (width,) bool

    @property
    def depth(self) -> int:
        return len(self._ids)

    def allowed(self) -> np.ndarray:
        """(width,) bool: the ids allowed next."""
        depth = len(self._ids)
        mask = self._masks.get(depth)
        if mask is None:
            mask = self._masks[depth] = self._compute_mask()
        return mask

    def _compute_mask(self) -> np.ndarray:
        bits = np.empty((self._words,), dtype=np.int32)
        self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        self._check_engine()  # in error, llguidance's mask is end of sequence alone: a silent cut
        mask = np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.width].astype(bool)
        if mask.shape[0] < self.width:
            mask = np.concatenate([mask, np.zeros(self.width - mask.shape[0], dtype=bool)])
        return mask

    def allowed_after(self, ids) -> np.ndarray | None:
        """(width,) bool: the ids allowed after reading `ids` from the current state (a tree
        node's path), the state left as it was; None where the grammar refuses the path."""
        mark = len(self._ids)
        try:
            if self.walk(ids) < len(ids):
                return None
            return self.allowed() if not ids else self._compute_mask()
        finally:
            self.rollback_to(mark)

    def tree_masks(self, tree) -> np.ndarray:
        """(1 + len(tree), width) bool: the masks after the root (the current state) and after
        each node's path (a TokenTree), for the target's rows. A node the grammar refuses is
        never reached (its parent's row forbids it): its row is left open, so that the
        arithmetic stays free of 0/0."""
        rows = np.ones((1 + len(tree), self.width), dtype=bool)
        rows[0] = self.allowed()
        for node in range(1, len(tree) + 1):
            mask = self.allowed_after(tree.path_ids(tree.ancestors(node)))
            if mask is not None and mask.any():
                rows[node] = mask
        return rows

    def consume(self, token: int) -> None:
        """Read one id the grammar allows (callers only pass such ids)."""
        recorded = not self._matcher.is_stopped()
        mask = self._masks.get(len(self._ids))
        if not self._matcher.consume_token(int(token)):
            if mask is not None and mask[int(token)]:  # its own mask allowed it: the engine gave up
                self._check_engine()
            raise RuntimeError(f"the grammar refused id {token}: {self._matcher.get_error()}")
        self._ids.append(int(token))
        self._recorded.append(recorded)

    def consume_all(self, ids) -> None:
        for token in ids:
            self.consume(token)

    def walk(self, ids) -> int:
        """Read the longest prefix of `ids` the grammar allows, one id at a time (computing
        the mask at each position, which the verify reuses); returns how many were read."""
        for i, token in enumerate(ids):
            if not self.allowed()[token]:
                return i
            self.consume(token)
        return len(ids)

    def trail(self, mark: int) -> np.ndarray:
        """(depth - mark + 1, width) bool: the masks at each position from `mark` to now."""
        here = len(self._ids)
        rows = [self.allowed() if depth == here else self._masks[depth] for depth in range(mark, here + 1)]
        # a state that allows nothing comes only after end of sequence, whose row is never
        # emitted: left unmasked, it keeps the arithmetic free of 0/0
        return np.stack([row if row.any() else np.ones_like(row) for row in rows])

    def _check_engine(self) -> None:
        """The engine gave up on the reply (a grammar too ambiguous for its limits, most
        often): one line naming why, not a reply ended as if the grammar were done."""
        if self._matcher.is_error():
            raise InvalidOption(
                f"the grammar engine gave up after {len(self._ids)} ids of the reply: "
                f"{_first_line(self._matcher.get_error().split('<state>')[0])}"
            )

    def check_start(self, name: str) -> None:
        """InvalidOption naming the grammar if the engine gives up at the reply's start: at
        its first mask, or on an id it allows from there where it allows only a few (a
        recursive $ref that must be entered, a pattern too large to build, an object too wide
        for its parser), up to START_STEPS ids read. Walked on copies: this matcher is left
        at the start."""
        bits = np.empty((self._words,), dtype=np.int32)
        frontier, read = [self._matcher.deep_copy()], 0
        while frontier and read < START_STEPS:
            probe = frontier.pop()
            probe.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.width])
            if probe.is_error():
                _gave_up(name, probe)
            if probe.is_stopped() or len(allowed) > START_BRANCHES:
                continue
            for token in allowed[: START_STEPS - read]:
                branch = probe.deep_copy()
                read += 1
                if not branch.consume_token(int(token)):
                    _gave_up(name, branch)
                frontier.append(branch)

    def rollback_to(self, mark: int) -> None:
        """Back to the state after the first `mark` ids (a matcher in error, whose reply is
        over, only forgets them: llguidance cannot roll one back)."""
        extra = sum(self._recorded[mark:])
        if extra > 0 and not self._matcher.is_error() and not self._matcher.rollback(extra):
            error = self._matcher.get_error()
            if "rollback not supported" in error:  # a Lark lexeme with stop= or max_tokens=
                raise InvalidOption(
                    "the grammar engine cannot take back ids read under this grammar "
                    f"({_first_line(error.split('<state>')[0])}), and speculative decoding takes back the drafts "
                    "it rejects: decode with gamma 0, or write the grammar without stop= and max_tokens="
                )
            raise RuntimeError(f"the grammar could not roll back: {error}")
        del self._ids[mark:], self._recorded[mark:]
        for depth in [d for d in self._masks if d > mark]:
            del self._masks[depth]

    def settle(self, mark: int, emitted) -> None:
        """After a round: back to `mark`, read what was emitted, forget the masks behind.
        The accepted drafts are already read (the same ids from the same state): only what
        follows them is rolled back and read again, so each emitted id is read by the engine
        once and, like every id, against a mask computed for its position."""
        drafted, emitted = self._ids[mark:], [int(token) for token in emitted]
        kept = 0
        while kept < min(len(drafted), len(emitted)) and drafted[kept] == emitted[kept]:
            kept += 1
        self.rollback_to(mark + kept)
        self.consume_all(emitted[kept:])
        self.forget_below(len(self._ids))

    def forget_below(self, depth: int) -> None:
        for old in [d for d in self._masks if d < depth]:
            del self._masks[old]

    @property
    def accepting(self) -> bool:
        return self._matcher.is_accepting()

    @property
    def stopped(self) -> bool:
        return self._matcher.is_stopped()


def _gave_up(name: str, matcher) -> None:
    reason = _first_line(matcher.get_error().split("<state>")[0])
    raise InvalidOption(f"{name} is not one the grammar engine accepts: it gives up at the start of a reply ({reason})")


def matcher_for(spec: GrammarSpec, tokenizer, *, width: int, eos_ids: frozenset[int]) -> Matcher:
    """A fresh matcher for one reply, checked to start (InvalidOption naming `spec` if the
    engine rejects the grammar or gives up at its start)."""
    lltokenizer = bridge(tokenizer, width=width, eos_ids=eos_ids)
    return on_compile_stack(_started, spec, lltokenizer, width)


def _started(spec: GrammarSpec, lltokenizer, width: int) -> Matcher:
    matcher = Matcher(lltokenizer, _compile(spec, lltokenizer), width=width)
    matcher.check_start(spec.name)
    return matcher


def check_spec(spec: GrammarSpec, tokenizer, *, width: int, eos_ids: frozenset[int]) -> None:
    """Raise InvalidOption naming `spec` if the engine rejects it or gives up at its start
    (the server's 400, before the request queues)."""
    matcher_for(spec, tokenizer, width=width, eos_ids=eos_ids)
