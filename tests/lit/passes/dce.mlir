// RUN: tessera-opt %s --split-input-file -p dce | filecheck %s

// A pure op whose result is unused is erased; used ops and the return stay.
// CHECK-LABEL: func.func @unused_op
// CHECK-SAME:    (%[[X:.*]]: tensor<4xf32>)
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[X]] : tensor<4xf32>
// CHECK-NOT:     graph.tanh
// CHECK-NEXT:    func.return %[[E]]
func.func @unused_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = graph.exp %x : tensor<4xf32>
  %t = graph.tanh %x : tensor<4xf32>
  func.return %e : tensor<4xf32>
}

// -----

// A chain that only feeds dead ops is dead as a whole, including its constants.
// CHECK-LABEL: func.func @dead_chain
// CHECK-NOT:     graph.
// CHECK:         func.return
func.func @dead_chain(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %c = graph.constant dense<2.0> : tensor<4x4xf32>
  %a = graph.mul %x, %c : tensor<4x4xf32>
  %b = graph.matmul %a, %a : tensor<4x4xf32>
  %s = graph.sum %b {axes = [0], keepdims = false} : tensor<4x4xf32> -> tensor<4xf32>
  func.return %x : tensor<4x4xf32>
}

// -----

// Of a multi-result op, one used result keeps the op alive.
// CHECK-LABEL: func.func @partly_used_split
// CHECK:         %{{.*}}, %[[P1:.*]] = graph.split
// CHECK-NEXT:    func.return %[[P1]]
func.func @partly_used_split(%x: tensor<4x8xf32>) -> tensor<4x4xf32> {
  %p:2 = graph.split %x {axis = 1} : tensor<4x8xf32> -> (tensor<4x4xf32>, tensor<4x4xf32>)
  func.return %p#1 : tensor<4x4xf32>
}

// -----

// Functions and meshes are symbols: unused ones are kept.
// CHECK:       graph.mesh @mesh
// CHECK-LABEL: func.func @unused_function
// CHECK:         graph.neg
graph.mesh @mesh axes = [dp = 2]
func.func @unused_function(%x: tensor<4xf32>) -> tensor<4xf32> {
  %n = graph.neg %x : tensor<4xf32>
  func.return %n : tensor<4xf32>
}
