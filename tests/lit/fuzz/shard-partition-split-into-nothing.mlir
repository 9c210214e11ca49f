// RUN: tessera-opt %s -p shard-propagate,insert-collectives,shard-partition | filecheck %s

// Found by the fuzzer (20,000 inputs, seed 2611, second run): shard-partition looked for
// the result of a split that has a block window and found none in a split into no pieces
// (StopIteration, an internal error). No result, no blocks to move.
// CHECK-LABEL: func.func @split_into_nothing
// CHECK:         graph.split %{{.*}} {axis = 1} attributes {graph.sharding = []} : tensor<4x0xf32> -> ()
// CHECK:         graph.neg %{{.*}} : tensor<2xf32>
graph.mesh @mesh axes = [tp = 2]
func.func @split_into_nothing(%e: tensor<4x0xf32>, %x: tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> tensor<4xf32> {
  graph.split %e {axis = 1} : tensor<4x0xf32> -> ()
  %y = graph.neg %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
