// RUN: not tessera-opt %s -p lower-graph-to-schedule 2>&1 | filecheck %s

// Found by the fuzzer: a function with global types calling a per-rank (partitioned)
// dist.shard_map region was lowered as it was, and the func.call it made did not verify
// (an internal error). The pass says at the call that shard-partition must run first.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     lower-graph-to-schedule-unpartitioned-call.mlir:[[# @LINE + 3]]:3: error: lower-graph-to-schedule: @loss calls @body, a per-rank (partitioned) function, with global types; run shard-partition first
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @loss(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<8x16xf32> {
  %y = graph.call @body(%x, %w) : (tensor<8x16xf32>, tensor<16x16xf32>) -> (tensor<8x16xf32>)
  func.return %y : tensor<8x16xf32>
}
func.func private @body(%x: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                        %w: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) attributes {graph.partitioned, graph.manual} {
  %g = graph.all_gather %x {axes = [tp], dim = 1} : tensor<4x8xf32> -> tensor<4x16xf32>
  %y = graph.matmul %g, %w : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  func.return %y : tensor<4x16xf32>
}
