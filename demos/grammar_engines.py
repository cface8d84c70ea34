"""Mask time per token of llguidance and xgrammar, for one JSON schema on SmolLM2's tokenizer.

xgrammar 0.2.9 imports torch, so it is measured from a throwaway venv (never the project's):

    python -m venv /tmp/xg && /tmp/xg/bin/pip install xgrammar torch transformers
    /tmp/xg/bin/python demos/grammar_engines.py xgrammar
    python -m demos.grammar_engines llguidance          # the project's venv, mlxspec's bridge

Both read the same tokenizer.json, compile the schema of demos/grammar_cost.py with compact
separators, then walk one answer's ids five times, timing the mask and the advance.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

TOKENIZER = Path.home() / ".cache/mlxspec/models/SmolLM2-135M-Instruct.Q4_1-float32"
WIDTH = 49152
ANSWER = (
    '{"country":"France","capital":"Paris","population_millions":67.5,'
    '"languages":["French","Occitan and Breton"],"continent":"Europe"}'
)
PASSES = 5
SCHEMA = {
    "type": "object",
    "properties": {
        "country": {"type": "string"},
        "capital": {"type": "string"},
        "population_millions": {"type": "number"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "continent": {"enum": ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]},
    },
    "required": ["country", "capital", "population_millions", "languages", "continent"],
    "additionalProperties": False,
}


def xgrammar() -> dict:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER / "tokenizer.json"))
    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=WIDTH)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    bridged = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    done = time.perf_counter()
    ids = hf.encode(ANSWER, add_special_tokens=False)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    mask = advance = 0.0
    for _ in range(PASSES):
        matcher = xgr.GrammarMatcher(compiled)
        for token in ids:
            a = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            b = time.perf_counter()
            assert matcher.accept_token(token), token
            mask, advance = mask + b - a, advance + time.perf_counter() - b
    return report("xgrammar", bridged - start, done - bridged, mask, advance, len(ids))


def llguidance() -> dict:
    import numpy as np
    from llguidance import LLMatcher
    from mlx_lm.utils import load_tokenizer

    from mlxspec.grammar import GrammarSpec, bridge, compile_spec

    tokenizer = load_tokenizer(TOKENIZER)
    start = time.perf_counter()
    lltokenizer = bridge(tokenizer, width=WIDTH, eos_ids=frozenset({2}))
    bridged = time.perf_counter()
    matcher = LLMatcher(lltokenizer, compile_spec(GrammarSpec.json_schema(SCHEMA), lltokenizer))
    done = time.perf_counter()
    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    bits = np.empty(((WIDTH + 31) // 32,), dtype=np.int32)
    mask = advance = 0.0
    for _ in range(PASSES):
        matcher.reset()
        for token in ids:
            a = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            b = time.perf_counter()
            assert matcher.consume_token(token), token
            mask, advance = mask + b - a, advance + time.perf_counter() - b
    return report("llguidance", bridged - start, done - bridged, mask, advance, len(ids))


def report(name, bridge_s, compile_s, mask_s, advance_s, tokens) -> dict:
    n = PASSES * tokens
    row = {
        "engine": name,
        "tokenizer_ms": round(1e3 * bridge_s),
        "compile_ms": round(1e3 * compile_s, 1),
        "mask_us_per_token": round(1e6 * mask_s / n, 1),
        "advance_us_per_token": round(1e6 * advance_s / n, 1),
        "tokens": tokens,
    }
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    {"xgrammar": xgrammar, "llguidance": llguidance}[sys.argv[1] if len(sys.argv) > 1 else "llguidance"]()
