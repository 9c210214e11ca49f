// RUN: tessera-opt %s --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file --print-op-generic | tessera-opt --split-input-file | filecheck %s

// Philox bits of a key's two words and a counter per element (ts.random.uniform's
// global row-major index), in the custom and the generic form.
// CHECK-LABEL: func.func @bits
// CHECK:         graph.random_bits %{{.*}}, %{{.*}}, %{{.*}} {stream = 0} : tensor<i32>, tensor<i32>, tensor<4x8xi32> -> tensor<4x8xi32>
func.func @bits(%k0: tensor<i32>, %k1: tensor<i32>, %counter: tensor<4x8xi32>) -> tensor<4x8xi32> {
  %b = graph.random_bits %k0, %k1, %counter {stream = 0} : tensor<i32>, tensor<i32>, tensor<4x8xi32> -> tensor<4x8xi32>
  func.return %b : tensor<4x8xi32>
}

// -----

// Operands broadcast (numpy rules); a split key's stream.
// CHECK-LABEL: func.func @broadcast
// CHECK:         graph.random_bits %{{.*}}, %{{.*}}, %{{.*}} {stream = 1} : tensor<i32>, tensor<i32>, tensor<4x1xi32> -> tensor<4x1xi32>
// CHECK:         graph.random_bits %{{.*}}, %{{.*}}, %{{.*}} {stream = 2} : tensor<3x1xi32>, tensor<i32>, tensor<1x5xi32> -> tensor<3x5xi32>
func.func @broadcast(%k: tensor<i32>, %a: tensor<4x1xi32>, %rows: tensor<3x1xi32>, %cols: tensor<1x5xi32>) {
  %b = graph.random_bits %k, %k, %a {stream = 1} : tensor<i32>, tensor<i32>, tensor<4x1xi32> -> tensor<4x1xi32>
  %c = graph.random_bits %rows, %k, %cols {stream = 2} : tensor<3x1xi32>, tensor<i32>, tensor<1x5xi32> -> tensor<3x5xi32>
  func.return
}
