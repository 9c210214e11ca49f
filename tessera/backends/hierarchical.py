"""Hierarchical collectives: within domains first, then across them.

``choose-collective-algorithms`` marks a ``schedule.start`` with ``algorithm =
hierarchical`` and a ``domain`` size ``d`` when the cost model says a two-level algorithm
is fastest (a group spanning several nodes or NVSwitch domains). A group of ``n = n2 · d``
members, in mesh-group order (``Mesh.groups``), is then cut into:

- ``n2`` *intra-domain* groups of ``d`` consecutive members: ``members[k*d:(k+1)*d]``
  (the GPUs of one node / NVLink domain), and
- ``d`` *inter-domain* groups of the members at the same position ``i`` in their
  domain: ``members[i::d]`` (one GPU per node, e.g. over InfiniBand).

Member ``p = k*d + i`` is domain ``k``'s ``i``-th member. The phases, as in the NVL72
guide's hierarchical all-reduce and as ``tessera.perf.collective_cost`` prices them:

- ``all_reduce``: the operand is flattened and zero-padded to a multiple of ``d``;
  intra-domain reduce_scatter (member ``i`` of each domain gets the domain's reduction
  of piece ``i``), inter-domain all_reduce of that piece, intra-domain all_gather of the
  pieces; the padding is dropped and the shape restored.
- ``reduce_scatter`` along ``dim`` (``n`` pieces, piece ``p`` for member ``p``):
  intra-domain reduce_scatter in which domain member ``i`` receives the bundle of pieces
  ``{k*d + i : k}``, then inter-domain reduce_scatter of that bundle, so member
  ``k*d + i`` keeps piece ``k*d + i``.
- ``all_gather`` along ``dim``: inter-domain all_gather (member ``k*d + i`` gets the
  bundle of pieces ``{k'*d + i : k'}``), then intra-domain all_gather of the bundles;
  the pieces are concatenated in member order.
- ``all_to_all`` (``split_dim`` cut in ``n`` pieces, piece ``p`` for member ``p``;
  received pieces concatenated along ``concat_dim`` in member order): intra-domain
  all_to_all in which member ``j`` sends domain member ``i`` the bundle of its pieces
  ``{k'*d + i : k'}`` (bound for position ``i`` of every domain), then inter-domain
  all_to_all in which member ``k*d + i`` sends member ``k'*d + i`` the ``d`` pieces
  bound for it, one from each member of domain ``k``. Each piece crosses the outer
  links once, as in the flat all_to_all, but in ``n2 - 1`` messages ``d`` times larger.

All-to-all and all-gather move data only: their results equal the flat collective's
exactly. Sum and mean reduce in the accumulation dtype (f32 for f16/bf16, as the flat collectives
do) in every phase and round once at the end; mean divides by ``n`` at the end; max and
min reduce in every phase. Results equal the flat collective's up to the order of
floating-point additions (exactly, for max and min).

This module computes the phases in memory for the virtual mesh
(:func:`run_group`); ``tessera.backends.distributed`` issues them over
``torch.distributed`` subgroups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tessera.errors import ExecutionError
from tessera.ir.reduction_kinds import KINDS
from tessera.opdefs.collective import accumulation_dtype, finish_reduce, reduce_pieces


def domains(members: Sequence[int], domain: int) -> tuple[list[list[int]], list[list[int]]]:
    """(intra-domain groups, inter-domain groups) of a group's ``members`` (mesh order)."""
    n = len(members)
    if not 2 <= domain < n or n % domain:
        raise ExecutionError(
            f"hierarchical collective: domain {domain} must divide the group size {n} "
            f"with 2 <= domain < {n}"
        )
    members = list(members)
    intra = [members[k : k + domain] for k in range(0, n, domain)]
    inter = [members[i::domain] for i in range(domain)]
    return intra, inter


def phase_kind(kind: str) -> str:
    """The reduction each phase does: means are sums until the end."""
    return KINDS[kind].combine


