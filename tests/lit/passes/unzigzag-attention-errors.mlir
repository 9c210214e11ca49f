// RUN: not tessera-opt %s -p unzigzag-attention 2>&1 | filecheck %s

// A sequence that does not cut into the order's chunks is the pass's error at the op.

// CHECK: unzigzag-attention-errors.mlir:[[# @LINE + 3]]:{{[0-9]+}}: error: unzigzag-attention: the query sequence here (6 rows) does not cut into the 4 chunks of a zig-zag order over 2 ranks
// CHECK-NOT: Traceback
func.func @uneven(%q: tensor<1x6x4xf32>, %k: tensor<1x6x4xf32>, %v: tensor<1x6x4xf32>) -> tensor<1x6x4xf32> {
  %o, %lse = graph.attention %q, %k, %v {causal = true, scale = 0.5, zigzag = 2} : tensor<1x6x4xf32>, tensor<1x6x4xf32>, tensor<1x6x4xf32> -> (tensor<1x6x4xf32>, tensor<1x6xf32>)
  func.return %o : tensor<1x6x4xf32>
}
