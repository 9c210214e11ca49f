// RUN: tessera-opt %s --split-input-file -p autodiff | filecheck %s
// RUN: echo 'func.func @vector(%%x: tensor<2xf32>) -> tensor<2xf32> { func.return %%x : tensor<2xf32> }' | not tessera-opt -p autodiff 2>&1 | filecheck %s --check-prefix=ERR

// Reverse mode: @f_grad returns the loss and the gradients of x and w; the backward
// program follows the forward one: d sum = 1 broadcast, d tanh = 1 - t², then
// dx = dh wᵀ and dw = xᵀ dh.

// CHECK-LABEL: func.func @f_grad(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>) -> (tensor<f32>, tensor<4x8xf32>, tensor<8x3xf32>)
// CHECK:         %[[T:.*]] = graph.tanh
// CHECK:         %[[S:.*]] = graph.sum %[[T]]
// CHECK:         %[[SEED:.*]] = graph.constant dense<1.000000e+00> : tensor<f32>
// CHECK:         %[[TT:.*]] = graph.mul %[[T]], %[[T]]
// CHECK:         %[[DH:.*]] = graph.mul %{{.*}}, %{{.*}} : tensor<4x3xf32>
// CHECK:         %[[WT:.*]] = graph.transpose %w {perm = [1, 0]}
// CHECK:         %[[DX:.*]] = graph.matmul %[[DH]], %[[WT]]
// CHECK:         %[[XT:.*]] = graph.transpose %x {perm = [1, 0]}
// CHECK:         %[[DW:.*]] = graph.matmul %[[XT]], %[[DH]]
// CHECK:         func.return %[[S]], %[[DX]], %[[DW]]
func.func @f(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>) -> tensor<f32> {
  %h = graph.matmul %x, %w : tensor<4x8xf32>, tensor<8x3xf32> -> tensor<4x3xf32>
  %t = graph.tanh %h : tensor<4x3xf32>
  %s = graph.sum %t {axes = [0, 1], keepdims = false} : tensor<4x3xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}

// -----

// An argument the loss does not use gets a zero gradient.
// CHECK-LABEL: func.func @unused_grad
// CHECK:         %[[Z:.*]] = graph.broadcast_to %{{.*}} : tensor<f32> -> tensor<2xf32>
// CHECK:         func.return %{{.*}}, %{{.*}}, %[[Z]]
func.func @unused(%x: tensor<2xf32>, %y: tensor<2xf32>) -> tensor<f32> {
  %s = graph.sum %x {axes = [0], keepdims = false} : tensor<2xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}

// -----

// No gradient flows through graph.stop_gradient: x's gradient is only the direct term
// (the stopped path's tanh gets no cotangent, so no backward op reads it).
// CHECK-LABEL: func.func @stopped_grad
// CHECK:         %[[T:.*]] = graph.tanh %x
// CHECK:         %[[STOP:.*]] = graph.stop_gradient %[[T]]
// CHECK-NOT:     graph.mul %[[T]], %[[T]]
// CHECK:         func.return
func.func @stopped(%x: tensor<4xf32>) -> tensor<f32> {
  %t = graph.tanh %x : tensor<4xf32>
  %c = graph.stop_gradient %t : tensor<4xf32>
  %p = graph.mul %x, %c : tensor<4xf32>
  %s = graph.sum %p {axes = [0], keepdims = false} : tensor<4xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}

// The loss must be a float scalar.
// ERR: error: autodiff: @vector_grad: the loss (first result) must be a float scalar to differentiate, found tensor<2xf32>

// -----

// A constraint tagged graph.regather (a ZeRO-3 parameter's gather) is not kept for the
// backward: the backward constrains the argument again just before its first use there,
// tagged graph.remat with the same id (so cse keeps it apart); the forward's keeps its tag.
// CHECK-LABEL: func.func @regather_grad
// CHECK-NEXT:    %[[G:.*]] = graph.shard %w {sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} attributes {graph.regather = 7 : i64} : tensor<8x8xf32>
// CHECK-NEXT:    graph.matmul %x, %[[G]]
// CHECK:         %[[B:.*]] = graph.shard %w {sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} attributes {graph.remat = 7 : i64} : tensor<8x8xf32>
// CHECK-NEXT:    graph.transpose %[[B]]
graph.mesh @mesh axes = [dp = 2]
func.func @regather(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<f32> {
  %g = graph.shard %w {sharding = #graph.sharding<@mesh, [[], []]>} attributes {graph.regather = 7 : i64} : tensor<8x8xf32>
  %y = graph.matmul %x, %g : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %t = graph.tanh %y : tensor<4x8xf32>
  %s = graph.sum %t {axes = [0, 1], keepdims = false} : tensor<4x8xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}