def accumulate(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x`` in the dtype the phases reduce in (f32 for f16/bf16 terms of sums, means
    and products)."""
    return x.to(accumulation_dtype(kind, x.dtype))


def padded_pieces(x: torch.Tensor, domain: int) -> tuple[list[torch.Tensor], int]:
    """``x`` flattened, zero-padded to a multiple of ``domain`` and cut into ``domain``
    equal pieces; and ``x.numel()`` (what to keep of the gathered pieces)."""
    flat = x.reshape(-1)
    count = flat.numel()
    piece = -(-count // domain)
    if piece * domain != count:
        flat = torch.nn.functional.pad(flat, (0, piece * domain - count))
    return list(flat.split(piece)), count


def run_group(
    collective: str, attrs: dict[str, Any], xs: Sequence[torch.Tensor], domain: int
) -> list[torch.Tensor]:
    """Every member's result of a hierarchical ``collective`` over one group, from the
    members' operands ``xs`` (in group order), moving the pieces phase by phase."""
    if collective == "all_reduce":
        return _all_reduce(xs, attrs["kind"], domain)
    if collective == "reduce_scatter":
        return _reduce_scatter(xs, attrs["kind"], attrs["dim"], domain)
    if collective == "all_gather":
        return _all_gather(xs, attrs["dim"], domain)
    if collective == "all_to_all":
        return _all_to_all(xs, attrs["split_dim"], attrs["concat_dim"], domain)
    raise ExecutionError(f"{collective} has no hierarchical algorithm")


def _all_reduce(xs: Sequence[torch.Tensor], kind: str, d: int) -> list[torch.Tensor]:
    n, shape, dtype = len(xs), xs[0].shape, xs[0].dtype
    if xs[0].numel() == 0:
        return [x.clone() for x in xs]
    intra, inter = domains(range(n), d)
    step = phase_kind(kind)
    split = [padded_pieces(accumulate(x, kind), d) for x in xs]
    count = split[0][1]
    held: list[torch.Tensor] = [torch.empty(0)] * n  # what each member holds
    for group in intra:  # 1: reduce_scatter within each domain
        for i, member in enumerate(group):
            held[member] = reduce_pieces([split[m][0][i] for m in group], step)
    for group in inter:  # 2: all_reduce across domains
        total = reduce_pieces([held[m] for m in group], step)
        for member in group:
            held[member] = total.clone()
    results: list[torch.Tensor] = [torch.empty(0)] * n
    for group in intra:  # 3: all_gather within each domain
        gathered = torch.cat([held[m] for m in group])[:count].reshape(shape)
        for member in group:
            results[member] = finish_reduce(gathered.clone(), kind, n, dtype)
    return results


def _reduce_scatter(xs: Sequence[torch.Tensor], kind: str, dim: int, d: int) -> list[torch.Tensor]:
    n, dtype = len(xs), xs[0].dtype
    intra, inter = domains(range(n), d)
    step = phase_kind(kind)
    pieces = [accumulate(x, kind).chunk(n, dim) for x in xs]  # pieces[member][piece]
    bundles: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for group in intra:  # 1: member i of a domain gets pieces {k*d + i}, reduced over the domain
        for i, member in enumerate(group):
            bundles[member] = [
                reduce_pieces([pieces[m][k * d + i] for m in group], step) for k in range(n // d)
            ]
    results: list[torch.Tensor] = [torch.empty(0)] * n
    for group in inter:  # 2: across domains, member k*d + i keeps piece k*d + i
        for k, member in enumerate(group):
            total = reduce_pieces([bundles[m][k] for m in group], step)
            results[member] = finish_reduce(total, kind, n, dtype)
    return results


def _all_gather(xs: Sequence[torch.Tensor], dim: int, d: int) -> list[torch.Tensor]:
    n = len(xs)
    intra, inter = domains(range(n), d)
    bundles: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for group in inter:  # 1: across domains, member k*d + i gets pieces {k'*d + i}
        for member in group:
            bundles[member] = [xs[m].clone() for m in group]
    results: list[torch.Tensor] = [torch.empty(0)] * n
    for group in intra:  # 2: within each domain, the bundles of the d positions
        for member in group:
            by_position = [bundles[m] for m in group]  # [i][k] is piece k*d + i
            ordered = [by_position[p % d][p // d] for p in range(n)]
            results[member] = torch.cat(ordered, dim)
    return results


def _all_to_all(
    xs: Sequence[torch.Tensor], split_dim: int, concat_dim: int, d: int
) -> list[torch.Tensor]:
    n = len(xs)
    n2 = n // d
    intra, inter = domains(range(n), d)
    pieces = [x.chunk(n, split_dim) for x in xs]  # pieces[member][piece]
    # 1: within each domain, member j sends member i the pieces {k*d + i}: held[i][j][k]
    held: list[list[list[torch.Tensor]]] = [[] for _ in range(n)]
    for group in intra:
        for i, member in enumerate(group):
            held[member] = [[pieces[j][k * d + i] for k in range(n2)] for j in group]
    # 2: across domains, member k*d + i sends member k'*d + i the pieces bound for it
    results: list[torch.Tensor] = [torch.empty(0)] * n
    for group in inter:
        for k2, member in enumerate(group):
            received = [held[source][j][k2] for source in group for j in range(d)]
            results[member] = torch.cat(received, concat_dim)  # sources k*d + j, in order
    return results
