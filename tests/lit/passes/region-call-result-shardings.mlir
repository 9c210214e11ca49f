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

// -----

// A scan's stacked result folds a constraint that keeps dim 0 (the steps) whole: each
// step returns its slice so laid out, so the dp-partial product (a gradient) is
// reduce-scattered step by step inside the scan, not all-reduced whole.
// FOLD-LABEL:  func.func @scanned
// FOLD:          graph.scan @step(%x, %w) {carries = 1, length = 2, reverse = false} attributes {graph.result_shardings = [unit, #graph.sharding<@mesh, {{\[\[}}], [dp], []]>]}
// FOLD-NOT:      = graph.shard %
// SHARD-LABEL: func.func @scanned
// SHARD-NOT:     graph.result_shardings
// SHARD-NOT:     = graph.shard %
// SHARD:       func.func private @step(
// SHARD:         graph.reduce_scatter %{{.*}} {axes = [dp], dim = 0, kind = sum}
// SHARD-NOT:     graph.all_reduce
// SHARD:         func.return
graph.mesh @mesh axes = [dp = 2]
func.func @scanned(%x: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}, %w: tensor<2x64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [], []]>}) -> (tensor<64x16xf32>, tensor<2x16x16xf32>) {
  %h, %g = graph.scan @step(%x, %w) {carries = 1, length = 2, reverse = false} : (tensor<64x16xf32>, tensor<2x64x16xf32>) -> (tensor<64x16xf32>, tensor<2x16x16xf32>)
  %s = graph.shard %g {sharding = #graph.sharding<@mesh, [[], [dp], []]>} : tensor<2x16x16xf32>
  func.return %h, %s : tensor<64x16xf32>, tensor<2x16x16xf32>
}
func.func private @step(%h: tensor<64x16xf32>, %w: tensor<64x16xf32>) -> (tensor<64x16xf32>, tensor<16x16xf32>) {
  %t = graph.transpose %h {perm = [1, 0]} : tensor<64x16xf32> -> tensor<16x64xf32>
  %g = graph.matmul %t, %h : tensor<16x64xf32>, tensor<64x16xf32> -> tensor<16x16xf32>
  %n = graph.add %h, %w : tensor<64x16xf32>
  func.return %n, %g : tensor<64x16xf32>, tensor<16x16xf32>
}

// -----

// A constraint that keeps a result partial (a gradient summed over microbatches) leaves
// the variant partial (graph.partial_results: no reduction at its return); the caller
// sums the two calls' partial results and all-reduces the sum once.
// FOLD-LABEL:  func.func @summed
// FOLD:          graph.call @grad(%x) attributes {graph.result_shardings = [#graph.sharding<@mesh, {{\[\[}}], []], partial = sum[dp]>]}
// FOLD:          graph.call @grad(%y) attributes {graph.result_shardings = [#graph.sharding<@mesh, {{\[\[}}], []], partial = sum[dp]>]}
// SHARD-LABEL: func.func @summed
// SHARD:         graph.call @grad(%x)
// SHARD:         graph.call @grad(%y)
// SHARD:         graph.add
// SHARD:         graph.all_reduce %{{.*}} {axes = [dp], kind = sum}
// SHARD-NOT:     graph.all_reduce
// SHARD:       func.func private @grad({{.*}} attributes {graph.partial_results = array<i64: 0>
// SHARD-NOT:     graph.all_reduce
// SHARD:         func.return
graph.mesh @mesh axes = [dp = 2]
func.func @summed(%x: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}, %y: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) -> tensor<16x16xf32> {
  %a = graph.call @grad(%x) : (tensor<64x16xf32>) -> (tensor<16x16xf32>)
  %pa = graph.shard %a {sharding = #graph.sharding<@mesh, [[], []], partial = sum[dp]>} : tensor<16x16xf32>
  %b = graph.call @grad(%y) : (tensor<64x16xf32>) -> (tensor<16x16xf32>)
  %pb = graph.shard %b {sharding = #graph.sharding<@mesh, [[], []], partial = sum[dp]>} : tensor<16x16xf32>
  %s = graph.add %pa, %pb : tensor<16x16xf32>
  %r = graph.shard %s {sharding = #graph.sharding<@mesh, [[], []]>} : tensor<16x16xf32>
  func.return %r : tensor<16x16xf32>
}
func.func private @grad(%x: tensor<64x16xf32>) -> tensor<16x16xf32> {
  %t = graph.transpose %x {perm = [1, 0]} : tensor<64x16xf32> -> tensor<16x64xf32>
  %g = graph.matmul %t, %x : tensor<16x64xf32>, tensor<64x16xf32> -> tensor<16x16xf32>
  func.return %g : tensor<16x16xf32>
}
