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

// -----

// An argument a private function never reads leaves it and every graph.call of it (as
// MLIR's remove-dead-values), and the ops that made only that operand go too: a region's
// backward called with a bias it does not read gathers no copy of it. A function a scan
// names keeps its signature.
// CHECK-LABEL: func.func @unread_argument
// CHECK-NEXT:    %[[Y:.*]] = graph.call @backward(%x) : (tensor<4xf32>) -> (tensor<4xf32>)
// CHECK-NEXT:    %[[Z:.*]] = graph.call @backward(%[[Y]]) : (tensor<4xf32>) -> (tensor<4xf32>)
// CHECK-NEXT:    func.return %[[Z]]
// CHECK:       func.func private @backward(%x: tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT:    %{{.*}} = graph.exp %x
func.func @unread_argument(%x: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %copy = graph.exp %b : tensor<4xf32>
  %y = graph.call @backward(%x, %copy) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>)
  %z = graph.call @backward(%y, %b) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>)
  func.return %z : tensor<4xf32>
}
func.func private @backward(%x: tensor<4xf32>, %bias: tensor<4xf32>) -> tensor<4xf32> {
  %e = graph.exp %x : tensor<4xf32>
  func.return %e : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @scanned_step
// CHECK:         graph.scan @step(%h, %ws)
// CHECK:       func.func private @step(%h: tensor<4xf32>, %w: tensor<4xf32>)
func.func @scanned_step(%h: tensor<4xf32>, %ws: tensor<3x4xf32>) -> tensor<4xf32> {
  %0 = graph.scan @step(%h, %ws) {carries = 1, length = 3, reverse = false} : (tensor<4xf32>, tensor<3x4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @step(%h: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {
  func.return %h : tensor<4xf32>
}
