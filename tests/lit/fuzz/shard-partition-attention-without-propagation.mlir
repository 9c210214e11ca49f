// RUN: not tessera-opt %s -p shard-partition 2>&1 | filecheck %s
// RUN: tessera-opt %s -p shard-propagate,insert-collectives,shard-partition | filecheck %s --check-prefix=ORDERED

// Found by the fuzzer (20,000 inputs, seed 2611): shard-partition alone on an attention
// whose query is split over cp (no result layouts from shard-propagate) made IR that did
// not verify (an internal error). Like any op, it is an error at the op; with the
// sharding passes first it partitions.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     shard-partition-attention-without-propagation.mlir:[[# @LINE + 8]]:3: error: shard-partition: the layouts of graph.attention's operands do not give its result's (run shard-propagate and insert-collectives first)
// ORDERED:     graph.all_gather %{{.*}} {axes = [cp], dim = 0}
// ORDERED:     graph.axis_index {axes = [cp]}
// ORDERED:     graph.attention {{.*}} -> (tensor<8x8xf32>, tensor<8xf32>)
graph.mesh @mesh axes = [cp = 2]
func.func @offsets_and_split(%q: tensor<16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[cp], []]>},
                             %k: tensor<16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[cp], []]>},
                             %q0: tensor<i32>, %k0: tensor<i32>) -> tensor<16x8xf32> {
  %o, %lse = graph.attention %q, %k, %k, %q0, %k0 {causal = true, scale = 0.25} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<i32>, tensor<i32> -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return %o : tensor<16x8xf32>
}
