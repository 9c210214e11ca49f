// RUN: tessera-opt %s --split-input-file -p 'shard-propagate,insert-collectives,shard-partition{context="ring"}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'shard-propagate,insert-collectives,shard-partition{context="ring"}' | tessera-opt --split-input-file | filecheck %s

// Ring attention (issue 19), shard-partition{context="ring"}: q, k, v split over cp = 2
// along the sequence. The permute bringing the next k/v block (rank i to i + 1) comes
// before the current block's attention, so the schedule can overlap them; the two
// partial (o, lse) pairs merge by the online softmax (max, exp, log, a rescale of each
// o). Nothing is gathered.

// CHECK-LABEL: func.func @ring_forward
// CHECK-SAME:    (%[[Q:[^:]*]]: tensor<2x8x4xf32> {{.*}}, %[[K:[^:]*]]: tensor<2x8x4xf32> {{.*}}, %[[V:[^:]*]]: tensor<2x8x4xf32> {{.*}})
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[K1:.*]] = graph.collective_permute %[[K]] {axes = [cp], pairs = {{\[\[}}0, 1], [1, 0]]}
// CHECK-NEXT:    %[[V1:.*]] = graph.collective_permute %[[V]] {axes = [cp], pairs = {{\[\[}}0, 1], [1, 0]]}
// CHECK:         %[[O0:.*]], %[[L0:.*]] = graph.attention %[[Q]], %[[K]], %[[V]] {causal = false, scale = 0.5}
// CHECK:         %[[O1:.*]], %[[L1:.*]] = graph.attention %[[Q]], %[[K1]], %[[V1]] {causal = false, scale = 0.5}
// CHECK-NEXT:    %[[TOP:.*]] = graph.maximum %[[L0]], %[[L1]]
// CHECK:         graph.exp
// CHECK:         graph.log
// CHECK:         %[[O:.*]] = graph.add %{{.*}}, %{{.*}} {{.*}} : tensor<2x8x4xf32>
// CHECK-NEXT:    func.return %[[O]]
graph.mesh @mesh axes = [cp = 2]
func.func @ring_forward(%q: tensor<2x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                        %k: tensor<2x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                        %v: tensor<2x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>}) -> tensor<2x16x4xf32> {
  %o, %lse = graph.attention %q, %k, %v {causal = false, scale = 0.5} : tensor<2x16x4xf32>, tensor<2x16x4xf32>, tensor<2x16x4xf32> -> (tensor<2x16x4xf32>, tensor<2x16xf32>)
  func.return %o : tensor<2x16x4xf32>
}

// -----

// Causal, backward: the zig-zag split. Each half block of q, k, v, do, lse and delta
// goes to its zig-zag owner (rank r keeps chunks r and 3 - r of 4: chunk 0 stays on
// rank 0, chunk 1 goes from rank 0 to rank 1, ...); the blocks' causal positions come
// from graph.axis_index; dk and dv travel with their block, two permutes each on cp = 2
// (the second brings them home); the results move back to the contiguous split.

// CHECK-LABEL: func.func @ring_backward_zigzag
// CHECK-NOT:     graph.all_gather
// CHECK-NOT:     graph.reduce_scatter
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 0]]}
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}1, 1]]}
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1]]}
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}1, 0]]}
// CHECK:         %[[RANK:.*]] = graph.axis_index {axes = [cp]}
// CHECK-COUNT-3: graph.attention_backward
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1], [1, 0]]} {{.*}} : tensor<1x8x4xf32>
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1], [1, 0]]} {{.*}} : tensor<1x8x4xf32>
// CHECK-COUNT-3: graph.attention_backward
// CHECK:         func.return
graph.mesh @mesh axes = [cp = 2]
func.func @ring_backward_zigzag(%q: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %k: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %v: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %do: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %lse: tensor<1x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp]]>})
    -> (tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32>) {
  %dq, %dk, %dv = graph.attention_backward %q, %k, %v, %do, %lse, %lse {causal = true, scale = 0.5} : tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16xf32>, tensor<1x16xf32> -> (tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32>)
  func.return %dq, %dk, %dv : tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32>
}

// -----

// Causal, the sequence stored in zig-zag order over the ring's 2 ranks (zigzag = 2, as
// a data loader stores it): the contiguous split already gives rank r chunks r and
// 3 - r, so only k and v move (one ring step on cp = 2: no relayout permutes), and the
// per-block calls are in natural order with explicit positions (no zigzag attribute).

// CHECK-LABEL: func.func @ring_forward_stored_zigzag
// CHECK-NOT:     graph.all_gather
// CHECK:         graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1], [1, 0]]}
// CHECK-NEXT:    graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1], [1, 0]]}
// CHECK-NOT:     graph.collective_permute
// CHECK-NOT:     zigzag
// CHECK-COUNT-3: graph.attention %{{.*}} {causal = true, scale = 0.5}
// CHECK-NOT:     graph.collective_permute
// CHECK:         func.return
graph.mesh @mesh axes = [cp = 2]
func.func @ring_forward_stored_zigzag(%q: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                      %k: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                      %v: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>}) -> tensor<1x16x4xf32> {
  %o, %lse = graph.attention %q, %k, %v {causal = true, scale = 0.5, zigzag = 2} : tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32> -> (tensor<1x16x4xf32>, tensor<1x16xf32>)
  func.return %o : tensor<1x16x4xf32>
}
