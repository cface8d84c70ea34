"""The prompt builder moved into the package (mlxspec/training/corpus.py, where
`mlxspec train-draft` reads it); kept here so the SmolLM2 draft's scripts still run."""

from mlxspec.training.corpus import build_prompts, man_descriptions, module_docs, package_descriptions, stdlib_functions

__all__ = ["build_prompts", "man_descriptions", "module_docs", "package_descriptions", "stdlib_functions"]
