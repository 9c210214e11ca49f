// RUN: not tessera-opt %s -p shard-partition 2>&1 | filecheck %s

// Found by the fuzzer: shard-partition without shard-propagate and insert-collectives
// before it gave a softmax over a split dim a replicated result, and the IR it made did
// not verify. The pass checks each op's local types as it partitions it.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     shard-partition-without-collectives.mlir:[[# @LINE + 3]]:3: error: shard-partition: the layouts of graph.softmax's operands do not give its result's (run shard-propagate and insert-collectives first)
graph.mesh @mesh axes = [tp = 4]
func.func @softmax_over_split_axis(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x64xf32> {
  %p = graph.softmax %x {axis = 1} : tensor<8x64xf32>
  func.return %p : tensor<8x64xf32>
}
