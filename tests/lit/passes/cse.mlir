// RUN: tessera-opt %s --split-input-file -p cse | filecheck %s

// Two identical pure ops on the same operands become one.
// CHECK-LABEL: func.func @same_op_twice
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[X]] : tensor<4x8xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.add %[[E]], %[[E]] : tensor<4x8xf32>
// CHECK-NEXT:    func.return %[[S]]
func.func @same_op_twice(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %a = graph.exp %x : tensor<4x8xf32>
  %b = graph.exp %x : tensor<4x8xf32>
  %s = graph.add %a, %b : tensor<4x8xf32>
  func.return %s : tensor<4x8xf32>
}

// -----

// Ops with equal properties are equal: one sum remains.
// CHECK-LABEL: func.func @equal_properties
// CHECK-COUNT-1: graph.sum
// CHECK-NOT:     graph.sum
// CHECK:         func.return
func.func @equal_properties(%x: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %a = graph.sum %x {axes = [1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  %b = graph.sum %x {axes = [1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  func.return %a, %b : tensor<4xf32>, tensor<4xf32>
}

// -----

// Ops whose properties differ are different ops, even on the same operand.
// CHECK-LABEL: func.func @different_properties
// CHECK:         %[[A:.*]] = graph.sum %{{.*}} {axes = [1], keepdims = false}
// CHECK-NEXT:    %[[B:.*]] = graph.sum %{{.*}} {axes = [1], keepdims = true}
// CHECK-NEXT:    %[[C:.*]] = graph.softmax %{{.*}} {axis = 0}
// CHECK-NEXT:    %[[D:.*]] = graph.softmax %{{.*}} {axis = 1}
// CHECK-NEXT:    func.return %[[A]], %[[B]], %[[C]], %[[D]]
func.func @different_properties(%x: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4x1xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %a = graph.sum %x {axes = [1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  %b = graph.sum %x {axes = [1], keepdims = true} : tensor<4x8xf32> -> tensor<4x1xf32>
  %c = graph.softmax %x {axis = 0} : tensor<4x8xf32>
  %d = graph.softmax %x {axis = 1} : tensor<4x8xf32>
  func.return %a, %b, %c, %d : tensor<4xf32>, tensor<4x1xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Equal constants merge; constants with different values or types do not.
// CHECK-LABEL: func.func @constants
// CHECK-NEXT:    %[[ONE:.*]] = graph.constant dense<1.000000e+00> : tensor<4xf32>
// CHECK-NEXT:    %[[TWO:.*]] = graph.constant dense<2.000000e+00> : tensor<4xf32>
// CHECK-NEXT:    %[[ONE16:.*]] = graph.constant dense<1.000000e+00> : tensor<4xf16>
// CHECK-NEXT:    func.return %[[ONE]], %[[ONE]], %[[TWO]], %[[ONE16]]
func.func @constants() -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf16>) {
  %a = graph.constant dense<1.0> : tensor<4xf32>
  %b = graph.constant dense<1.0> : tensor<4xf32>
  %c = graph.constant dense<2.0> : tensor<4xf32>
  %d = graph.constant dense<1.0> : tensor<4xf16>
  func.return %a, %b, %c, %d : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf16>
}

// -----

// Merging cascades: once the operands are merged, their users are equal too.
// CHECK-LABEL: func.func @chains
// CHECK-COUNT-1: graph.tanh
// CHECK-COUNT-1: graph.matmul
// CHECK-NOT:     graph.
// CHECK:         func.return
func.func @chains(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %a = graph.tanh %x : tensor<4x4xf32>
  %b = graph.tanh %x : tensor<4x4xf32>
  %c = graph.matmul %a, %x : tensor<4x4xf32>
  %d = graph.matmul %b, %x : tensor<4x4xf32>
  func.return %c, %d : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Operand order matters: sub(x, y) and sub(y, x) are different.
// CHECK-LABEL: func.func @operand_order
// CHECK-COUNT-2: graph.sub
func.func @operand_order(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %a = graph.sub %x, %y : tensor<4xf32>
  %b = graph.sub %y, %x : tensor<4xf32>
  func.return %a, %b : tensor<4xf32>, tensor<4xf32>
}

// -----

// Ops in different functions are never merged.
// CHECK-LABEL: func.func @first
// CHECK:         graph.exp
// CHECK-LABEL: func.func @second
// CHECK:         graph.exp
func.func @first(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.exp %x : tensor<4xf32>
  func.return %a : tensor<4xf32>
}
func.func @second(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.exp %x : tensor<4xf32>
  func.return %a : tensor<4xf32>
}
