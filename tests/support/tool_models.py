"""Tiny qwen3 models whose tokenizers carry real families' tool-call markup, trained here for a
few seconds to answer fixed conversations with fixed replies (tool calls among them): a
random model never writes a call, so these are taught to, and the server then parses calls
out of text the engine really generated.

The templates (chat_templates/): Qwen3's chat template (Qwen/Qwen3-*, tokenizer_config.json:
Hermes-style `<tool_call>` JSON, for which mlx-lm infers its json_tools parser) and a Mistral
v0.3-style template, shortened to the parts these tests use (`[AVAILABLE_TOOLS]`, `[INST]`,
`[TOOL_CALLS]` JSON, `[TOOL_RESULTS]`; mlx-lm infers its mistral parser), and Qwen3-Coder's,
shortened likewise (calls as XML, `<tool_call>\n<function=NAME>\n<parameter=KEY>`, for which
mlx-lm infers its qwen3_coder parser).
"""

from __future__ import annotations

import json
from pathlib import Path

from mlxspec.models import synthetic

TEMPLATES = Path(__file__).parent / "chat_templates"

QWEN3_TEMPLATE = (TEMPLATES / "qwen3.jinja").read_text()

MISTRAL_TEMPLATE = (TEMPLATES / "mistral.jinja").read_text()

QWEN3_CODER_TEMPLATE = (TEMPLATES / "qwen3_coder.jinja").read_text()

QWEN3_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN3_CODER_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
MISTRAL_MARKERS = ["[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]"]


def tool_tokenizer(base: Path, out: Path, *, template: str, markers: list[str]) -> Path:
    """`base`'s tokenizer with the family's markers as added tokens (not special: decoded as
    text, as Qwen3's are) and the family's chat template."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in markers])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_bytes((base / "special_tokens_map.json").read_bytes())
    return out


def build_tool_model(base_tokenizer: Path, out: Path, *, template: str, markers: list[str], eos_ids: list[int]):
    tokenizer_dir = tool_tokenizer(
        base_tokenizer, out.parent / f"{out.name}-tokenizer", template=template, markers=markers
    )
    synthetic.build_model("qwen3", out, tokenizer_dir=tokenizer_dir, seed=3, eos_token_ids=eos_ids)
    return out


def teach(
    folder: Path, examples: list[tuple[list[int], str]], *, end: str, max_steps: int = 400, target_loss: float = 0.01
):
    """Train the model in `folder` until it answers each prompt (ids) with its reply (text,
    then the token `end`, an end-of-sequence) and save it there: the mean loss below
    `target_loss` and every reply id the argmax where it stands (a mean alone once left one
    lesson's first id to another token, on a machine whose stdlib gave another tokenizer).
    Returns the last loss."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import mlx_lm
    from mlx_lm.utils import save_model

    model, tokenizer = mlx_lm.load(str(folder))
    eos = tokenizer.convert_tokens_to_ids(end)
    assert eos in tokenizer.eos_token_ids, f"{end} does not end a generation"
    rows = [(prompt, tokenizer.encode(reply, add_special_tokens=False) + [eos]) for prompt, reply in examples]
    width = max(len(p) + len(r) for p, r in rows)
    inputs, targets, masks = [], [], []
    for prompt, reply in rows:
        ids = prompt + reply
        pad = width - len(ids)
        inputs.append(ids[:-1] + [0] * pad)
        targets.append(ids[1:] + [0] * pad)
        masks.append([0] * (len(prompt) - 1) + [1] * len(reply) + [0] * pad)
    x, y, mask = mx.array(inputs), mx.array(targets), mx.array(masks, dtype=mx.float32)

    def loss_of(model):
        losses = nn.losses.cross_entropy(model(x), y)
        return (losses * mask).sum() / mask.sum()

    step = nn.value_and_grad(model, loss_of)
    optimizer = optim.Adam(learning_rate=1e-2)
    loss = None

    def every_id_first() -> bool:
        return bool(mx.all((model(x).argmax(axis=-1) == y) | (mask == 0)).item())

    for _ in range(max_steps):
        loss, grads = step(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        if loss.item() < target_loss and every_id_first():
            break
    save_model(folder, model)
    return loss.item()
