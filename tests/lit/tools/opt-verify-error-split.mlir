// RUN: not tessera-opt %s --split-input-file 2>&1 | filecheck %s

// With --split-input-file, the line is counted in the whole file, not in the piece; an
// error of a non-graph op is prefixed with the op's name.
// CHECK-NOT: Traceback
// CHECK:     opt-verify-error-split.mlir:[[# @LINE + 10]]:3: error: func.return: {{.*}}expected [tensor<8xf32>], got [tensor<4xf32>]
// CHECK-NOT: Traceback
func.func @fine(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.exp %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

func.func @wrong_return_type(%x: tensor<4xf32>) -> tensor<8xf32> {
  func.return %x : tensor<4xf32>
}
