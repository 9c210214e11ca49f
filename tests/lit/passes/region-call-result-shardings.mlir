// RUN: tessera-opt %s --split-input-file -p canonicalize | filecheck %s --check-prefix=FOLD
// RUN: tessera-opt %s --split-input-file -p canonicalize,shard-propagate,insert-collectives | filecheck %s --check-prefix=SHARD
// RUN: tessera-opt %s --split-input-file -p canonicalize | tessera-opt --split-input-file | filecheck %s --check-prefix=FOLD

// canonicalize folds a graph.shard of a region call's result into the call
// (graph.result_shardings, unit for an open result). shard-propagate constrains the
// callee's variant: the tp-partial product is reduce-scattered into the constrained split
// inside the region, and the call's result has that layout; insert-collectives spends the
// constraint (no attribute, no graph.shard left).
// FOLD-LABEL:  func.func @folded
// FOLD:          %0, %1 = graph.call @layer(%x, %w) attributes {graph.result_shardings = [#graph.sharding<@mesh, {{\[\[}}], [tp]]>, unit]}
// FOLD-NOT:      = graph.shard %
// FOLD:          func.return %0, %1
// SHARD-LABEL: func.func @folded
// SHARD:         graph.call @layer(%x, %w) attributes {graph.sharding = [#graph.sharding<@mesh, {{\[\[}}], [tp]]>, #graph.sharding<@mesh, {{\[\[}}], []]>]}
// SHARD-NOT:     graph.result_shardings
// SHARD-NOT:     = graph.shard %
// SHARD:       func.func private @layer(
// SHARD:         graph.reduce_scatter %y {axes = [tp], dim = 1, kind = sum}
// SHARD-NOT:     = graph.shard %
// SHARD:         func.return
graph.mesh @mesh axes = [tp = 2]
func.func @folded(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>}, %w: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %0, %1 = graph.call @layer(%x, %w) : (tensor<8x16xf32>, tensor<16x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>)
  %2 = graph.shard %0 {sharding = #graph.sharding<@mesh, [[], [tp]]>} : tensor<8x16xf32>
  func.return %2, %1 : tensor<8x16xf32>, tensor<8x16xf32>
}
func.func private @layer(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %y = graph.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %z = graph.exp %x : tensor<8x16xf32>
  func.return %y, %z : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// A result another op also reads keeps its graph.shard (that op reads it unconstrained).
// Calls whose constraints differ call different variants (@layer, @layer_1).
// FOLD-LABEL:  func.func @kept
// FOLD:          %0 = graph.call @layer(%x) : (tensor<8x16xf32>) -> (tensor<8x16xf32>)
// FOLD:          graph.shard %0
// FOLD:          graph.call @layer(%x) attributes {graph.result_shardings = [#graph.sharding<@mesh, {{\[\[}}tp], []]>]}
// SHARD-LABEL: func.func @kept
// SHARD:         %0 = graph.call @layer(%x)
// SHARD:         graph.all_slice %0 {axes = [tp], dim = 0}
// SHARD:         graph.call @layer_1(%x) attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// SHARD:       func.func private @layer(
// SHARD-NOT:     graph.all_slice
// SHARD:         func.return
// SHARD:       func.func private @layer_1(
// SHARD:         graph.all_slice
// SHARD:         func.return
graph.mesh @mesh axes = [tp = 2]
func.func @kept(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>}) -> (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) {
  %0 = graph.call @layer(%x) : (tensor<8x16xf32>) -> (tensor<8x16xf32>)
  %1 = graph.shard %0 {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<8x16xf32>
  %2 = graph.exp %0 : tensor<8x16xf32>
  %3 = graph.call @layer(%x) : (tensor<8x16xf32>) -> (tensor<8x16xf32>)
  %4 = graph.shard %3 {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<8x16xf32>
  func.return %1, %2, %4 : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
}
func.func private @layer(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %y = graph.exp %x : tensor<8x16xf32>
  func.return %y : tensor<8x16xf32>
}
