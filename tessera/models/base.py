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

    def ep_dims(self) -> dict[str, int]:
        """The experts' dim of each expert-parallel parameter (none but in MoE models)."""
        return {}

    def from_checkpoint(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """``tensors`` of a Hugging Face checkpoint in the layout :meth:`param_shapes`
        gives (load); tensors it does not recognise are kept as they are."""
        return dict(tensors)

    def to_checkpoint(self, params: Params) -> dict[str, Any]:
        """``params`` as the Hugging Face checkpoint stores them (save): the inverse of
        :meth:`from_checkpoint`."""
        return dict(params)

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

    def param_shardings(
        self, mesh: dist.Mesh, tp: str | None = "tp", ep: str | None = None
    ) -> dict[str, dist.ShardSpec | None]:
        """Megatron tensor parallelism over mesh axis ``tp``: q, k, v, gate and up by
        output features (heads split), o and down by input features, the embedding and
        the head by vocabulary; norms (and biases of row-split layers) replicated. With
        ``ep`` (MoE models), expert parallelism: the stacked experts split over ``ep``
        by expert (and over ``tp`` inside each expert); ``tp=None`` for no tensor
        parallelism. For ``graph.training_step(param_shardings=...)`` or
        ``ts.jit(in_shardings=...)``."""
        for axis in (tp, ep):
            if axis is not None and axis not in mesh.axis_names:
                hint = " (tp=None: no tensor parallelism)" if axis == tp else ""
                raise ArgumentError(
                    f"param_shardings: mesh axis {axis!r} is not in the mesh's axes "
                    f"{list(mesh.axis_names)}{hint}"
                )
        shapes = self.param_shapes()
        layouts: dict[str, list[tuple[int, str]]] = {name: [] for name in shapes}
        if ep is not None:
            if not self.ep_dims():
                raise ArgumentError(
                    f"param_shardings: {type(self).__name__} has no experts (ep={ep!r})"
                )
            for name, dim in self.ep_dims().items():
                layouts[name].append((dim, ep))
        for name, dim in self.tp_dims().items() if tp is not None else ():
            layouts[name].append((dim, tp))
        for name, layout in layouts.items():
            for dim, axis in layout:
                if shapes[name][dim] % mesh.axis_size(axis):
                    raise ArgumentError(
                        f"param_shardings: {name} {list(shapes[name])} does not split "
                        f"{mesh.axis_size(axis)} ways on dim {dim} (mesh axis {axis!r})"
                    )
        return {
            name: dist.ShardSpec(
                partition=tuple(d for d, _ in sorted(layout)),
                mesh_axes=tuple(a for _, a in sorted(layout)),
            )
            if layout
            else None
            for name, layout in layouts.items()
        }
