// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives | filecheck %s --check-prefix=SHARDED
// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives,shard-partition | filecheck %s
// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives,shard-partition | tessera-opt --split-input-file | filecheck %s

// Context parallelism, all-gather variant (issue 19): q, k and v split over cp along the
// sequence. The key sequence is a CONTEXT factor of graph.attention's rule: through
// shard-propagate and insert-collectives k and v stay split (nothing is inserted), and
// the backward's dk and dv come out split too, not partial. shard-partition expands
// both ops: k and v are all-gathered once (the backward reuses the forward's gathers),
// each rank's query offset (16 x its index along cp: graph.axis_index) becomes the
// causal position operand (the keys start at 0), and dk, dv,
// each rank's sum over its own queries, are reduce-scattered back to their split.
// Sharding lists are written `{{\[\[}}dp], ...` because FileCheck reads `[[` as a variable.

// SHARDED-LABEL: func.func @context_parallel
// SHARDED-NEXT:    graph.attention %q, %k, %v {causal = true, scale = 0.25} attributes {graph.sharding = [#graph.sharding<@mesh, {{\[\[}}dp], [], [cp], []]>, #graph.sharding<@mesh, {{\[\[}}dp], [], [cp]]>]}
// SHARDED-NEXT:    graph.attention_backward %q, %k, %v, %do, %lse, %lse {{.*}} attributes {graph.sharding = [#graph.sharding<@mesh, {{\[\[}}dp], [], [cp], []]>, #graph.sharding<@mesh, {{\[\[}}dp], [], [cp], []]>, #graph.sharding<@mesh, {{\[\[}}dp], [], [cp], []]>]}
// SHARDED-NEXT:    func.return

// CHECK-LABEL: func.func @context_parallel
// CHECK-SAME:    (%[[Q:[^:]*]]: tensor<1x2x16x16xf32> {{.*}}, %[[K:[^:]*]]: tensor<1x2x16x16xf32> {{.*}}, %[[V:[^:]*]]: tensor<1x2x16x16xf32> {{.*}}, %[[DO:[^:]*]]: tensor<1x2x16x16xf32> {{.*}})
// CHECK-NEXT:    %[[KG:.*]] = graph.all_gather %[[K]] {axes = [cp], dim = 2} {{.*}} : tensor<1x2x16x16xf32> -> tensor<1x2x64x16xf32>
// CHECK-NEXT:    %[[VG:.*]] = graph.all_gather %[[V]] {axes = [cp], dim = 2} {{.*}} : tensor<1x2x16x16xf32> -> tensor<1x2x64x16xf32>
// CHECK-NEXT:    %[[RANK:.*]] = graph.axis_index {axes = [cp]} {{.*}} : tensor<i32>
// CHECK-NEXT:    %[[SIZE:.*]] = graph.constant {{.*}} dense<16> : tensor<i32>
// CHECK-NEXT:    %[[Q0:.*]] = graph.mul %[[RANK]], %[[SIZE]] {{.*}} : tensor<i32>
// CHECK-NEXT:    %[[K0:.*]] = graph.constant {{.*}} dense<0> : tensor<i32>
// CHECK-NEXT:    %[[O:.*]], %[[LSE:.*]] = graph.attention %[[Q]], %[[KG]], %[[VG]], %[[Q0]], %[[K0]] {causal = true, scale = 0.25} {{.*}} : tensor<1x2x16x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<i32>, tensor<i32> -> (tensor<1x2x16x16xf32>, tensor<1x2x16xf32>)
// CHECK-NEXT:    %[[DQ:.*]], %[[DK:.*]], %[[DV:.*]] = graph.attention_backward %[[Q]], %[[KG]], %[[VG]], %[[DO]], %[[LSE]], %[[LSE]], %[[Q0]], %[[K0]] {{.*}} attributes {graph.sharding = [#graph.sharding<@mesh, {{\[\[}}dp], [], [cp], []]>, #graph.sharding<@mesh, {{\[\[}}dp], [], [], []], partial = sum[cp]>, #graph.sharding<@mesh, {{\[\[}}dp], [], [], []], partial = sum[cp]>]} : {{.*}} -> (tensor<1x2x16x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>)
// CHECK-NEXT:    %[[DKS:.*]] = graph.reduce_scatter %[[DK]] {axes = [cp], dim = 2, kind = sum} {{.*}} : tensor<1x2x64x16xf32> -> tensor<1x2x16x16xf32>
// CHECK-NEXT:    %[[DVS:.*]] = graph.reduce_scatter %[[DV]] {axes = [cp], dim = 2, kind = sum} {{.*}} : tensor<1x2x64x16xf32> -> tensor<1x2x16x16xf32>
// CHECK-NEXT:    func.return %[[O]], %[[DQ]], %[[DKS]], %[[DVS]]
graph.mesh @mesh axes = [dp = 2, cp = 4]
func.func @context_parallel(%q: tensor<2x2x64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], [cp], []]>},
                            %k: tensor<2x2x64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], [cp], []]>},
                            %v: tensor<2x2x64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], [cp], []]>},
                            %do: tensor<2x2x64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], [cp], []]>})
    -> (tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>) {
  %o, %lse = graph.attention %q, %k, %v {causal = true, scale = 0.25} : tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32> -> (tensor<2x2x64x16xf32>, tensor<2x2x64xf32>)
  %dq, %dk, %dv = graph.attention_backward %q, %k, %v, %do, %lse, %lse {causal = true, scale = 0.25} : tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64xf32>, tensor<2x2x64xf32> -> (tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>)
  func.return %o, %dq, %dk, %dv : tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>, tensor<2x2x64x16xf32>
}

