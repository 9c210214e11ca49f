// RUN: tessera-opt %s --split-input-file -p 'autodiff{function="loss" in_place=true},dce' | filecheck %s

// A call's VJP is a call of the region's derivative: @square_fwd (its results and the
// residuals the backward reads: none here, it reads its argument) and @square_bwd; the
// region itself is called no more and goes.
// CHECK-LABEL: func.func @loss
// CHECK:         %[[A:.*]] = graph.call @square_fwd(%x)
// CHECK:         graph.call @square_fwd(%[[A]])
// CHECK:         %[[G:.*]] = graph.call @square_bwd(%[[A]], %{{.*}})
// CHECK:         graph.call @square_bwd(%x, %[[G]])
// CHECK:       func.func private @square_fwd
// CHECK:       func.func private @square_bwd(%x: tensor<4xf32>, %{{.*}}: tensor<4xf32>)
// CHECK-NOT:   func.func private @square(
func.func @loss(%x: tensor<4xf32>) -> tensor<f32> {
  %0 = graph.call @square(%x) : (tensor<4xf32>) -> (tensor<4xf32>)
  %1 = graph.call @square(%0) : (tensor<4xf32>) -> (tensor<4xf32>)
  %2 = graph.sum %1 {axes = [0], keepdims = false} : tensor<4xf32> -> tensor<f32>
  func.return %2 : tensor<f32>
}
func.func private @square(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.mul %x, %x : tensor<4xf32>
  func.return %0 : tensor<4xf32>
}

// -----

// A scan's VJP: the forward scan also stacks the residuals (tanh's result) and the
// carries each step received; the backward scans the step's derivative in reverse, the
// carry's cotangent as its carry, and returns the stacked weights' gradient.
// CHECK-LABEL: func.func @loss
// CHECK:         %[[C:.*]], %[[R:.*]], %[[H:.*]] = graph.scan @step_fwd(%h, %ws) {carries = 1, length = 3, reverse = false}
// CHECK:         %[[DH:.*]], %[[DW:.*]] = graph.scan @step_bwd(%{{.*}}, %[[H]], %ws, %[[R]]) {carries = 1, length = 3, reverse = true}
// CHECK:         func.return %{{.*}}, %[[DH]], %[[DW]] : tensor<f32>, tensor<4xf32>, tensor<3x4xf32>
// CHECK:       func.func private @step_fwd(%h: tensor<4xf32>, %w: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
// CHECK:         func.return %{{.*}}, %{{.*}}, %h
// CHECK:       func.func private @step_bwd
func.func @loss(%h: tensor<4xf32>, %ws: tensor<3x4xf32>) -> tensor<f32> {
  %0 = graph.scan @step(%h, %ws) {carries = 1, length = 3, reverse = false} : (tensor<4xf32>, tensor<3x4xf32>) -> (tensor<4xf32>)
  %1 = graph.sum %0 {axes = [0], keepdims = false} : tensor<4xf32> -> tensor<f32>
  func.return %1 : tensor<f32>
}
func.func private @step(%h: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.mul %h, %w : tensor<4xf32>
  %1 = graph.tanh %0 : tensor<4xf32>
  func.return %1 : tensor<4xf32>
}

// -----

// A residual made by a layout op (the transpose of a matmul's result) is not saved: the
// forward returns the matmul's result, and the backward redoes the transpose, which its
// kernels read in place (saved, it would be copied out of the forward).
// CHECK-LABEL: func.func @loss
// CHECK:       func.func private @heads_fwd(%x: tensor<4x6xf32>, %w: tensor<6x6xf32>) -> (tensor<6x4xf32>, tensor<4x6xf32>)
// CHECK:         %[[Y:.*]] = graph.matmul %x, %w
// CHECK:         func.return %{{.*}}, %[[Y]] : tensor<6x4xf32>, tensor<4x6xf32>
// CHECK:       func.func private @heads_bwd(%x: tensor<4x6xf32>, %w: tensor<6x6xf32>, %[[R:.*]]: tensor<4x6xf32>, %{{.*}}: tensor<6x4xf32>)
// CHECK-NEXT:    %[[T:.*]] = graph.transpose %[[R]] {perm = [1, 0]}
// CHECK:         graph.mul %{{.*}}, %[[T]]
func.func @loss(%x: tensor<4x6xf32>, %w: tensor<6x6xf32>) -> tensor<f32> {
  %0 = graph.call @heads(%x, %w) : (tensor<4x6xf32>, tensor<6x6xf32>) -> (tensor<6x4xf32>)
  %1 = graph.sum %0 {axes = [0, 1], keepdims = false} : tensor<6x4xf32> -> tensor<f32>
  func.return %1 : tensor<f32>
}
func.func private @heads(%x: tensor<4x6xf32>, %w: tensor<6x6xf32>) -> tensor<6x4xf32> {
  %0 = graph.matmul %x, %w : tensor<4x6xf32>, tensor<6x6xf32> -> tensor<4x6xf32>
  %1 = graph.transpose %0 {perm = [1, 0]} : tensor<4x6xf32> -> tensor<6x4xf32>
  %2 = graph.mul %1, %1 : tensor<6x4xf32>
  func.return %2 : tensor<6x4xf32>
}
