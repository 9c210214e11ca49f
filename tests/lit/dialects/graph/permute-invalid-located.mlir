// RUN: not tessera-opt %s 2>&1 | filecheck %s

// An invalid permutation is a verifier error at the op's line and column.
// CHECK-NOT: Traceback
// CHECK: permute-invalid-located.mlir:[[# @LINE + 4]]:3: error: graph.collective_permute: rank position 2 is the target of more than one pair
// CHECK-NOT: Traceback
graph.mesh @mesh axes = [tp = 4]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 2], [1, 2]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
