// RUN: not tessera-opt %s 2>&1 | filecheck %s
// RUN: not tessera-opt %s -p canonicalize 2>&1 | filecheck %s

// A verifier error names the line and column where the failing op starts, whether or
// not passes were asked for, and prints no traceback.
// CHECK-NOT: Traceback
// CHECK:     opt-verify-error.mlir:[[# @LINE + 4]]:3: error: graph.matmul: {{.*}}
// CHECK-NOT: Traceback
func.func @bad_matmul(%x: tensor<4x8xf32>, %w: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = graph.tanh %x : tensor<4x8xf32>
  %z = graph.matmul %y, %w : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %z : tensor<4x8xf32>
}
