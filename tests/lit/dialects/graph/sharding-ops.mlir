// RUN: tessera-opt %s --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file --print-op-generic | tessera-opt --split-input-file | filecheck %s

// Meshes, sharding attributes and constraints round-trip.
// CHECK: graph.mesh @mesh axes = [dp = 2, tp = 4]
// CHECK-LABEL: func.func @annotations
// CHECK-SAME: (%[[X:.*]]: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-SAME: %{{.*}}: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp]]>})
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @annotations(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                       %v: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp, tp]]>}) -> tensor<16x64xf32> {
  // CHECK: graph.shard %[[X]] {sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]], partial = sum[dp]>} : tensor<16x64xf32>
  %a = graph.shard %x {sharding = #graph.sharding<@mesh, [[], [tp]], partial = sum[dp]>} : tensor<16x64xf32>
  // CHECK: graph.shard %{{.*}} {sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = max[tp] mean[dp]>} : tensor<16x64xf32>
  %b = graph.shard %a {sharding = #graph.sharding<@mesh, [[], []], partial = max[tp] mean[dp]>} : tensor<16x64xf32>
  // CHECK: graph.tanh %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>} : tensor<16x64xf32>
  %c = graph.tanh %b attributes {graph.sharding = #graph.sharding<@mesh, [[dp], []]>} : tensor<16x64xf32>
  func.return %c : tensor<16x64xf32>
}

// -----

// Collectives in the global view keep their operand's type.
graph.mesh @mesh axes = [dp = 2, tp = 4]
// CHECK-LABEL: func.func @global_view
func.func @global_view(%x: tensor<16x64xf32>) -> tensor<16x64xf32> {
  // CHECK: graph.all_reduce %{{.*}} {axes = [tp], kind = sum} : tensor<16x64xf32>
  %a = graph.all_reduce %x {axes = [tp], kind = sum} : tensor<16x64xf32>
  // CHECK: graph.all_gather %{{.*}} {axes = [dp], dim = 0} : tensor<16x64xf32>
  %b = graph.all_gather %a {axes = [dp], dim = 0} : tensor<16x64xf32>
  // CHECK: graph.all_slice %{{.*}} {axes = [tp, dp], dim = 1} : tensor<16x64xf32>
  %c = graph.all_slice %b {axes = [tp, dp], dim = 1} : tensor<16x64xf32>
  // CHECK: graph.reduce_scatter %{{.*}} {axes = [tp], dim = 0, kind = mean} : tensor<16x64xf32>
  %d = graph.reduce_scatter %c {axes = [tp], dim = 0, kind = mean} : tensor<16x64xf32>
  // CHECK: graph.all_to_all %{{.*}} {axes = [dp], split_dim = 1, concat_dim = 0} : tensor<16x64xf32>
  %e = graph.all_to_all %d {axes = [dp], split_dim = 1, concat_dim = 0} : tensor<16x64xf32>
  // CHECK: graph.broadcast %{{.*}} {axes = [tp], src = 3} : tensor<16x64xf32>
  %f = graph.broadcast %e {axes = [tp], src = 3} : tensor<16x64xf32>
  func.return %f : tensor<16x64xf32>
}

// -----

// In a partitioned function types are per rank: gathers grow and slices shrink the dim
// by the size of the rank group, all_to_all does both.
graph.mesh @mesh axes = [dp = 2, tp = 4]
// CHECK-LABEL: func.func @local_view
// CHECK-SAME: attributes {graph.partitioned}
func.func @local_view(%x: tensor<8x16xf32>) -> tensor<2x8xf32> attributes {graph.partitioned} {
  // CHECK: graph.all_gather %{{.*}} {axes = [tp], dim = 0} : tensor<8x16xf32> -> tensor<32x16xf32>
  %a = graph.all_gather %x {axes = [tp], dim = 0} : tensor<8x16xf32> -> tensor<32x16xf32>
  // CHECK: graph.all_slice %{{.*}} {axes = [tp], dim = 0} : tensor<32x16xf32> -> tensor<8x16xf32>
  %b = graph.all_slice %a {axes = [tp], dim = 0} : tensor<32x16xf32> -> tensor<8x16xf32>
  // CHECK: graph.all_to_all %{{.*}} {axes = [dp], split_dim = 1, concat_dim = 0} : tensor<8x16xf32> -> tensor<16x8xf32>
  %c = graph.all_to_all %b {axes = [dp], split_dim = 1, concat_dim = 0} : tensor<8x16xf32> -> tensor<16x8xf32>
  // CHECK: graph.reduce_scatter %{{.*}} {axes = [dp, tp], dim = 0, kind = sum} : tensor<16x8xf32> -> tensor<2x8xf32>
  %d = graph.reduce_scatter %c {axes = [dp, tp], dim = 0, kind = sum} : tensor<16x8xf32> -> tensor<2x8xf32>
  // CHECK: graph.all_reduce %{{.*}} {axes = [dp], kind = max} : tensor<2x8xf32>
  %e = graph.all_reduce %d {axes = [dp], kind = max} : tensor<2x8xf32>
  func.return %e : tensor<2x8xf32>
}

// -----

// collective_permute: each [source, target] pair names positions in a group over its
// axes; a rank that is no target receives zeros, and `[]` moves nothing. It exists in
// partitioned functions only and keeps the type.
graph.mesh @mesh axes = [dp = 2, tp = 4]
// CHECK-LABEL: func.func @permute
func.func @permute(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {graph.partitioned} {
  // CHECK: graph.collective_permute %{{.*}} {axes = [tp], pairs = {{\[\[}}0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8x16xf32>
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8x16xf32>
  // CHECK: graph.collective_permute %{{.*}} {axes = [tp, dp], pairs = {{\[\[}}7, 0], [2, 2]]} : tensor<8x16xf32>
  %b = graph.collective_permute %a {axes = [tp, dp], pairs = [[7, 0], [2, 2]]} : tensor<8x16xf32>
  // CHECK: graph.collective_permute %{{.*}} {axes = [dp], pairs = []} : tensor<8x16xf32>
  %c = graph.collective_permute %b {axes = [dp], pairs = []} : tensor<8x16xf32>
  func.return %c : tensor<8x16xf32>
}
