# RUN: %python %s | filecheck %s --enable-var-scope
# RUN: %python %s | tessera-opt --split-input-file | filecheck %s --enable-var-scope

# Tracing a two-layer MLP with ts.jit gives the Graph IR of the design document: one
# graph op per array operation, argument names from the Python signature, shapes and
# dtypes from the example arguments. The second RUN line re-parses the printed IR.

import numpy as np
import torch

import tessera as ts
from tessera import op


@ts.jit
def mlp(x, w1, b1, w2, approximate="none"):
    h = op.matmul(x, w1) + b1
    g = op.gelu(h, approximate=approximate)
    y = g @ w2
    return op.softmax(y, axis=-1)


def zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


# The MLP of the design document, in f32: the bias add broadcasts [256] over the rows,
# gelu is exact by default and softmax's axis -1 is stored as 1.
# CHECK-LABEL: func.func @mlp
# CHECK-SAME: (%[[X:.*]]: tensor<16x64xf32>, %[[W1:.*]]: tensor<64x256xf32>, %[[B1:.*]]: tensor<256xf32>, %[[W2:.*]]: tensor<256x10xf32>) -> tensor<16x10xf32> {
# CHECK-NEXT: %[[H:.*]] = graph.matmul %[[X]], %[[W1]] : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>{{$}}
# CHECK-NEXT: %[[HB:.*]] = graph.add %[[H]], %[[B1]] : tensor<16x256xf32>, tensor<256xf32> -> tensor<16x256xf32>{{$}}
# CHECK-NEXT: %[[G:.*]] = graph.gelu %[[HB]] {approximate = none} : tensor<16x256xf32>{{$}}
# CHECK-NEXT: %[[Y:.*]] = graph.matmul %[[G]], %[[W2]] : tensor<16x256xf32>, tensor<256x10xf32> -> tensor<16x10xf32>{{$}}
# CHECK-NEXT: %[[P:.*]] = graph.softmax %[[Y]] {axis = 1} : tensor<16x10xf32>{{$}}
# CHECK-NEXT: func.return %[[P]] : tensor<16x10xf32>{{$}}
print(mlp.lower(zeros(16, 64), zeros(64, 256), zeros(256), zeros(256, 10)).as_text("traced"))
print("// -----")

# The same function traced for another signature (torch bf16 arrays, batch 8, and a static
# keyword argument): a new program whose types follow the arrays and whose gelu is tanh.
# CHECK-LABEL: func.func @mlp
# CHECK-SAME: (%[[X:.*]]: tensor<8x64xbf16>, %[[W1:.*]]: tensor<64x256xbf16>, %[[B1:.*]]: tensor<256xbf16>, %[[W2:.*]]: tensor<256x10xbf16>) -> tensor<8x10xbf16> {
# CHECK-NEXT: %[[H:.*]] = graph.matmul %[[X]], %[[W1]] : tensor<8x64xbf16>, tensor<64x256xbf16> -> tensor<8x256xbf16>{{$}}
# CHECK-NEXT: %[[HB:.*]] = graph.add %[[H]], %[[B1]] : tensor<8x256xbf16>, tensor<256xbf16> -> tensor<8x256xbf16>{{$}}
# CHECK-NEXT: %[[G:.*]] = graph.gelu %[[HB]] {approximate = tanh} : tensor<8x256xbf16>{{$}}
# CHECK-NEXT: %[[Y:.*]] = graph.matmul %[[G]], %[[W2]] : tensor<8x256xbf16>, tensor<256x10xbf16> -> tensor<8x10xbf16>{{$}}
# CHECK-NEXT: %[[P:.*]] = graph.softmax %[[Y]] {axis = 1} : tensor<8x10xbf16>{{$}}
# CHECK-NEXT: func.return %[[P]] : tensor<8x10xbf16>{{$}}
shapes = [(8, 64), (64, 256), (256,), (256, 10)]
args = [torch.zeros(shape, dtype=torch.bfloat16) for shape in shapes]
print(mlp.lower(*args, approximate="tanh").as_text("traced"))
