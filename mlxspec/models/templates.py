"""Rendering a model's chat template, with its failures said as the template's: a sandbox
violation, an error the template raises itself, or a rendering of nothing name the file
the template came from (transformers renders it in its jinja2 sandbox)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ChatTemplateError

# Where transformers finds a folder's chat template, in its order of preference.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def render(tokenizer, messages: list[dict], *, tokenize: bool = True, generation_prompt: bool = True, **extra):
    """`tokenizer.apply_chat_template(messages, add_generation_prompt=True, ...)`: ids, or
    the text with tokenize=False (a whole conversation read as it is: generation_prompt=False)."""
    from jinja2 import TemplateError

    try:
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=tokenize, **extra
        )
    # SecurityError, UndefinedError, the template's raise_exception; TypeError: a template
    # that is not text (jinja2 cannot compile it)
    except (TemplateError, TypeError) as e:
        first = (str(e).strip() or type(e).__name__).splitlines()[0][:200]
        raise ChatTemplateError(f"the model's chat template ({template_file(tokenizer)}) failed: {first}") from None
    if not (rendered if tokenize else rendered.strip()):
        raise ChatTemplateError(
            f"the model's chat template ({template_file(tokenizer)}) rendered the prompt as nothing"
        )
    return list(rendered) if tokenize else rendered


def template_file(tokenizer) -> str:
    """The file the tokenizer's chat template was read from (its folder when not found)."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in TEMPLATE_FILES:
        path = folder / name
        if path.is_file() and (name != "tokenizer_config.json" or '"chat_template"' in path.read_text(errors="ignore")):
            return str(path)
    return str(folder)
