// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// graph.iota: the dimension is one of the result's, the result is not bool, and the
// start is one i32 scalar.

func.func @dimension_out_of_range() -> tensor<4x8xi64> {
  %i = graph.iota {dimension = 2} : tensor<4x8xi64>
  func.return %i : tensor<4x8xi64>
}
// CHECK: graph.iota: dimension 2 is out of range for shape [4, 8]

// -----

func.func @bool_result() -> tensor<8xi1> {
  %i = graph.iota {dimension = 0} : tensor<8xi1>
  func.return %i : tensor<8xi1>
}
// CHECK: graph.iota: expected an integer or float result, found i1

// -----

func.func @start_not_a_scalar(%s: tensor<2xi32>) -> tensor<8xi32> {
  %i = graph.iota %s {dimension = 0} : tensor<2xi32> -> tensor<8xi32>
  func.return %i : tensor<8xi32>
}
// CHECK: graph.iota: expected at most one start, an i32 scalar, found tensor<2xi32>
