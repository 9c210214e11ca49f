// RUN: tessera-opt %s -p shard-propagate,insert-collectives,shard-partition | filecheck %s
// RUN: tessera-opt %s -p shard-propagate,insert-collectives,shard-partition,lower-graph-to-schedule | filecheck %s --check-prefix=SCHED

// A dist.shard_map region: a graph.call of a manual function (graph.manual, per-rank
// types, its specs as graph.sharding). Propagation does not enter it: the operand x,
// split over tp by columns, is resharded to the in_spec (rows over dp), the result
// leaves with the out_spec, and shard-partition turns the call into a per-rank call
// whose body, with its explicit all_reduce, is left as written.
// CHECK-LABEL: func.func @megatron
// CHECK:         %[[S:.*]] = graph.all_slice %x {axes = [dp], dim = 0}
// CHECK:         %[[G:.*]] = graph.all_gather %[[S]] {axes = [tp], dim = 1} {{.*}} : tensor<4x8xf32> -> tensor<4x16xf32>
// CHECK:         %y = graph.call @mlp(%[[G]], %w1, %w2) attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>} : (tensor<4x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>) -> (tensor<4x16xf32>)
// CHECK:         graph.tanh %y {{.*}} : tensor<4x16xf32>
// CHECK:       func.func private @mlp({{.*}}) -> (tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}) attributes {graph.partitioned, graph.manual}
// CHECK-NOT:     graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []], partial
// CHECK:         graph.all_reduce %p {axes = [tp], kind = sum} : tensor<4x16xf32>
// CHECK-NEXT:    func.return
// The body's collectives become start / wait pairs like any partitioned function's.
// SCHED-LABEL: func.func @megatron
// SCHED:         func.call @mlp(
// SCHED:       func.func private @mlp(
// SCHED:         schedule.start all_reduce %p {axes = [tp], kind = sum}
// SCHED:         schedule.wait
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @megatron(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                    %w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %y = graph.call @mlp(%x, %w1, %w2) : (tensor<8x16xf32>, tensor<16x32xf32>, tensor<32x16xf32>) -> (tensor<8x16xf32>)
  %z = graph.tanh %y : tensor<8x16xf32>
  func.return %z : tensor<8x16xf32>
}
func.func private @mlp(%x: tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                       %w1: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                       %w2: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) attributes {graph.partitioned, graph.manual} {
  %h = graph.matmul %x, %w1 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %g = graph.gelu %h {approximate = none} : tensor<4x16xf32>
  %p = graph.matmul %g, %w2 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %y = graph.all_reduce %p {axes = [tp], kind = sum} : tensor<4x16xf32>
  func.return %y : tensor<4x16xf32>
}
