// RUN: tessera-opt %s --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file --print-op-generic | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives | filecheck %s --check-prefix=TP

// graph.dynamic_update_slice: a KV cache's write. The cache [B, kv_heads, max_len, D],
// the step's keys [B, kv_heads, T, D] and the position (an i32 scalar, a runtime input)
// give the cache with the keys written at the position along axis 2; it round-trips in
// the custom and the generic form. Under tensor parallelism the cache split over heads
// stays split (no collective); the written axis is needed whole.
// CHECK-LABEL: func.func @write
// CHECK-SAME: (%[[C:[a-z]+]]: tensor<2x4x16x8xf32> {{.*}}, %[[K:[a-z]+]]: tensor<2x4x1x8xf32> {{.*}}, %[[P:[a-z]+]]: tensor<i32>)
// CHECK-NEXT: %{{.*}} = graph.dynamic_update_slice %[[C]], %[[K]], %[[P]] {axis = 2} : tensor<2x4x16x8xf32>, tensor<2x4x1x8xf32>, tensor<i32> -> tensor<2x4x16x8xf32>{{$}}
// TP-LABEL: func.func @write
// TP-NOT:   graph.all_gather
// TP:       graph.dynamic_update_slice {{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp], [], []]>}
// TP-NOT:   graph.all_gather
// TP:       func.return
graph.mesh @mesh axes = [tp = 2]
func.func @write(%cache: tensor<2x4x16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp], [], []]>},
                 %k: tensor<2x4x1x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp], [], []]>},
                 %pos: tensor<i32>) -> tensor<2x4x16x8xf32> {
  %0 = graph.dynamic_update_slice %cache, %k, %pos {axis = 2} : tensor<2x4x16x8xf32>, tensor<2x4x1x8xf32>, tensor<i32> -> tensor<2x4x16x8xf32>
  func.return %0 : tensor<2x4x16x8xf32>
}

// -----

// A cache split along the written axis (positions) is gathered before the write.
// CHECK-LABEL: func.func @positions_split
// TP-LABEL: func.func @positions_split
// TP:       graph.all_gather
// TP:       graph.dynamic_update_slice {{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [], [], []]>}
graph.mesh @mesh axes = [tp = 2]
func.func @positions_split(%cache: tensor<2x4x16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [], [tp], []]>},
                           %k: tensor<2x4x1x8xf32>, %pos: tensor<i32>) -> tensor<2x4x16x8xf32> {
  %0 = graph.dynamic_update_slice %cache, %k, %pos {axis = 2} : tensor<2x4x16x8xf32>, tensor<2x4x1x8xf32>, tensor<i32> -> tensor<2x4x16x8xf32>
  func.return %0 : tensor<2x4x16x8xf32>
}
