// RUN: not tessera-opt %s 2>&1 | filecheck %s

// A graph.axis_index outside a partitioned function is a verifier error at the op's
// line and column.
// CHECK-NOT: Traceback
// CHECK: axis-index-located.mlir:[[# @LINE + 4]]:3: error: graph.axis_index: a rank's position exists only in a partitioned (per-rank) function
// CHECK-NOT: Traceback
graph.mesh @mesh axes = [tp = 4]
func.func @f() -> tensor<i32> {
  %a = graph.axis_index {axes = [tp]} : tensor<i32>
  func.return %a : tensor<i32>
}
