// RUN: not tessera-opt %s 2>&1 | filecheck %s

// An op that no registered dialect defines is a parse error at the op.
// CHECK-NOT: Traceback
// CHECK:     opt-unknown-op.mlir:[[# @LINE + 3]]:{{[0-9]+}}: error: Operation graph.frobnicate is not registered
// CHECK-NOT: Traceback
func.func @unknown(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.frobnicate %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
