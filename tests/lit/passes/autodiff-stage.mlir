// RUN: tessera-opt %s -p 'autodiff{function="<lambda>" in_place=true remat="nothing" results=2,1 wrt=0}' | filecheck %s
// RUN: tessera-opt %s -p 'autodiff{function="<lambda>" in_place=true remat="nothing" results=2,1 wrt=0},canonicalize,cse,dce' | filecheck %s --check-prefix=GRAPH
// RUN: not tessera-opt %s -p 'autodiff{function="<lambda>" in_place=true results=3 wrt=0}' 2>&1 | filecheck %s --check-prefix=ERR

// The compile driver's autodiff stage of a gradient program, with the options it prints
// for ts.grad(lambda w, x: (op.sum(op.tanh(x @ w)), x @ w), has_aux=True): the traced
// forward returns the loss and the aux value; the stage rewrites @"<lambda>" in place
// (its name stays the program's) to return the gradient of w (result 2 of loss, aux,
// gradient) and then the aux value (result 1); the loss is dropped. The graph stage then
// removes what only the dropped loss and the unused gradient of x needed.

// CHECK-LABEL: func.func @"<lambda>"(%w: tensor<8x3xf32>, %x: tensor<4x8xf32>) -> (tensor<8x3xf32>, tensor<4x3xf32>)
// CHECK:         %h = graph.matmul %x, %w
// CHECK:         %t = graph.tanh %h
// CHECK:         %s = graph.sum %t
// CHECK:         %[[DX:.*]] = graph.matmul %{{.*}}, %{{.*}} : tensor<4x3xf32>, tensor<3x8xf32> -> tensor<4x8xf32>
// CHECK:         %[[XT:.*]] = graph.transpose %x
// CHECK:         %[[DW:.*]] = graph.matmul %[[XT]], %{{.*}} : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
// CHECK:         func.return %[[DW]], %h : tensor<8x3xf32>, tensor<4x3xf32>
// CHECK-NOT:     func.func

// GRAPH-LABEL: func.func @"<lambda>"
// GRAPH-NOT:     graph.sum
// GRAPH-NOT:     graph.transpose %w
// GRAPH:         %[[XT:.*]] = graph.transpose %x
// GRAPH:         %[[DW:.*]] = graph.matmul %[[XT]], %{{.*}} : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
// GRAPH:         func.return %[[DW]], %h

// ERR: error: autodiff: @<lambda>: no result 3 among its 3 results and gradients
func.func @"<lambda>"(%w: tensor<8x3xf32>, %x: tensor<4x8xf32>) -> (tensor<f32>, tensor<4x3xf32>) {
  %h = graph.matmul %x, %w : tensor<4x8xf32>, tensor<8x3xf32> -> tensor<4x3xf32>
  %t = graph.tanh %h : tensor<4x3xf32>
  %s = graph.sum %t {axes = [0, 1], keepdims = false} : tensor<4x3xf32> -> tensor<f32>
  func.return %s, %h : tensor<f32>, tensor<4x3xf32>
}
