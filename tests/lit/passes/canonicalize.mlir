// RUN: tessera-opt %s --split-input-file -p canonicalize | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'canonicalize{max-fold-elements=2}' | filecheck %s --check-prefix=LIMIT

// Constant folding evaluates an op on constant operands with the reference semantics.
// CHECK-LABEL: func.func @fold_add_f32
// CHECK-NEXT:    %[[C:.*]] = graph.constant dense<[1.500000e+00, 3.000000e+00, 4.500000e+00]> : tensor<3xf32>
// CHECK-NEXT:    func.return %[[C]] : tensor<3xf32>
func.func @fold_add_f32() -> tensor<3xf32> {
  %a = graph.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = graph.constant dense<[0.5, 1.0, 1.5]> : tensor<3xf32>
  %c = graph.add %a, %b : tensor<3xf32>
  func.return %c : tensor<3xf32>
}

// -----

// A uniform folded result prints as a splat, in the result's dtype (bf16 here).
// CHECK-LABEL: func.func @fold_mul_bf16_splat
// CHECK-NEXT:    %[[C:.*]] = graph.constant dense<3.000000e+00> : tensor<2x2xbf16>
// CHECK-NEXT:    func.return %[[C]] : tensor<2x2xbf16>
func.func @fold_mul_bf16_splat() -> tensor<2x2xbf16> {
  %a = graph.constant dense<1.5> : tensor<2x2xbf16>
  %b = graph.constant dense<2.0> : tensor<2x2xbf16>
  %c = graph.mul %a, %b : tensor<2x2xbf16>
  func.return %c : tensor<2x2xbf16>
}

// -----

// A comparison folds to an i1 constant.
// CHECK-LABEL: func.func @fold_compare_i1
// CHECK-NEXT:    %[[C:.*]] = graph.constant dense<[true, false, false]> : tensor<3xi1>
// CHECK-NEXT:    func.return %[[C]] : tensor<3xi1>
func.func @fold_compare_i1() -> tensor<3xi1> {
  %a = graph.constant dense<[1, 5, 7]> : tensor<3xi32>
  %b = graph.constant dense<[2, 5, 6]> : tensor<3xi32>
  %c = graph.compare %a, %b {predicate = lt} : tensor<3xi32>, tensor<3xi32> -> tensor<3xi1>
  func.return %c : tensor<3xi1>
}

// -----

// A reduction of an integer constant folds to a rank-0 constant of the same dtype.
// CHECK-LABEL: func.func @fold_sum_i64
// CHECK-NEXT:    %[[C:.*]] = graph.constant dense<21> : tensor<i64>
// CHECK-NEXT:    func.return %[[C]] : tensor<i64>
func.func @fold_sum_i64() -> tensor<i64> {
  %a = graph.constant dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi64>
  %s = graph.sum %a {axes = [0, 1], keepdims = false} : tensor<2x3xi64> -> tensor<i64>
  func.return %s : tensor<i64>
}

// -----

// Folding is greedy: a chain of ops on constants (cast to f16, then neg) becomes one constant.
// CHECK-LABEL: func.func @fold_chain_f16
// CHECK-NEXT:    %[[C:.*]] = graph.constant dense<[-2.500000e-01, 4.000000e+00]> : tensor<2xf16>
// CHECK-NEXT:    func.return %[[C]] : tensor<2xf16>
func.func @fold_chain_f16() -> tensor<2xf16> {
  %a = graph.constant dense<[0.25, -4.0]> : tensor<2xf32>
  %h = graph.cast %a : tensor<2xf32> -> tensor<2xf16>
  %n = graph.neg %h : tensor<2xf16>
  func.return %n : tensor<2xf16>
}

// -----

