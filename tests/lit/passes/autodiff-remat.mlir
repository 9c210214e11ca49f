// RUN: tessera-opt %s --split-input-file -p autodiff | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'autodiff{remat="matmuls"}' | filecheck %s --check-prefix=MATMULS
// RUN: tessera-opt %s --split-input-file -p 'autodiff{remat="everything"}' | filecheck %s --check-prefix=OFF
// RUN: not tessera-opt %s --split-input-file -p 'autodiff{remat="all"}' 2>&1 | filecheck %s --check-prefix=ERR

// A checkpointed block (graph.checkpoint = 0): by default nothing inside it is saved,
// so the backward recomputes the matmul and the tanh (tagged graph.remat) before the
// block's VJPs, which read the recomputed tanh; the block's inputs and its output %q
// (used after it) are kept.

// CHECK-LABEL: func.func @f_grad
// CHECK:         %[[H:.*]] = graph.matmul %x, %w :
// CHECK:         %[[T:.*]] = graph.tanh %[[H]] :
// CHECK:         %[[Q:.*]] = graph.mul %[[T]], %[[T]] :
// CHECK:         %[[S:.*]] = graph.sum %[[Q]]
// CHECK:         %[[RH:.*]] = graph.matmul %x, %w attributes {graph.remat = 0 : i64}
// CHECK:         %[[RT:.*]] = graph.tanh %[[RH]] attributes {graph.remat = 0 : i64}
// CHECK-NOT:     graph.mul %[[T]]
// CHECK:         graph.mul %{{.*}}, %[[RT]] attributes {graph.remat = 0 : i64}
// CHECK:         func.return %[[S]]

// With remat=matmuls the matmul's result is saved: only the tanh is recomputed.
// MATMULS-LABEL: func.func @f_grad
// MATMULS:         %[[H:.*]] = graph.matmul %x, %w :
// MATMULS-NOT:     graph.matmul %x, %w attributes
// MATMULS:         %[[RT:.*]] = graph.tanh %[[H]] attributes {graph.remat = 0 : i64}
// MATMULS:         graph.mul %{{.*}}, %[[RT]] attributes {graph.remat = 0 : i64}

// With remat=everything nothing is recomputed.
// OFF-LABEL: func.func @f_grad
// OFF-NOT:     graph.remat

// ERR: autodiff: remat: save must be one of ('nothing', 'matmuls', 'everything'), found 'all'
func.func @f(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>) -> tensor<f32> {
  %h = graph.matmul %x, %w attributes {graph.checkpoint = 0 : i64} : tensor<4x8xf32>, tensor<8x3xf32> -> tensor<4x3xf32>
  %t = graph.tanh %h attributes {graph.checkpoint = 0 : i64} : tensor<4x3xf32>
  %q = graph.mul %t, %t attributes {graph.checkpoint = 0 : i64} : tensor<4x3xf32>
  %s = graph.sum %q {axes = [0, 1], keepdims = false} : tensor<4x3xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}
