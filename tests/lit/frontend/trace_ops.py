# RUN: %python %s | filecheck %s --enable-var-scope
# RUN: %python %s | tessera-opt --split-input-file | filecheck %s --enable-var-scope

# What the tracer records for tessera.op functions and tensor methods beyond the MLP:
# layout changes, indexing, reductions, comparisons, where, concat/chunk/split,
# embedding, cross_entropy and dtype promotion. Negative axes are normalised, Python
# scalars become 0-d constants of the tensor's dtype. The second RUN line re-parses it.

import numpy as np
import torch

import tessera as ts
from tessera import op


def zeros(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


modules: list[str] = []


def show(fn: ts.JitFunction, *args: object) -> None:
    """Records fn's Graph IR for the example arguments (printed at the end)."""
    modules.append(fn.lower(*args).as_text("traced"))


# reshape (with -1), .T, transpose, basic slicing (a strided slice; an integer index is a
# slice and a reshape that drops the dim).
@ts.jit
def layout(x):
    flat = x.reshape(6, 4)
    return flat.T, op.transpose(x, (2, 0, -2)), x[:, 1:3, ::2], x[-1], x.reshape(-1)


# CHECK-LABEL: func.func @layout
# CHECK-SAME: (%[[X:.*]]: tensor<2x3x4xf32>) -> (tensor<4x6xf32>, tensor<4x2x3xf32>, tensor<2x2x2xf32>, tensor<3x4xf32>, tensor<24xf32>) {
# CHECK-NEXT: %[[FLAT:.*]] = graph.reshape %[[X]] : tensor<2x3x4xf32> -> tensor<6x4xf32>{{$}}
# CHECK-NEXT: %[[T:.*]] = graph.transpose %[[FLAT]] {perm = [1, 0]} : tensor<6x4xf32> -> tensor<4x6xf32>{{$}}
# CHECK-NEXT: %[[P:.*]] = graph.transpose %[[X]] {perm = [2, 0, 1]} : tensor<2x3x4xf32> -> tensor<4x2x3xf32>{{$}}
# CHECK-NEXT: %[[S:.*]] = graph.slice %[[X]] {starts = [0, 1, 0], limits = [2, 3, 4], strides = [1, 1, 2]} : tensor<2x3x4xf32> -> tensor<2x2x2xf32>{{$}}
# CHECK-NEXT: %[[ROW:.*]] = graph.slice %[[X]] {starts = [1, 0, 0], limits = [2, 3, 4], strides = [1, 1, 1]} : tensor<2x3x4xf32> -> tensor<1x3x4xf32>{{$}}
# CHECK-NEXT: %[[LAST:.*]] = graph.reshape %[[ROW]] : tensor<1x3x4xf32> -> tensor<3x4xf32>{{$}}
# CHECK-NEXT: %[[R:.*]] = graph.reshape %[[X]] : tensor<2x3x4xf32> -> tensor<24xf32>{{$}}
# CHECK-NEXT: func.return %[[T]], %[[P]], %[[S]], %[[LAST]], %[[R]] : tensor<4x6xf32>, tensor<4x2x3xf32>, tensor<2x2x2xf32>, tensor<3x4xf32>, tensor<24xf32>{{$}}
show(layout, zeros(2, 3, 4))


# Reductions as methods and functions: one axis, a negative axis, all axes (a 0-d
# result), keepdims; the mean of integers is computed in f64 and rounded once to f32.
@ts.jit
def reductions(x, i):
    return (
        x.sum(axis=1),
        x.mean(axis=0, keepdims=True),
        op.max(x),
        x.min(axis=-1),
        op.sum(x, axis=(0, 1), keepdims=True),
        i.mean(),
    )


# CHECK-LABEL: func.func @reductions
# CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[I:.*]]: tensor<3xi64>) -> (tensor<4xf32>, tensor<1x8xf32>, tensor<f32>, tensor<4xf32>, tensor<1x1xf32>, tensor<f32>) {
# CHECK-NEXT: %[[SUM:.*]] = graph.sum %[[X]] {axes = [1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>{{$}}
# CHECK-NEXT: %[[MEAN:.*]] = graph.mean %[[X]] {axes = [0], keepdims = true} : tensor<4x8xf32> -> tensor<1x8xf32>{{$}}
# CHECK-NEXT: %[[MAX:.*]] = graph.max %[[X]] {axes = [0, 1], keepdims = false} : tensor<4x8xf32> -> tensor<f32>{{$}}
# CHECK-NEXT: %[[MIN:.*]] = graph.min %[[X]] {axes = [1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>{{$}}
# CHECK-NEXT: %[[ALL:.*]] = graph.sum %[[X]] {axes = [0, 1], keepdims = true} : tensor<4x8xf32> -> tensor<1x1xf32>{{$}}
# CHECK-NEXT: %[[IF:.*]] = graph.cast %[[I]] : tensor<3xi64> -> tensor<3xf64>{{$}}
# CHECK-NEXT: %[[WIDE:.*]] = graph.mean %[[IF]] {axes = [0], keepdims = false} : tensor<3xf64> -> tensor<f64>{{$}}
# CHECK-NEXT: %[[IMEAN:.*]] = graph.cast %[[WIDE]] : tensor<f64> -> tensor<f32>{{$}}
# CHECK-NEXT: func.return %[[SUM]], %[[MEAN]], %[[MAX]], %[[MIN]], %[[ALL]], %[[IMEAN]] :
show(reductions, zeros(4, 8), zeros(3, dtype=np.int64))


# Comparison operators give i1 tensors; where selects with a scalar (a 0-d constant of
# x's dtype) or a tensor; a scalar operand of a comparison is a constant too.
@ts.jit
def compare_where(x, y):
    return op.where(x > y, x, 0.0), x == y, x <= 1.0, op.where(x != y, x, y), x < y, x >= y


# CHECK-LABEL: func.func @compare_where
# CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[Y:.*]]: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>, tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xi1>, tensor<4x8xi1>) {
# CHECK-NEXT: %[[GT:.*]] = graph.compare %[[X]], %[[Y]] {predicate = gt} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xi1>{{$}}
# CHECK-NEXT: %[[ZERO:.*]] = graph.constant dense<0.000000e+00> : tensor<f32>{{$}}
# CHECK-NEXT: %[[W1:.*]] = graph.select %[[GT]], %[[X]], %[[ZERO]] : tensor<4x8xi1>, tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>{{$}}
# CHECK-NEXT: %[[EQ:.*]] = graph.compare %[[X]], %[[Y]] {predicate = eq} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xi1>{{$}}
# CHECK-NEXT: %[[ONE:.*]] = graph.constant dense<1.000000e+00> : tensor<f32>{{$}}
# CHECK-NEXT: %[[LE:.*]] = graph.compare %[[X]], %[[ONE]] {predicate = le} : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xi1>{{$}}
# CHECK-NEXT: %[[NE:.*]] = graph.compare %[[X]], %[[Y]] {predicate = ne} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xi1>{{$}}
# CHECK-NEXT: %[[W2:.*]] = graph.select %[[NE]], %[[X]], %[[Y]] : tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>{{$}}
# CHECK-NEXT: %[[LT:.*]] = graph.compare %[[X]], %[[Y]] {predicate = lt} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xi1>{{$}}
# CHECK-NEXT: %[[GE:.*]] = graph.compare %[[X]], %[[Y]] {predicate = ge} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xi1>{{$}}
# CHECK-NEXT: func.return %[[W1]], %[[EQ]], %[[LE]], %[[W2]], %[[LT]], %[[GE]] :
show(compare_where, zeros(4, 8), zeros(4, 8))


# concat of three tensors, chunk into equal pieces (one split op with two results) and
# split at given indices (numpy's meaning: [1] cuts rows 0 | 1-2).
@ts.jit
def concat_chunk(a, b):
    c = op.concat([a, b, a], axis=0)
    left, right = op.chunk(c, 2, axis=-1)
    head, tail = op.split(b, [1], axis=0)
    return left, right, head, tail


# CHECK-LABEL: func.func @concat_chunk
# CHECK-SAME: (%[[A:.*]]: tensor<2x4xf32>, %[[B:.*]]: tensor<3x4xf32>) -> (tensor<7x2xf32>, tensor<7x2xf32>, tensor<1x4xf32>, tensor<2x4xf32>) {
# CHECK-NEXT: %[[C:.*]] = graph.concat %[[A]], %[[B]], %[[A]] {axis = 0} : tensor<2x4xf32>, tensor<3x4xf32>, tensor<2x4xf32> -> tensor<7x4xf32>{{$}}
# CHECK-NEXT: %[[L:.*]], %[[R:.*]] = graph.split %[[C]] {axis = 1} : tensor<7x4xf32> -> (tensor<7x2xf32>, tensor<7x2xf32>){{$}}
# CHECK-NEXT: %[[H:.*]], %[[T:.*]] = graph.split %[[B]] {axis = 0} : tensor<3x4xf32> -> (tensor<1x4xf32>, tensor<2x4xf32>){{$}}
# CHECK-NEXT: func.return %[[L]], %[[R]], %[[H]], %[[T]] : tensor<7x2xf32>, tensor<7x2xf32>, tensor<1x4xf32>, tensor<2x4xf32>{{$}}
show(concat_chunk, zeros(2, 4), zeros(3, 4))


# A language-model loss: an embedding lookup (gather on axis 0), a batched matmul whose
# weight broadcasts over the batch, and cross_entropy with each reduction.
@ts.jit
def embedding_loss(ids, table, w, labels):
    logits = op.embedding(ids, table) @ w
    return (
        op.cross_entropy(logits, labels),
        op.cross_entropy(logits, labels, reduction="sum"),
        op.cross_entropy(logits, labels, reduction="none"),
    )


# CHECK-LABEL: func.func @embedding_loss
# CHECK-SAME: (%[[IDS:.*]]: tensor<4x8xi32>, %[[TABLE:.*]]: tensor<100x16xf32>, %[[W:.*]]: tensor<16x10xf32>, %[[LABELS:.*]]: tensor<4x8xi64>) -> (tensor<f32>, tensor<f32>, tensor<4x8xf32>) {
# CHECK-NEXT: %[[E:.*]] = graph.gather %[[TABLE]], %[[IDS]] {axis = 0} : tensor<100x16xf32>, tensor<4x8xi32> -> tensor<4x8x16xf32>{{$}}
# CHECK-NEXT: %[[LOGITS:.*]] = graph.matmul %[[E]], %[[W]] : tensor<4x8x16xf32>, tensor<16x10xf32> -> tensor<4x8x10xf32>{{$}}
# CHECK-NEXT: %[[MEAN:.*]] = graph.cross_entropy %[[LOGITS]], %[[LABELS]] {reduction = mean} : tensor<4x8x10xf32>, tensor<4x8xi64> -> tensor<f32>{{$}}
# CHECK-NEXT: %[[SUM:.*]] = graph.cross_entropy %[[LOGITS]], %[[LABELS]] {reduction = sum} : tensor<4x8x10xf32>, tensor<4x8xi64> -> tensor<f32>{{$}}
# CHECK-NEXT: %[[NONE:.*]] = graph.cross_entropy %[[LOGITS]], %[[LABELS]] {reduction = none} : tensor<4x8x10xf32>, tensor<4x8xi64> -> tensor<4x8xf32>{{$}}
# CHECK-NEXT: func.return %[[MEAN]], %[[SUM]], %[[NONE]] : tensor<f32>, tensor<f32>, tensor<4x8xf32>{{$}}
ids = torch.zeros((4, 8), dtype=torch.int32)
labels = torch.zeros((4, 8), dtype=torch.int64)
show(embedding_loss, ids, zeros(100, 16), zeros(16, 10), labels)


# dtypes: a Python int keeps i32; true division of integers casts to f32; astype is a
# cast; a float scalar next to f16 is an f16 constant; mixed f16/f32 promotes to f32.
@ts.jit
def dtypes(i, h, x):
    return i * 2, i / 2, h.astype("bfloat16"), op.exp(h) + 1.5, h + x


# CHECK-LABEL: func.func @dtypes
# CHECK-SAME: (%[[I:.*]]: tensor<4xi32>, %[[H:.*]]: tensor<4xf16>, %[[X:.*]]: tensor<4xf32>) -> (tensor<4xi32>, tensor<4xf32>, tensor<4xbf16>, tensor<4xf16>, tensor<4xf32>) {
# CHECK-NEXT: %[[TWO:.*]] = graph.constant dense<2> : tensor<i32>{{$}}
# CHECK-NEXT: %[[MUL:.*]] = graph.mul %[[I]], %[[TWO]] : tensor<4xi32>, tensor<i32> -> tensor<4xi32>{{$}}
# CHECK-NEXT: %[[TWO2:.*]] = graph.constant dense<2> : tensor<i32>{{$}}
# CHECK-NEXT: %[[IF:.*]] = graph.cast %[[I]] : tensor<4xi32> -> tensor<4xf32>{{$}}
# CHECK-NEXT: %[[TWOF:.*]] = graph.cast %[[TWO2]] : tensor<i32> -> tensor<f32>{{$}}
# CHECK-NEXT: %[[DIV:.*]] = graph.div %[[IF]], %[[TWOF]] : tensor<4xf32>, tensor<f32> -> tensor<4xf32>{{$}}
# CHECK-NEXT: %[[BF:.*]] = graph.cast %[[H]] : tensor<4xf16> -> tensor<4xbf16>{{$}}
# CHECK-NEXT: %[[EXP:.*]] = graph.exp %[[H]] : tensor<4xf16>{{$}}
# CHECK-NEXT: %[[C:.*]] = graph.constant dense<1.500000e+00> : tensor<f16>{{$}}
# CHECK-NEXT: %[[ADD:.*]] = graph.add %[[EXP]], %[[C]] : tensor<4xf16>, tensor<f16> -> tensor<4xf16>{{$}}
# CHECK-NEXT: %[[HF:.*]] = graph.cast %[[H]] : tensor<4xf16> -> tensor<4xf32>{{$}}
# CHECK-NEXT: %[[MIX:.*]] = graph.add %[[HF]], %[[X]] : tensor<4xf32>{{$}}
# CHECK-NEXT: func.return %[[MUL]], %[[DIV]], %[[BF]], %[[ADD]], %[[MIX]] :
show(dtypes, zeros(4, dtype=np.int32), zeros(4, dtype=np.float16), zeros(4))

# One module per function, split as tessera-opt --split-input-file expects.
print("\n// -----\n".join(modules))
