// RUN: tessera-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// Malformed custom syntax of graph ops: each case is a parse error at FILE:LINE:COL with
// a message that says what the parser expected.

// The type signature after `:` is not optional.
func.func @missing_signature(%x: tensor<4xf32>) {
  %0 = graph.exp %x
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:3
  // CHECK: Expected ':'
  func.return
}

// -----

// A `:` without a type.
func.func @missing_type(%x: tensor<4xf32>) {
  %0 = graph.exp %x :
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:3
  // CHECK: type expected
  func.return
}

// -----

// Several types without `->`: the one-type form has exactly one type.
func.func @two_types_without_arrow(%a: tensor<4xf32>, %b: tensor<4xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:27
  // CHECK: expected one type shared by operands and result, or 'operand types -> result type', found 2 types
  %0 = graph.add %a, %b : tensor<4xf32>, tensor<4xf32>
  func.return
}

// -----

// Fewer operand types than operands.
func.func @too_few_operand_types(%a: tensor<4xf32>, %b: tensor<4xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:27
  // CHECK: expected 2 operand types, found 1
  %0 = graph.add %a, %b : tensor<4xf32> -> tensor<4xf32>
  func.return
}

// -----

// More operand types than operands.
func.func @too_many_operand_types(%x: tensor<4xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:23
  // CHECK: expected 1 operand types, found 2
  %0 = graph.neg %x : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  func.return
}

// -----

// An operand type that contradicts the operand's definition.
func.func @operand_type_mismatch(%x: tensor<4xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:18
  // CHECK: operand is used with type tensor<8xf32>, but has been previously used or defined with type tensor<4xf32>
  %0 = graph.neg %x : tensor<8xf32>
  func.return
}

// -----

// `->` without a result type.
func.func @missing_result_type(%x: tensor<4xf32>) {
  %0 = graph.cast %x : tensor<4xf32> ->
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:3
  // CHECK: type expected
  func.return
}

// -----

// A result type list that is not closed.
func.func @unclosed_result_list(%x: tensor<4xf32>) {
  %0:2 = graph.split %x {axis = 0} : tensor<4xf32> -> (tensor<2xf32>, tensor<2xf32>
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:3
  // CHECK: Expected ')'
  func.return
}

// -----

// A trailing comma in the operand list.
func.func @trailing_operand_comma(%x: tensor<4xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:22
  // CHECK: operand expected
  %0 = graph.neg %x, : tensor<4xf32>
  func.return
}

// -----

// A property without a value.
func.func @property_without_value(%x: tensor<4x8xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:33
  // CHECK: attribute expected
  %0 = graph.softmax %x {axis = } : tensor<4x8xf32>
  func.return
}

// -----

// A property without `=`.
func.func @property_without_equals(%x: tensor<4x8xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:31
  // CHECK: Expected '='
  %0 = graph.softmax %x {axis 1} : tensor<4x8xf32>
  func.return
}

// -----

// A property name is an identifier.
func.func @property_name_not_identifier(%x: tensor<4x8xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:26
  // CHECK: identifier expected for a property name
  %0 = graph.softmax %x {1 = 2} : tensor<4x8xf32>
  func.return
}

// -----

// An integer list property holds integers only.
func.func @integer_list_with_name(%x: tensor<4x8xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:33
  // CHECK: Expected integer literal in an integer list
  %0 = graph.sum %x {axes = [1, x], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  func.return
}

// -----

// The property dictionary is closed before the signature.
func.func @unclosed_properties(%x: tensor<4x8xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:35
  // CHECK: Expected '}'
  %0 = graph.softmax %x {axis = 1 : tensor<4x8xf32>
  func.return
}

// -----

// graph.constant takes a dense elements value, not a scalar attribute.
func.func @constant_scalar() {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:23
  // CHECK: expected a dense elements attribute, found 1.000000e+00 : f32
  %0 = graph.constant 1.0 : f32
  func.return
}

// -----

// graph.constant without its value.
func.func @constant_without_value() {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:23
  // CHECK: attribute expected
  %0 = graph.constant : tensor<f32>
  func.return
}

// -----

// An op the graph dialect does not define.
func.func @unknown_op(%x: tensor<4xf32>) {
  // CHECK: syntax-errors.mlir:[[# @LINE + 2]]:25
  // CHECK: Operation graph.frobnicate is not registered
  %0 = graph.frobnicate %x : tensor<4xf32>
  func.return
}
