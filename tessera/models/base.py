"""What every model of :mod:`tessera.models` offers: logits, loss, parameter names and
shapes, and a Megatron tensor-parallel layout."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tessera import dist, op
from tessera.errors import ArgumentError
from tessera.models import generate as generation
from tessera.models.config import ModelConfig
from tessera.models.kv_cache import KVCache

Params = dict[str, Any]  # Hugging Face state-dict names -> tensors (torch outside, traced inside)


def linear(x: Any, params: Params, name: str, bias: bool = False) -> Any:
    """``torch.nn.Linear``: ``x @ weight.T (+ bias)``, weight ``[out, in]``."""
    y = x @ op.transpose(params[f"{name}.weight"])
    return y + params[f"{name}.bias"] if bias else y


def heads(x: Any, count: int, head_dim: int) -> Any:
    """``[B, T, count * head_dim]`` -> ``[B, count, T, head_dim]``."""
    B, T, _ = x.shape
    return op.transpose(op.reshape(x, (B, T, count, head_dim)), (0, 2, 1, 3))


def merge_heads(x: Any) -> Any:
    """``[B, H, T, D]`` -> ``[B, T, H * D]``."""
    B, H, T, D = x.shape
    return op.reshape(op.transpose(x, (0, 2, 1, 3)), (B, T, H * D))


def activation(name: str) -> Any:
    """The activation that transformers calls ``name``."""
    table = {
        "silu": op.silu, "swish": op.silu, "relu": op.relu, "gelu": op.gelu,
        "gelu_new": lambda x: op.gelu(x, "tanh"), "gelu_pytorch_tanh": lambda x: op.gelu(x, "tanh"),
    }  # fmt: skip
    if name not in table:
        raise ArgumentError(f"unsupported activation {name!r}; supported: {', '.join(table)}")
    return table[name]


@dataclass(frozen=True)
class CausalLM:
    """A decoder-only language model of ``config``: subclasses define
    :meth:`param_shapes`, :meth:`logits` and :meth:`tp_dims`."""

    config: ModelConfig

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each parameter's Hugging Face state-dict name and shape."""
        raise NotImplementedError

    def logits(self, params: Params, tokens: Any, cache: KVCache | None = None) -> Any:
        """The next-token logits ``[B, T, vocab]`` of ``tokens [B, T]`` (traceable); with a
        ``cache``, ``tokens`` continue the cached sequence from ``cache.position``."""
        raise NotImplementedError

    def tp_dims(self) -> dict[str, int]:
        """The dim each tensor-parallel parameter is split on (others replicated)."""
        raise NotImplementedError

    def loss(self, params: Params, tokens: Any, targets: Any) -> Any:
        """Mean cross-entropy of the logits of ``tokens [B, T]`` against ``targets
        [B, T]`` (no shift: ``targets`` are the next tokens)."""
        return op.cross_entropy(self.logits(params, tokens), targets)

    def generate(
        self,
        params: Params,
        prompt: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        key: Any = None,
        *,
        max_len: int | None = None,
        mesh: dist.Mesh | None = None,
        tp: str = "tp",
        kernels: str | None = None,
        verbose: bool = False,
    ) -> generation.Generation:
        """``max_new_tokens`` tokens after ``prompt`` (token ids ``[B, P]`` or ``[P]``)
        with a KV cache of ``max_len`` positions (default: just enough): the prefill and
        the decode step are compiled once each. ``temperature=0`` is greedy; otherwise
        tokens are drawn (``top_k``, ``top_p`` restrict them) with the uniforms of
        ``ts.random`` ``key`` (default ``ts.random.key(0)``): the same key, the same
        tokens. With a ``mesh``, tensor parallel over its axis ``tp`` (parameters as
        :meth:`param_shardings`, caches split over heads). Returns a
        :class:`~tessera.models.generate.Generation` (``.tokens``,
        ``.tokens_per_second``); ``verbose`` prints the speed."""
        return generation.generate(
            self, params, prompt, max_new_tokens, temperature, top_k, top_p, key,
            max_len=max_len, mesh=mesh, tp=tp, kernels=kernels, verbose=verbose,
        )  # fmt: skip

    @functools.cached_property
    def _generation_steps(self) -> dict[Any, Any]:
        """:meth:`generate`'s jitted steps, by mesh, tensor-parallel axis and kernels."""
        return {}

    def param_shardings(self, mesh: dist.Mesh, tp: str = "tp") -> dict[str, dist.ShardSpec | None]:
        """Megatron tensor parallelism over mesh axis ``tp``: q, k, v, gate and up by
        output features (heads split), o and down by input features, the embedding and
        the head by vocabulary; norms (and biases of row-split layers) replicated. For
        ``graph.training_step(param_shardings=...)`` or ``ts.jit(in_shardings=...)``."""
        if tp not in mesh.axis_names:
            raise ArgumentError(
                f"param_shardings: mesh axis {tp!r} is not in the mesh's axes {list(mesh.axis_names)}"
            )
        dims = self.tp_dims()
        shapes = self.param_shapes()
        size = mesh.axis_size(tp)
        for name, dim in dims.items():
            if shapes[name][dim] % size:
                raise ArgumentError(
                    f"param_shardings: {name} {list(shapes[name])} does not split {size} "
                    f"ways on dim {dim} (mesh axis {tp!r})"
                )
        return {
            name: dist.ShardSpec(partition=(dims[name],), mesh_axes=(tp,)) if name in dims else None
            for name in shapes
        }
