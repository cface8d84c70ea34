"""mlxspec: speculative decoding on MLX, with exactly the target model's output.

import mlxspec
pair = mlxspec.load_pair(target="mlx-community/Qwen3-14B-4bit", draft="mlx-community/Qwen3-0.6B-4bit")
result = mlxspec.generate(pair, "Write a haiku about caches.", max_tokens=64)  # gamma="auto"
for event in mlxspec.stream(pair, "Hello", temp=0.7): ...
results = mlxspec.generate_many(pair, ["Hi", "Bye"], max_tokens=64)  # one batch, each as alone
"""

__version__ = "0.1.0"

# Imported on first use, so `import mlxspec` (and `mlxspec --help`) stays fast.
_EXPORTS = {
    "load_pair": "models.pairs",
    "Pair": "models.pairs",
    "generate": "generation",
    "generate_many": "batching",
    "stream": "generation",
    "Session": "generation",
    "CacheOptions": "decoding.caches",
    "GenerationResult": "generation",
    "Options": "options",
    "SamplingParams": "decoding.sampling",
    "GrammarSpec": "grammar",
    "Prefill": "decoding.events",
    "Round": "decoding.events",
    "Done": "decoding.events",
    "Stats": "stats",
    "MlxspecError": "errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'mlxspec' has no attribute {name!r}")
