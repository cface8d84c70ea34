"""MLX's backend in this process, and what speculative decoding asks of it.

On Linux MLX's backend is a package of its own, chosen by mlxspec's extras: `mlxspec[cpu]`,
or `mlxspec[cuda]` (CUDA 12; `cuda13` for CUDA 13) with an NVIDIA GPU. Each backend package
writes the same `mlx/lib/libmlx.so`, so two never go together, and with neither `import
mlx.core` fails: `NO_BACKEND` says what to install.

On the CUDA backend (MLX 0.31-0.32, mlx/backend/cuda/scaled_dot_product_attention.cpp):
`supports_sdpa_cudnn` sends an attention call with more than one query row (bf16 or fp16,
head dim a multiple of 8 up to 128) to cuDNN, whose compiled plans are cached by the exact
shapes and strides of q, k, v and of an array mask (`build_sdpa_cache_key`). A verify reads
gamma + 1 rows over a cache one round longer than the last, and the draft's catching up
likewise: every round builds new plans (on an H200, speculative decoding ran at 0.13-0.28x
of standard decoding). An explicit array mask does not avoid it: cuDNN is refused an array
mask only for one query row; with more, the mask becomes cuDNN's bias and its shape joins
the key. What avoids it is the switch MLX reads once per process, at its first attention
call (a function-local static in `supports_sdpa_cudnn`): `MLX_CUDA_USE_CUDNN_SDPA=0` (MLX
0.30 spelled it `SPDA`). Then calls of up to 3 query rows (head dim 64, 96 or 128, no array
mask) run MLX's own vector kernel (`sdpa_vector`, scaled_dot_product_attention.cu) and the
others MLX's unfused attention (matmul, softmax, matmul: `scaled_dot_product_attention`'s
fallback in mlx/fast.cpp): nothing is planned per shape. The price is cuDNN's flash
attention in prefill (mlxspec reads a prompt in chunks of 512 ids, so the unfused score
matrix stays bounded) and cuDNN's decoding kernel past 256 cached ids.

`keep_attention_plans` sets the switch when speculative decoding may run on the CUDA backend
and the user has not set it; `load_pair` calls it before a model's first forward, since
MLX's first attention call decides. Standard library only at import.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

CUDNN_ATTENTION = ("MLX_CUDA_USE_CUDNN_SDPA", "MLX_CUDA_USE_CUDNN_SPDA")  # MLX 0.31+, and 0.30's spelling
NO_BACKEND = (
    "MLX has no backend installed: on Linux install one with mlxspec, `pip install 'mlxspec[cpu]'`, or "
    "`pip install 'mlxspec[cuda]'` with an NVIDIA GPU (`mlxspec[cuda13]` for CUDA 13)"
)


def missing_backend(error: BaseException) -> bool:
    """`error` is the failure to load MLX's library for want of a backend package."""
    return isinstance(error, ImportError) and "libmlx" in str(error)


def on_cuda() -> bool:
    """MLX runs on its CUDA backend here (imports MLX)."""
    import mlx.core as mx

    return bool(getattr(mx, "cuda", None) and mx.cuda.is_available())


@dataclass(frozen=True)
class AttentionPlan:
    """What to do about cuDNN attention in this process; `reason` says why."""

    reason: str
    switch_off: bool = False


def attention_plan(env: MutableMapping[str, str], *, cuda: bool, drafting: bool) -> AttentionPlan:
    """Decide from the backend, whether speculative decoding may run, and the environment."""
    if not cuda:
        return AttentionPlan("not MLX's CUDA backend: no cuDNN attention")
    if not drafting:
        return AttentionPlan("standard decoding only: cuDNN attention kept (its plans are reused step to step)")
    chosen = next((name for name in CUDNN_ATTENTION if name in env), None)
    if chosen is not None:
        return AttentionPlan(f"{chosen}={env[chosen]} set by the user: kept")
    return AttentionPlan(
        "speculative decoding on MLX's CUDA backend: cuDNN attention off (it would build plans every round)",
        switch_off=True,
    )


def keep_attention_plans(
    *, drafting: bool, env: MutableMapping[str, str] | None = None, cuda: bool | None = None
) -> AttentionPlan:
    """Turn cuDNN attention off when `attention_plan` says so; in effect only when this
    process has not yet made an attention call (MLX reads the switch at its first)."""
    env = os.environ if env is None else env
    decided = attention_plan(env, cuda=on_cuda() if cuda is None else cuda, drafting=drafting)
    if decided.switch_off:
        for name in CUDNN_ATTENTION:
            env[name] = "0"
    return decided