// An op with a non-constant operand does not fold.
// CHECK-LABEL: func.func @no_fold_non_constant
// CHECK:         %[[C:.*]] = graph.constant dense<2.000000e+00> : tensor<4xf32>
// CHECK-NEXT:    %[[Y:.*]] = graph.mul %{{.*}}, %[[C]] : tensor<4xf32>
// CHECK-NEXT:    func.return %[[Y]]
func.func @no_fold_non_constant(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = graph.constant dense<2.0> : tensor<4xf32>
  %y = graph.mul %x, %c : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

// A result larger than max-fold-elements (default 1024) stays an op: 64x64 = 4096.
// CHECK-LABEL: func.func @no_fold_large_result
// CHECK:         %[[Y:.*]] = graph.broadcast_to %{{.*}} : tensor<f32> -> tensor<64x64xf32>
// CHECK-NEXT:    func.return %[[Y]]
func.func @no_fold_large_result() -> tensor<64x64xf32> {
  %c = graph.constant dense<1.0> : tensor<f32>
  %y = graph.broadcast_to %c : tensor<f32> -> tensor<64x64xf32>
  func.return %y : tensor<64x64xf32>
}

// -----

// The fold limit is a pass option: with max-fold-elements=2, three elements stay an op.
// CHECK-LABEL: func.func @fold_limit_option
// CHECK-NEXT:    %[[C:.*]] = graph.constant dense<[0.000000e+00, 1.000000e+00, 2.000000e+00]>
// CHECK-NEXT:    func.return %[[C]]
// LIMIT-LABEL: func.func @fold_limit_option
// LIMIT:         %[[Y:.*]] = graph.abs %{{.*}} : tensor<3xf32>
// LIMIT-NEXT:    func.return %[[Y]]
func.func @fold_limit_option() -> tensor<3xf32> {
  %c = graph.constant dense<[0.0, -1.0, 2.0]> : tensor<3xf32>
  %y = graph.abs %c : tensor<3xf32>
  func.return %y : tensor<3xf32>
}

// -----

// A sharding constraint of a constant is not folded: it would lose the sharding.
// CHECK-LABEL: func.func @no_fold_sharding_constraint
// CHECK:         graph.shard
graph.mesh @mesh axes = [tp = 2]
func.func @no_fold_sharding_constraint() -> tensor<4xf32> {
  %c = graph.constant dense<1.0> : tensor<4xf32>
  %y = graph.shard %c {sharding = #graph.sharding<@mesh, [[tp]]>} : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

// reshape(reshape(x)) is one reshape from x to the final shape.
// CHECK-LABEL: func.func @reshape_of_reshape
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NEXT:    %[[Y:.*]] = graph.reshape %[[X]] : tensor<4x8xf32> -> tensor<32xf32>
// CHECK-NEXT:    func.return %[[Y]]
func.func @reshape_of_reshape(%x: tensor<4x8xf32>) -> tensor<32xf32> {
  %a = graph.reshape %x : tensor<4x8xf32> -> tensor<2x16xf32>
  %b = graph.reshape %a : tensor<2x16xf32> -> tensor<32xf32>
  func.return %b : tensor<32xf32>
}

// -----

// reshape(reshape(x)) back to x's shape is x.
// CHECK-LABEL: func.func @reshape_round_trip
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NEXT:    func.return %[[X]]
func.func @reshape_round_trip(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %a = graph.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %b = graph.reshape %a : tensor<32xf32> -> tensor<4x8xf32>
  func.return %b : tensor<4x8xf32>
}

// -----

// transpose(transpose(x, p), q) is one transpose by the composed permutation p[q[i]].
// CHECK-LABEL: func.func @transpose_of_transpose
// CHECK-SAME:    (%[[X:.*]]: tensor<2x3x4xf32>)
// CHECK-NEXT:    %[[Y:.*]] = graph.transpose %[[X]] {perm = [2, 1, 0]} : tensor<2x3x4xf32> -> tensor<4x3x2xf32>
// CHECK-NEXT:    func.return %[[Y]]
func.func @transpose_of_transpose(%x: tensor<2x3x4xf32>) -> tensor<4x3x2xf32> {
  %a = graph.transpose %x {perm = [1, 2, 0]} : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
  %b = graph.transpose %a {perm = [1, 0, 2]} : tensor<3x4x2xf32> -> tensor<4x3x2xf32>
  func.return %b : tensor<4x3x2xf32>
}

// -----

// Transposes that compose to the identity permutation disappear.
// CHECK-LABEL: func.func @transpose_round_trip
// CHECK-SAME:    (%[[X:.*]]: tensor<2x3x4xf32>)
// CHECK-NOT:     graph.transpose
// CHECK:         func.return %[[X]]
func.func @transpose_round_trip(%x: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  %a = graph.transpose %x {perm = [1, 2, 0]} : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
  %b = graph.transpose %a {perm = [2, 0, 1]} : tensor<3x4x2xf32> -> tensor<2x3x4xf32>
  func.return %b : tensor<2x3x4xf32>
}

// -----

// Layout ops that return their operand unchanged are removed: reshape, broadcast_to and
// cast to the operand's own type, transpose by the identity, a whole slice with stride 1.
// CHECK-LABEL: func.func @identity_layout
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NOT:     graph.
// CHECK:         func.return %[[X]], %[[X]], %[[X]], %[[X]], %[[X]]
func.func @identity_layout(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %r = graph.reshape %x : tensor<4x8xf32> -> tensor<4x8xf32>
  %b = graph.broadcast_to %x : tensor<4x8xf32> -> tensor<4x8xf32>
  %c = graph.cast %x : tensor<4x8xf32> -> tensor<4x8xf32>
  %t = graph.transpose %x {perm = [0, 1]} : tensor<4x8xf32> -> tensor<4x8xf32>
  %s = graph.slice %x {starts = [0, 0], limits = [4, 8], strides = [1, 1]} : tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %r, %b, %c, %t, %s : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Look-alikes that do change the value stay: a square transpose, a strided slice.
// CHECK-LABEL: func.func @not_identity_layout
// CHECK:         graph.transpose
// CHECK:         graph.slice
func.func @not_identity_layout(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<2x4xf32>) {
  %t = graph.transpose %x {perm = [1, 0]} : tensor<4x4xf32> -> tensor<4x4xf32>
  %s = graph.slice %x {starts = [0, 0], limits = [4, 4], strides = [2, 1]} : tensor<4x4xf32> -> tensor<2x4xf32>
  func.return %t, %s : tensor<4x4xf32>, tensor<2x4xf32>
}

// -----

// A concat of a single operand is that operand.
// CHECK-LABEL: func.func @single_concat
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NOT:     graph.concat
// CHECK:         func.return %[[X]]
func.func @single_concat(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c = graph.concat %x {axis = 1} : tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %c : tensor<4x8xf32>
}

// -----

// x + 0 and 1 * x are x (the zero broadcasts from a smaller shape); the unused constants go.
// CHECK-LABEL: func.func @neutral_operands
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NOT:     graph.
// CHECK:         func.return %[[X]], %[[X]]
func.func @neutral_operands(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %zero = graph.constant dense<0.0> : tensor<8xf32>
  %one = graph.constant dense<1.0> : tensor<4x8xf32>
  %a = graph.add %x, %zero : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  %m = graph.mul %one, %x : tensor<4x8xf32>
  func.return %a, %m : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// x + 0 stays when the zero changes the result type (it broadcasts x to a larger shape).
// CHECK-LABEL: func.func @neutral_operand_broadcasts
// CHECK:         %[[Y:.*]] = graph.add
// CHECK-NEXT:    func.return %[[Y]]
func.func @neutral_operand_broadcasts(%x: tensor<8xf32>) -> tensor<4x8xf32> {
  %zero = graph.constant dense<0.0> : tensor<4x8xf32>
  %a = graph.add %x, %zero : tensor<8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %a : tensor<4x8xf32>
}

// -----

// Pure ops whose results are unused are erased.
// CHECK-LABEL: func.func @dead_ops
// CHECK-NOT:     graph.
// CHECK:         func.return
func.func @dead_ops(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = graph.exp %x : tensor<4xf32>
  %t = graph.tanh %e : tensor<4xf32>
  func.return %x : tensor<4xf32>
}
