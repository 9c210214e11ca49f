// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// A scan's stacked operand must stack `length` of the step's slices.
// CHECK: graph.scan @step: operand types (tensor<4xf32>, tensor<2x4xf32>) do not match the body's (tensor<4xf32>, tensor<3x4xf32>)
func.func @wrong_length(%h: tensor<4xf32>, %ws: tensor<2x4xf32>) -> tensor<4xf32> {
  %0 = graph.scan @step(%h, %ws) {carries = 1, length = 3, reverse = false} : (tensor<4xf32>, tensor<2x4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @step(%h: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {
  func.return %h : tensor<4xf32>
}

// -----

// A call names a function of the module.
// CHECK: graph.call: no function @missing in the module
func.func @dangling(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.call @missing(%x) : (tensor<4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
