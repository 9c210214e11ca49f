// RUN: tessera-opt %s --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file --print-op-generic | tessera-opt --split-input-file | filecheck %s

// graph.iota: indices along one dim (integer or float), with an optional i32 start; it
// round-trips in the custom and the generic form.
// CHECK-LABEL: func.func @indices
// CHECK:         %[[I:.*]] = graph.iota {dimension = 1} : tensor<4x8xi64>
// CHECK:         %[[F:.*]] = graph.iota {dimension = 0} : tensor<8xf32>
// CHECK:         %[[J:.*]] = graph.iota %{{.*}} {dimension = 0} : tensor<i32> -> tensor<8xi32>
func.func @indices(%s: tensor<i32>) -> (tensor<4x8xi64>, tensor<8xf32>, tensor<8xi32>) {
  %i = graph.iota {dimension = 1} : tensor<4x8xi64>
  %f = graph.iota {dimension = 0} : tensor<8xf32>
  %j = graph.iota %s {dimension = 0} : tensor<i32> -> tensor<8xi32>
  func.return %i, %f, %j : tensor<4x8xi64>, tensor<8xf32>, tensor<8xi32>
}