// -----

// Megatron's heads over tp, grouped k and v (4 query heads, 2 k/v heads: the head
// factor has k's count, so each rank keeps 2 query heads and their k/v head): nothing
// moves, and the position operands the user gave stay as they are (no query split).
// SHARDED-LABEL: func.func @heads_over_tp
// SHARDED-NOT:     graph.all_
// SHARDED:         func.return
// CHECK-LABEL: func.func @heads_over_tp
// CHECK-SAME:    (%[[Q:[^:]*]]: tensor<2x2x32x8xf32> {{.*}}, %[[K:[^:]*]]: tensor<2x1x32x8xf32> {{.*}}, %[[V:[^:]*]]: tensor<2x1x32x8xf32> {{.*}}, %[[Q0:[^:]*]]: tensor<i32> {{.*}}, %[[K0:[^:]*]]: tensor<i32> {{.*}})
// CHECK-NEXT:    %{{.*}}, %{{.*}} = graph.attention %[[Q]], %[[K]], %[[V]], %[[Q0]], %[[K0]] {causal = true, scale = 0.25} {{.*}} : tensor<2x2x32x8xf32>, tensor<2x1x32x8xf32>, tensor<2x1x32x8xf32>, tensor<i32>, tensor<i32> -> (tensor<2x2x32x8xf32>, tensor<2x2x32xf32>)
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [tp = 2]
func.func @heads_over_tp(%q: tensor<2x4x32x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp], [], []]>},
                         %k: tensor<2x2x32x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp], [], []]>},
                         %v: tensor<2x2x32x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp], [], []]>},
                         %q0: tensor<i32>, %k0: tensor<i32>) -> tensor<2x4x32x8xf32> {
  %o, %lse = graph.attention %q, %k, %v, %q0, %k0 {causal = true, scale = 0.25} : tensor<2x4x32x8xf32>, tensor<2x2x32x8xf32>, tensor<2x2x32x8xf32>, tensor<i32>, tensor<i32> -> (tensor<2x4x32x8xf32>, tensor<2x4x32xf32>)
  func.return %o : tensor<2x4x32x8xf32>
}

// -----

// Position operands given by the user and a query block split over cp: this rank's
// start is added to the query offset (the key offset stays: the keys are gathered).
// CHECK-LABEL: func.func @offsets_and_split
// CHECK-SAME:    (%[[Q:[^:]*]]: tensor<8x8xf32> {{.*}}, %[[K:[^:]*]]: tensor<8x8xf32> {{.*}}, %[[Q0:[^:]*]]: tensor<i32> {{.*}}, %[[K0:[^:]*]]: tensor<i32> {{.*}})
// CHECK-NEXT:    %[[KG:.*]] = graph.all_gather %[[K]] {axes = [cp], dim = 0} {{.*}} : tensor<8x8xf32> -> tensor<16x8xf32>
// CHECK-NEXT:    %[[RANK:.*]] = graph.axis_index {axes = [cp]}
// CHECK-NEXT:    %[[SIZE:.*]] = graph.constant {{.*}} dense<8> : tensor<i32>
// CHECK-NEXT:    %[[START:.*]] = graph.mul %[[RANK]], %[[SIZE]]
// CHECK-NEXT:    %[[SUM:.*]] = graph.add %[[Q0]], %[[START]] {{.*}} : tensor<i32>
// CHECK-NEXT:    graph.attention %[[Q]], %[[KG]], %[[KG]], %[[SUM]], %[[K0]]
graph.mesh @mesh axes = [cp = 2]
func.func @offsets_and_split(%q: tensor<16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[cp], []]>},
                             %k: tensor<16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[cp], []]>},
                             %q0: tensor<i32>, %k0: tensor<i32>) -> tensor<16x8xf32> {
  %o, %lse = graph.attention %q, %k, %k, %q0, %k0 {causal = true, scale = 0.25} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<i32>, tensor<i32> -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return %o : tensor<16x8xf32>
}
