"""A request's `response_format` (chat, and text completions as vLLM takes it there), as
OpenAI shapes it, turned into the grammar the reply is held to (../grammar.py). Plain Python
(no MLX).

- `{"type": "text"}` (or none): no grammar.
- `{"type": "json_object"}`: any JSON object.
- `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`:
  JSON valid under the schema. `strict` changes nothing: the grammar is always enforced.

A schema the grammar engine cannot compile is a 400 naming it (checked in app.py against the
model's tokenizer, before the request queues).
"""

from __future__ import annotations

from ..errors import InvalidOption
from ..grammar import GrammarSpec
from .schema import ChatBody, CompletionBody, RequestError

PARAM = "response_format"


def response_grammar(body: ChatBody | CompletionBody) -> GrammarSpec | None:
    fmt = body.response_format
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError("response_format must be an object with a type", param=PARAM)
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind != "json_schema":
        raise RequestError(
            f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}", param=PARAM
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise RequestError(
            "response_format.json_schema must be {'name': ..., 'schema': {...}}", param=f"{PARAM}.json_schema"
        )
    name = spec.get("name")
    label = f"the JSON schema {name!r}" if isinstance(name, str) and name else "the JSON schema"
    try:
        return GrammarSpec.json_schema(spec["schema"], label=label)
    except InvalidOption as e:
        raise RequestError(str(e), param=f"{PARAM}.json_schema.schema") from None
