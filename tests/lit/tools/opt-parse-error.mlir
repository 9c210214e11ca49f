// RUN: not tessera-opt %s 2>&1 | filecheck %s

// A syntax error is reported at its line and column, with the source line underlined,
// and without a Python traceback.
// CHECK-NOT: Traceback
// CHECK:     opt-parse-error.mlir:[[# @LINE + 4]]:37: error: Expected '>' after builtin parameter list
// CHECK-NEXT:  %y = graph.tanh %x : tensor<4xf32 : tensor<4xf32>
// CHECK-NOT: Traceback
func.func @missing_angle(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.tanh %x : tensor<4xf32 : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
