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

// -----

// Masks round the ring (issue 31): segment ids on cp = 4, a window of 2 smaller than a
// rank's block of 4 (not causal). The key ids travel with k and v (one more permute per
// step) and the query ids stay; each call gets its blocks' positions for the window.
// Step 2 (the blocks two ranks away) is masked on every rank and not computed: 3 calls,
// not 4, and the blocks of step 3 come from step 1's by a permute of two hops.

// CHECK-LABEL: func.func @ring_window_segments
// CHECK-SAME:    %[[IDS:[^:]*]]: tensor<4xi32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[K1:.*]] = graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1], [1, 2], [2, 3], [3, 0]]} {{.*}} : tensor<1x4x4xf32>
// CHECK-NEXT:    %[[V1:.*]] = graph.collective_permute %{{.*}} {axes = [cp], pairs = {{\[\[}}0, 1], [1, 2], [2, 3], [3, 0]]} {{.*}} : tensor<1x4x4xf32>
// CHECK-NEXT:    %[[I1:.*]] = graph.collective_permute %[[IDS]] {axes = [cp], pairs = {{\[\[}}0, 1], [1, 2], [2, 3], [3, 0]]} {{.*}} : tensor<4xi32>
// CHECK:         graph.attention %{{.*}}, %{{.*}}, %{{.*}}, %[[IDS]], %[[IDS]], %{{.*}}, %{{.*}} {causal = false, scale = 0.5, window = 2, segments = true}
// CHECK:         %[[K3:.*]] = graph.collective_permute %[[K1]] {axes = [cp], pairs = {{\[\[}}0, 2], [1, 3], [2, 0], [3, 1]]}
// CHECK-NEXT:    %[[V3:.*]] = graph.collective_permute %[[V1]] {axes = [cp], pairs = {{\[\[}}0, 2], [1, 3], [2, 0], [3, 1]]}
// CHECK-NEXT:    %[[I3:.*]] = graph.collective_permute %[[I1]] {axes = [cp], pairs = {{\[\[}}0, 2], [1, 3], [2, 0], [3, 1]]}
// CHECK:         graph.attention %{{.*}}, %[[K1]], %[[V1]], %[[IDS]], %[[I1]], %{{.*}}, %{{.*}} {causal = false, scale = 0.5, window = 2, segments = true}
// CHECK:         graph.attention %{{.*}}, %[[K3]], %[[V3]], %[[IDS]], %[[I3]], %{{.*}}, %{{.*}} {causal = false, scale = 0.5, window = 2, segments = true}
// CHECK-NOT:     graph.attention
// CHECK-NOT:     graph.collective_permute
// CHECK:         func.return
graph.mesh @mesh axes = [cp = 4]
func.func @ring_window_segments(%q: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %k: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %v: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                %ids: tensor<16xi32> {graph.sharding = #graph.sharding<@mesh, [[cp]]>}) -> tensor<1x16x4xf32> {
  %z = graph.constant dense<0> : tensor<i32>
  %o, %lse = graph.attention %q, %k, %v, %ids, %ids, %z, %z {causal = false, scale = 0.5, window = 2, segments = true} : tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<16xi32>, tensor<16xi32>, tensor<i32>, tensor<i32> -> (tensor<1x16x4xf32>, tensor<1x16xf32>)
  func.return %o : tensor<1x16x4xf32>
}

// -----

// Causal with a window of 3, stored in zig-zag order over cp = 4 (32 tokens: a rank
// holds two chunks of 4): of the 4 steps x 3 chunk pairs (the zig-zag split already
// drops one) only 5 calls are left: step 0's three, one at step 1 and one at step 3;
// step 2 computes nothing, against 12 calls without the window.

// CHECK-LABEL: func.func @ring_causal_window_skips
// CHECK-NOT:     graph.all_gather
// CHECK-COUNT-5: graph.attention %{{.*}} {causal = true, scale = 0.5, window = 3}
// CHECK-NOT:     graph.attention
// CHECK:         func.return
graph.mesh @mesh axes = [cp = 4]
func.func @ring_causal_window_skips(%q: tensor<1x32x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                    %k: tensor<1x32x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                                    %v: tensor<1x32x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>}) -> tensor<1x32x4xf32> {
  %z = graph.constant dense<0> : tensor<i32>
  %o, %lse = graph.attention %q, %k, %v, %z, %z {causal = true, scale = 0.5, window = 3, zigzag = 4} : tensor<1x32x4xf32>, tensor<1x32x4xf32>, tensor<1x32x4xf32>, tensor<i32>, tensor<i32> -> (tensor<1x32x4xf32>, tensor<1x32xf32>)
  func.return %o : tensor<1x32x4xf32>
}
