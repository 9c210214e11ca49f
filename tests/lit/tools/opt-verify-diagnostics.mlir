// --verify-diagnostics prints the verifier error on stdout and exits 0 (xDSL's behaviour,
// which the dialects' invalid.mlir tests rely on).
// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// CHECK: graph.sum: axes must be in [0, 1) for operand tensor<4xf32>, found [3]
func.func @bad_axes(%x: tensor<4xf32>) -> tensor<f32> {
  %s = graph.sum %x {axes = [3], keepdims = false} : tensor<4xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}
