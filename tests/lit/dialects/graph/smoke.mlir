// RUN: tessera-opt %s | filecheck %s
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s

// CHECK-LABEL: func.func @smoke
func.func @smoke(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // CHECK: %[[Y:.*]] = graph.tanh %{{.*}} : tensor<4x8xf32>
  %y = graph.tanh %x : tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}
