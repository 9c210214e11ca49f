// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives,shard-partition | filecheck %s
// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives,shard-partition | tessera-opt --split-input-file | filecheck %s

// The second RUN line re-parses the partitioned IR: it must verify with per-rank types,
// which `graph.partitioned` gives collectives (an all_gather's result is bigger than its
// operand, an all_slice's smaller), and print the same again.
// Sharding lists are written `{{\[\[}}dp], []]` because FileCheck reads `[[` as a variable.
// Function arguments are captured with `[^:]*` so that a capture stops at its own type.

// Megatron MLP on dp=2 x tp=4: arguments take their per-rank shapes (batch / 2, hidden /
// 4), the function is marked partitioned, and the all-reduce keeps the local shape.
// CHECK-LABEL: func.func @megatron_mlp
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>},
// CHECK-SAME:    %[[W1:[^:]*]]: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>},
// CHECK-SAME:    %[[W2:[^:]*]]: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>})
// CHECK-SAME:    -> tensor<8x64xf32> attributes {graph.partitioned} {
// CHECK-NEXT:    %[[H:.*]] = graph.matmul %[[X]], %[[W1]] {{.*}} : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[H]] {{.*}} : tensor<8x64xf32>
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[G]], %[[W2]] {{.*}} : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} {{.*}} : tensor<8x64xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<8x64xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @megatron_mlp(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                        %w1: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                        %w2: tensor<256x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<16x64xf32> {
  %h = graph.matmul %x, %w1 : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>
  %g = graph.gelu %h {approximate = tanh} : tensor<16x256xf32>
  %y = graph.matmul %g, %w2 : tensor<16x256xf32>, tensor<256x64xf32> -> tensor<16x64xf32>
  func.return %y : tensor<16x64xf32>
}

// -----

// Every reshard collective with its per-rank types: all_gather grows the gathered dim
// (4 -> 16), all_to_all shrinks one dim and grows the other, reduce_scatter and all_slice
// shrink (16 -> 4), all_reduce keeps the shape.
// CHECK-LABEL: func.func @collectives_local_semantics
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x64xf32>
// CHECK-SAME:    %[[Y:[^:]*]]: tensor<16x16xf32>
// CHECK-SAME:    %[[W:[^:]*]]: tensor<16x32xf32>
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[X]] {axes = [tp], dim = 0} {{.*}} : tensor<4x64xf32> -> tensor<16x64xf32>
// CHECK-NEXT:    %[[T:.*]] = graph.all_to_all %[[X]] {axes = [tp], split_dim = 1, concat_dim = 0} {{.*}} : tensor<4x64xf32> -> tensor<16x16xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.matmul %[[Y]], %[[W]] {{.*}} : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
// CHECK-NEXT:    %[[RS:.*]] = graph.reduce_scatter %[[P]] {axes = [tp], dim = 0, kind = sum} {{.*}} : tensor<16x32xf32> -> tensor<4x32xf32>
// CHECK-NEXT:    %[[AR:.*]] = graph.all_reduce %[[P]] {axes = [tp], kind = sum} {{.*}} : tensor<16x32xf32>
// CHECK-NEXT:    %[[C:.*]] = graph.constant {{.*}} : tensor<16x64xf32>
// CHECK-NEXT:    %[[CS:.*]] = graph.all_slice %[[C]] {axes = [tp], dim = 1} {{.*}} : tensor<16x64xf32> -> tensor<16x16xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.add %[[Y]], %[[CS]] {{.*}} : tensor<16x16xf32>
// CHECK-NEXT:    func.return %[[G]], %[[T]], %[[RS]], %[[AR]], %[[S]] : tensor<16x64xf32>, tensor<16x16xf32>, tensor<4x32xf32>, tensor<16x32xf32>, tensor<16x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @collectives_local_semantics(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                       %y: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<16x64xf32>, tensor<16x64xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x64xf32>) {
  %g = graph.shard %x {sharding = #graph.sharding<@mesh, [[], []]>} : tensor<16x64xf32>
  %t = graph.shard %x {sharding = #graph.sharding<@mesh, [[], [tp]]>} : tensor<16x64xf32>
  %p = graph.matmul %y, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %rs = graph.shard %p {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<16x32xf32>
  %ar = graph.shard %p {sharding = #graph.sharding<@mesh, [[], []]>} : tensor<16x32xf32>
  %c = graph.constant dense<1.0> : tensor<16x64xf32>
  %s = graph.add %y, %c : tensor<16x64xf32>
  func.return %g, %t, %rs, %ar, %s : tensor<16x64xf32>, tensor<16x64xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x64xf32>
}

// -----

// A reshape keeping a split on its major dim gets a localised target shape: each rank
// reshapes its own contiguous block (2x16 -> 32 and 2x16 -> 4x8 for rows over tp;
// 8x16 -> 8x2x8 for columns over tp, the heads of Megatron attention).
// CHECK-LABEL: func.func @reshape_split_major_dim
// CHECK-SAME:    %[[ROWS:[^:]*]]: tensor<2x16xf32>
// CHECK-SAME:    %[[COLS:[^:]*]]: tensor<8x16xf32>
// CHECK-NEXT:    %[[FLAT:.*]] = graph.reshape %[[ROWS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp]]>} : tensor<2x16xf32> -> tensor<32xf32>
// CHECK-NEXT:    %[[TALL:.*]] = graph.reshape %[[ROWS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>} : tensor<2x16xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[HEADS:.*]] = graph.reshape %[[COLS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp], []]>} : tensor<8x16xf32> -> tensor<8x2x8xf32>
// CHECK-NEXT:    func.return %[[FLAT]], %[[TALL]], %[[HEADS]] : tensor<32xf32>, tensor<4x8xf32>, tensor<8x2x8xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @reshape_split_major_dim(%rows: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                   %cols: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>})
    -> (tensor<128xf32>, tensor<16x8xf32>, tensor<8x8x8xf32>) {
  %flat = graph.reshape %rows : tensor<8x16xf32> -> tensor<128xf32>
  %tall = graph.reshape %rows : tensor<8x16xf32> -> tensor<16x8xf32>
  %heads = graph.reshape %cols : tensor<8x64xf32> -> tensor<8x8x8xf32>
  func.return %flat, %tall, %heads : tensor<128xf32>, tensor<16x8xf32>, tensor<8x8x8xf32>
}

// -----

// A slice takes a split dim whole, so its limit there becomes the local size (8 -> 2);
// the cut dim is not split and keeps its global bounds.
// CHECK-LABEL: func.func @slice_whole_split_dim
// CHECK-SAME:    %[[X:[^:]*]]: tensor<2x16xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.slice %[[X]] {starts = [0, 4], limits = [2, 8], strides = [1, 1]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>} : tensor<2x16xf32> -> tensor<2x4xf32>
// CHECK-NEXT:    func.return %[[S]] : tensor<2x4xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @slice_whole_split_dim(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<8x4xf32> {
  %s = graph.slice %x {starts = [0, 4], limits = [8, 8], strides = [1, 1]} : tensor<8x16xf32> -> tensor<8x4xf32>
  func.return %s : tensor<8x4xf32>
}

// -----

// broadcast_to of a row-split column to a row-split matrix broadcasts locally to the
// local target shape (2x1 -> 2x16), without communication.
// CHECK-LABEL: func.func @broadcast_to_split_shape
// CHECK-SAME:    %[[B:[^:]*]]: tensor<2x1xf32>
// CHECK-NEXT:    %[[BB:.*]] = graph.broadcast_to %[[B]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>} : tensor<2x1xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[BB]] {{.*}} : tensor<2x16xf32>
// CHECK-NEXT:    func.return %[[E]] : tensor<2x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @broadcast_to_split_shape(%b: tensor<8x1xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<8x16xf32> {
  %bb = graph.broadcast_to %b : tensor<8x1xf32> -> tensor<8x16xf32>
  %e = graph.exp %bb : tensor<8x16xf32>
  func.return %e : tensor<8x16xf32>
}

// -----

// Softmax over a split axis (Megatron's vocab-parallel softmax): local max, all-reduce
// max of the 8x1 statistic, local exp and sum, all-reduce sum of the 8x1 statistic,
// local divide. The 8x64 tensor is never gathered.
// CHECK-LABEL: func.func @softmax_over_split_axis
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[M:.*]] = graph.max %[[X]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[MR:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = max} : tensor<8x1xf32>
// CHECK-NEXT:    %[[D:.*]] = graph.sub %[[X]], %[[MR]] : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[D]] : tensor<8x16xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[E]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[SR:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum} : tensor<8x1xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.div %[[E]], %[[SR]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    func.return %[[P]] : tensor<8x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @softmax_over_split_axis(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x64xf32> {
  %p = graph.softmax %x {axis = 1} : tensor<8x64xf32>
  func.return %p : tensor<8x64xf32>
}

// -----

// log_softmax over a split axis: the softmax statistics, then x - max - log(sum).
// CHECK-LABEL: func.func @log_softmax_over_split_axis
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[M:.*]] = graph.max %[[X]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[MR:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = max} : tensor<8x1xf32>
// CHECK-NEXT:    %[[D:.*]] = graph.sub %[[X]], %[[MR]]
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[D]]
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[E]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[SR:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum} : tensor<8x1xf32>
// CHECK-NEXT:    %[[L:.*]] = graph.log %[[SR]] : tensor<8x1xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.sub %[[D]], %[[L]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<8x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @log_softmax_over_split_axis(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x64xf32> {
  %p = graph.log_softmax %x {axis = 1} : tensor<8x64xf32>
  func.return %p : tensor<8x64xf32>
}

// -----

// layer_norm over a split axis: the mean and then the variance of the centred values are
// local means all-reduced with kind mean (shards are equal, so the mean of means is the
// mean); only 8x1 statistics cross ranks.
// CHECK-LABEL: func.func @layer_norm_over_split_axis
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[EPS:.*]] = graph.constant dense<1.000000e-05> : tensor<f32>
// CHECK-NEXT:    %[[M:.*]] = graph.mean %[[X]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[MR:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = mean} : tensor<8x1xf32>
// CHECK-NEXT:    %[[C:.*]] = graph.sub %[[X]], %[[MR]] : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    %[[SQ:.*]] = graph.mul %[[C]], %[[C]] : tensor<8x16xf32>
// CHECK-NEXT:    %[[V:.*]] = graph.mean %[[SQ]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[VR:.*]] = graph.all_reduce %[[V]] {axes = [tp], kind = mean} : tensor<8x1xf32>
// CHECK-NEXT:    %[[VE:.*]] = graph.add %[[VR]], %[[EPS]] : tensor<8x1xf32>, tensor<f32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[RS:.*]] = graph.rsqrt %[[VE]] : tensor<8x1xf32>
// CHECK-NEXT:    %[[Y:.*]] = graph.mul %[[C]], %[[RS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    func.return %[[Y]] : tensor<8x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @layer_norm_over_split_axis(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x64xf32> {
  %y = graph.layer_norm %x {axes = [1], eps = 1.0e-05} : tensor<8x64xf32>
  func.return %y : tensor<8x64xf32>
}

// -----

// rms_norm over a split axis: one all-reduce (mean) of the local mean of squares.
// CHECK-LABEL: func.func @rms_norm_over_split_axis
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[EPS:.*]] = graph.constant dense<1.000000e-06> : tensor<f32>
// CHECK-NEXT:    %[[SQ:.*]] = graph.mul %[[X]], %[[X]] : tensor<8x16xf32>
// CHECK-NEXT:    %[[M:.*]] = graph.mean %[[SQ]] {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[MR:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = mean} : tensor<8x1xf32>
// CHECK-NEXT:    %[[ME:.*]] = graph.add %[[MR]], %[[EPS]]
// CHECK-NEXT:    %[[RS:.*]] = graph.rsqrt %[[ME]] : tensor<8x1xf32>
// CHECK-NEXT:    %[[Y:.*]] = graph.mul %[[X]], %[[RS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    func.return %[[Y]] : tensor<8x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @rms_norm_over_split_axis(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x64xf32> {
  %y = graph.rms_norm %x {axes = [1], eps = 1.0e-06} : tensor<8x64xf32>
  func.return %y : tensor<8x64xf32>
}

// -----

// A normalisation over an axis that is not split stays one local op on the local type.
// CHECK-LABEL: func.func @normalization_over_whole_axis
// CHECK-SAME:    %[[X:[^:]*]]: tensor<2x64xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.softmax %[[X]] {axis = 1} {{.*}} : tensor<2x64xf32>
// CHECK-NEXT:    %[[L:.*]] = graph.layer_norm %[[S]] {{.*}} : tensor<2x64xf32>
// CHECK-NEXT:    func.return %[[L]] : tensor<2x64xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @normalization_over_whole_axis(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<8x64xf32> {
  %s = graph.softmax %x {axis = 1} : tensor<8x64xf32>
  %l = graph.layer_norm %s {axes = [1], eps = 1.0e-05} : tensor<8x64xf32>
  func.return %l : tensor<8x64xf32>
}

// -----

// dp=2 x tp=4 mesh: a softmax over a tp-split axis with dp-split rows all-reduces its
// 4x1 statistics over tp only; a layer_norm over both dims, split over dp and tp,
// all-reduces its 1x1 statistics over both axes.
// CHECK-LABEL: func.func @dp_tp_mesh_normalizations
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x4xf32>
// CHECK-SAME:    %[[Z:[^:]*]]: tensor<4x4xf32>
// CHECK-SAME:    attributes {graph.partitioned}
// CHECK-NOT:     graph.all_gather
// CHECK:         graph.max %[[X]] {axes = [1], keepdims = true} : tensor<4x4xf32> -> tensor<4x1xf32>
// CHECK-NEXT:    graph.all_reduce %{{.*}} {axes = [tp], kind = max} : tensor<4x1xf32>
// CHECK:         graph.all_reduce %{{.*}} {axes = [tp], kind = sum} : tensor<4x1xf32>
// CHECK-NEXT:    %[[A:.*]] = graph.div {{.*}}<@mesh, {{\[\[}}dp], [tp]]>} : tensor<4x4xf32>, tensor<4x1xf32> -> tensor<4x4xf32>
// CHECK:         graph.mean %[[Z]] {axes = [0, 1], keepdims = true} : tensor<4x4xf32> -> tensor<1x1xf32>
// CHECK-NEXT:    graph.all_reduce %{{.*}} {axes = [dp, tp], kind = mean} : tensor<1x1xf32>
// CHECK:         graph.all_reduce %{{.*}} {axes = [dp, tp], kind = mean} : tensor<1x1xf32>
// CHECK:         %[[B:.*]] = graph.mul {{.*}}<@mesh, {{\[\[}}dp], [tp]]>} : tensor<4x4xf32>, tensor<1x1xf32> -> tensor<4x4xf32>
// CHECK-NEXT:    func.return %[[A]], %[[B]] : tensor<4x4xf32>, tensor<4x4xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @dp_tp_mesh_normalizations(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                                     %z: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>})
    -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %a = graph.softmax %x {axis = 1} : tensor<8x16xf32>
  %b = graph.layer_norm %z {axes = [0, 1], eps = 1.0e-05} : tensor<8x16xf32>
  func.return %a, %b : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// dp=2 x tp=4 Megatron MLP with a mean loss: per-rank batch 8 and hidden 64, the logits
// all-reduced over tp, the scalar loss a local cross_entropy all-reduced over dp.
// CHECK-LABEL: func.func @dp_tp_mlp_loss
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x64xf32>
// CHECK-SAME:    %[[W1:[^:]*]]: tensor<64x64xf32>
// CHECK-SAME:    %[[W2:[^:]*]]: tensor<64x32xf32>
// CHECK-SAME:    %[[L:[^:]*]]: tensor<8xi32>
// CHECK-SAME:    -> tensor<f32> attributes {graph.partitioned}
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}} : tensor<8x64xf32>, tensor<64x32xf32> -> tensor<8x32xf32>
// CHECK-NEXT:    %[[YR:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} {{.*}} : tensor<8x32xf32>
// CHECK-NEXT:    %[[LOSS:.*]] = graph.cross_entropy %[[YR]], %[[L]] {{.*}} : tensor<8x32xf32>, tensor<8xi32> -> tensor<f32>
// CHECK-NEXT:    %[[LR:.*]] = graph.all_reduce %[[LOSS]] {axes = [dp], kind = mean} {{.*}} : tensor<f32>
// CHECK-NEXT:    func.return %[[LR]] : tensor<f32>
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @dp_tp_mlp_loss(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                          %w1: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                          %w2: tensor<256x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                          %labels: tensor<16xi32>) -> tensor<f32> {
  %h = graph.matmul %x, %w1 : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>
  %g = graph.gelu %h {approximate = tanh} : tensor<16x256xf32>
  %y = graph.matmul %g, %w2 : tensor<16x256xf32>, tensor<256x32xf32> -> tensor<16x32xf32>
  %l = graph.cross_entropy %y, %labels {reduction = mean} : tensor<16x32xf32>, tensor<16xi32> -> tensor<f32>
  func.return %l : tensor<f32>
}

// -----

// Megatron attention with heads over tp: each rank holds 2 of the 8 heads through the
// head reshape, transpose, scores, softmax over keys (whole, so not expanded) and @v.
// CHECK-LABEL: func.func @attention_heads_local_types
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x8x64xf32>
// CHECK-SAME:    %[[WQ:[^:]*]]: tensor<64x16xf32>
// CHECK:         %[[Q:.*]] = graph.matmul %[[X]], %[[WQ]] {{.*}} : tensor<4x8x64xf32>, tensor<64x16xf32> -> tensor<4x8x16xf32>
// CHECK:         %[[Q4:.*]] = graph.reshape %[[Q]] {{.*}} : tensor<4x8x16xf32> -> tensor<4x8x2x8xf32>
// CHECK:         %[[QH:.*]] = graph.transpose %[[Q4]] {perm = [0, 2, 1, 3]} {{.*}} : tensor<4x8x2x8xf32> -> tensor<4x2x8x8xf32>
// CHECK:         %[[S:.*]] = graph.matmul %[[QH]], %{{.*}} : tensor<4x2x8x8xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.softmax %[[S]] {axis = 3} {{.*}} : tensor<4x2x8x8xf32>
// CHECK-NEXT:    %[[O:.*]] = graph.matmul %[[P]], %{{.*}} : tensor<4x2x8x8xf32>
// CHECK-NEXT:    %[[OT:.*]] = graph.transpose %[[O]] {perm = [0, 2, 1, 3]} {{.*}} : tensor<4x2x8x8xf32> -> tensor<4x8x2x8xf32>
// CHECK-NEXT:    %[[O3:.*]] = graph.reshape %[[OT]] {{.*}} : tensor<4x8x2x8xf32> -> tensor<4x8x16xf32>
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[O3]], %{{.*}} : tensor<4x8x16xf32>, tensor<16x64xf32> -> tensor<4x8x64xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} {{.*}} : tensor<4x8x64xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<4x8x64xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @attention_heads_local_types(%x: tensor<4x8x64xf32>,
                                       %wq: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %wk: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %wv: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %wo: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<4x8x64xf32> {
  %q = graph.matmul %x, %wq : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  %k = graph.matmul %x, %wk : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  %v = graph.matmul %x, %wv : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  %q4 = graph.reshape %q : tensor<4x8x64xf32> -> tensor<4x8x8x8xf32>
  %k4 = graph.reshape %k : tensor<4x8x64xf32> -> tensor<4x8x8x8xf32>
  %v4 = graph.reshape %v : tensor<4x8x64xf32> -> tensor<4x8x8x8xf32>
  %qh = graph.transpose %q4 {perm = [0, 2, 1, 3]} : tensor<4x8x8x8xf32> -> tensor<4x8x8x8xf32>
  %kt = graph.transpose %k4 {perm = [0, 2, 3, 1]} : tensor<4x8x8x8xf32> -> tensor<4x8x8x8xf32>
  %vh = graph.transpose %v4 {perm = [0, 2, 1, 3]} : tensor<4x8x8x8xf32> -> tensor<4x8x8x8xf32>
  %s = graph.matmul %qh, %kt : tensor<4x8x8x8xf32>, tensor<4x8x8x8xf32> -> tensor<4x8x8x8xf32>
  %p = graph.softmax %s {axis = 3} : tensor<4x8x8x8xf32>
  %o = graph.matmul %p, %vh : tensor<4x8x8x8xf32>, tensor<4x8x8x8xf32> -> tensor<4x8x8x8xf32>
  %ot = graph.transpose %o {perm = [0, 2, 1, 3]} : tensor<4x8x8x8xf32> -> tensor<4x8x8x8xf32>
  %o3 = graph.reshape %ot : tensor<4x8x8x8xf32> -> tensor<4x8x64xf32>
  %y = graph.matmul %o3, %wo : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  func.return %y : tensor<4x8x64xf32>
}

// -----

// Reducing over a split dim: each rank sums its 2 rows into a partial 16-vector and the
// all-reduce moves only those 16 values; the input keeps its 2x16 local type.
// CHECK-LABEL: func.func @reduce_over_split_dim
// CHECK-SAME:    %[[X:[^:]*]]: tensor<2x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[S:.*]] = graph.sum %[[X]] {axes = [0], keepdims = false} {{.*}}partial = sum[tp]>} : tensor<2x16xf32> -> tensor<16xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum} {{.*}} : tensor<16xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<16xf32>
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @reduce_over_split_dim(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<16xf32> {
  %s = graph.sum %x {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  func.return %s : tensor<16xf32>
}

// -----

// Vocab-parallel lookup (Megatron's VocabParallelEmbedding): each tp rank holds 16 of the
// 64 rows; its offset is axis_index(tp) * 16; negative ids wrap over the whole 64 rows;
// ids outside the rank's rows are clamped for the local lookup and their rows zeroed.
// The partial rows are all-reduced over tp.
// CHECK-LABEL: func.func @vocab_parallel_embedding
// CHECK-SAME:    %[[T:[^:]*]]: tensor<16x16xf32>
// CHECK-SAME:    %[[I:[^:]*]]: tensor<4xi64>
// CHECK-NEXT:    %[[R:.*]] = graph.axis_index {axes = [tp]} : tensor<i32>
// CHECK-NEXT:    %[[R64:.*]] = graph.cast %[[R]] : tensor<i32> -> tensor<i64>
// CHECK-NEXT:    %[[N:.*]] = graph.constant dense<16> : tensor<i64>
// CHECK-NEXT:    %[[OFFSET:.*]] = graph.mul %[[R64]], %[[N]] : tensor<i64>
// CHECK:         %[[V:.*]] = graph.constant dense<64> : tensor<i64>
// CHECK:         %[[WRAPPED:.*]] = graph.select
// CHECK-NEXT:    %[[LOCAL:.*]] = graph.sub %[[WRAPPED]], %[[OFFSET]] : tensor<4xi64>, tensor<i64> -> tensor<4xi64>
// CHECK:         %[[LOW:.*]] = graph.maximum %[[LOCAL]]
// CHECK:         %[[LAST:.*]] = graph.constant dense<15> : tensor<i64>
// CHECK-NEXT:    %[[INSIDE:.*]] = graph.minimum %[[LOW]], %[[LAST]]
// CHECK-NEXT:    %[[HELD:.*]] = graph.compare %[[INSIDE]], %[[LOCAL]] {predicate = eq}
// CHECK-NEXT:    %[[ROWS:.*]] = graph.gather %[[T]], %[[INSIDE]] {axis = 0} : tensor<16x16xf32>, tensor<4xi64> -> tensor<4x16xf32>
// CHECK-NEXT:    %[[HELD2:.*]] = graph.reshape %[[HELD]] : tensor<4xi1> -> tensor<4x1xi1>
// CHECK-NEXT:    %[[ZERO:.*]] = graph.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[E:.*]] = graph.select %[[HELD2]], %[[ROWS]], %[[ZERO]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[OUT:.*]] = graph.all_reduce %[[E]] {axes = [tp], kind = sum}
// CHECK-NEXT:    func.return %[[OUT]] : tensor<4x16xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @vocab_parallel_embedding(%t: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                    %i: tensor<8xi64> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<8x16xf32> {
  %e = graph.gather %t, %i {axis = 0} : tensor<64x16xf32>, tensor<8xi64> -> tensor<8x16xf32>
  func.return %e : tensor<8x16xf32>
}

// -----

// Vocab-parallel cross-entropy (Megatron): per row, the max, the sum of exponentials and
// the label's logit (picked on the rank holding the label: label - axis_index(tp) * 16
// against the local iota) are the all-reduced 4x1 statistics; the 4x16 logits never move.
// CHECK-LABEL: func.func @vocab_parallel_cross_entropy
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x16xf32>
// CHECK-SAME:    %[[L:[^:]*]]: tensor<4xi64>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[M:.*]] = graph.max %[[X]] {axes = [1], keepdims = true} : tensor<4x16xf32> -> tensor<4x1xf32>
// CHECK-NEXT:    %[[MR:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = max} : tensor<4x1xf32>
// CHECK-NEXT:    %[[D:.*]] = graph.sub %[[X]], %[[MR]]
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[D]]
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[E]] {axes = [1], keepdims = true}
// CHECK-NEXT:    %[[SR:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum} : tensor<4x1xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.axis_index {axes = [tp]} : tensor<i32>
// CHECK:         %[[LOCAL:.*]] = graph.sub %[[L]], %{{.*}} : tensor<4xi64>, tensor<i64> -> tensor<4xi64>
// CHECK:         %[[HIT:.*]] = graph.compare %{{.*}}, %{{.*}} {predicate = eq} : tensor<4x1xi64>, tensor<1x16xi64> -> tensor<4x16xi1>
// CHECK:         %[[PICK:.*]] = graph.select %[[HIT]], %[[X]], %{{.*}}
// CHECK-NEXT:    %[[P:.*]] = graph.sum %[[PICK]] {axes = [1], keepdims = true}
// CHECK-NEXT:    %[[PR:.*]] = graph.all_reduce %[[P]] {axes = [tp], kind = sum} : tensor<4x1xf32>
// CHECK-NEXT:    %[[LOG:.*]] = graph.log %[[SR]]
// CHECK-NEXT:    %[[LSE:.*]] = graph.add %[[MR]], %[[LOG]]
// CHECK-NEXT:    %[[LOSS:.*]] = graph.sub %[[LSE]], %[[PR]]
// CHECK-NEXT:    %[[ROWS:.*]] = graph.reshape %[[LOSS]] : tensor<4x1xf32> -> tensor<4xf32>
// CHECK-NEXT:    %[[MEAN:.*]] = graph.mean %[[ROWS]] {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, [], partial = mean[dp]>}
// CHECK-NEXT:    %[[OUT:.*]] = graph.all_reduce %[[MEAN]] {axes = [dp], kind = mean}
// CHECK-NEXT:    func.return %[[OUT]] : tensor<f32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @vocab_parallel_cross_entropy(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                                        %l: tensor<8xi64> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<f32> {
  %c = graph.cross_entropy %x, %l {reduction = mean} : tensor<8x64xf32>, tensor<8xi64> -> tensor<f32>
  func.return %c : tensor<f32>
}

// -----

// A fused gate/up projection chunked in 2 along its tp split (64 columns over tp = 4:
// blocks of 16, the pieces' blocks of 8): rank r's gate block is the half [8 (r % 2),
// + 8) of rank r / 2's block, its up block the same half of rank 2 + r / 2's. Each
// piece is the sum of two collective permutes of local halves (every rank is the
// target of one of them; the other gives it zeros); the same halves serve both pieces.
// Nothing is gathered.
// CHECK-LABEL: func.func @fused_gate_up
// CHECK-SAME:    (%[[H:[^:]*]]: tensor<8x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[L:.*]] = graph.slice %[[H]] {starts = [0, 0], limits = [8, 8], strides = [1, 1]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x16xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[P0:.*]] = graph.collective_permute %[[L]] {axes = [tp], pairs = {{\[\[}}0, 0], [1, 2]]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x8xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.slice %[[H]] {starts = [0, 8], limits = [8, 16], strides = [1, 1]}
// CHECK-NEXT:    %[[P1:.*]] = graph.collective_permute %[[R]] {axes = [tp], pairs = {{\[\[}}0, 1], [1, 3]]}
// CHECK-NEXT:    %[[G:.*]] = graph.add %[[P0]], %[[P1]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x8xf32>
// CHECK-NEXT:    %[[P2:.*]] = graph.collective_permute %[[L]] {axes = [tp], pairs = {{\[\[}}2, 0], [3, 2]]}
// CHECK-NEXT:    %[[P3:.*]] = graph.collective_permute %[[R]] {axes = [tp], pairs = {{\[\[}}2, 1], [3, 3]]}
// CHECK-NEXT:    %[[U:.*]] = graph.add %[[P2]], %[[P3]]
// CHECK-NEXT:    %[[Y:.*]] = graph.mul %[[G]], %[[U]] {{.*}} : tensor<8x8xf32>
// CHECK-NEXT:    func.return %[[Y]] : tensor<8x8xf32>
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @fused_gate_up(%h: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x32xf32> {
  %g, %u = graph.split %h {axis = 1} : tensor<8x64xf32> -> (tensor<8x32xf32>, tensor<8x32xf32>)
  %y = graph.mul %g, %u : tensor<8x32xf32>
  func.return %y : tensor<8x32xf32>
}

// -----

// Concatenated branches (16 + 32 columns over tp = 4: blocks of 4 and 8, result blocks
// of 12) stay split: each result block is three segments of 4 columns, each the sum of
// the permutes that bring it from the operand blocks where it lies, then concatenated.
// CHECK-LABEL: func.func @concat_branches
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<8x4xf32> {{.*}}, %[[B:[^:]*]]: tensor<8x8xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[A0:.*]] = graph.collective_permute %[[A]] {axes = [tp], pairs = {{\[\[}}0, 0], [3, 1]]}
// CHECK:         %[[C:.*]] = graph.concat %{{.*}}, %{{.*}}, %{{.*}} {axis = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x12xf32>
// CHECK-NEXT:    %[[T:.*]] = graph.tanh %[[C]]
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @concat_branches(%a: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                           %b: tensor<8x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x48xf32> {
  %c = graph.concat %a, %b {axis = 1} : tensor<8x16xf32>, tensor<8x32xf32> -> tensor<8x48xf32>
  %t = graph.tanh %c : tensor<8x48xf32>
  func.return %t : tensor<8x48xf32>
}

// -----

// A slice [4, 12) of 16 columns over tp = 2: each rank's result block lies on itself,
// at offsets 4 (rank 0) and 0 (rank 1), so each rank keeps its own data: two permutes
// that send nothing (each keeps one rank's slice, the other gets zeros) and their sum.
// CHECK-LABEL: func.func @slice_window
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<8x8xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.slice %[[X]] {starts = [0, 4], limits = [8, 8], strides = [1, 1]}
// CHECK-NEXT:    %[[P0:.*]] = graph.collective_permute %[[R]] {axes = [tp], pairs = {{\[\[}}0, 0]]}
// CHECK-NEXT:    %[[L:.*]] = graph.slice %[[X]] {starts = [0, 0], limits = [8, 4], strides = [1, 1]}
// CHECK-NEXT:    %[[P1:.*]] = graph.collective_permute %[[L]] {axes = [tp], pairs = {{\[\[}}1, 1]]}
// CHECK-NEXT:    %[[S:.*]] = graph.add %[[P0]], %[[P1]]
graph.mesh @mesh axes = [tp = 2]
func.func @slice_window(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x8xf32> {
  %s = graph.slice %x {starts = [0, 4], limits = [8, 12], strides = [1, 1]} : tensor<8x16xf32> -> tensor<8x8xf32>
  %t = graph.tanh %s : tensor<8x8xf32>
  func.return %t : tensor<8x8xf32>
}

// -----

// An iota split over tp: each rank's slice starts at its own global index, which
// shard-partition passes as the iota's start (axis_index(tp) * the local size).
// CHECK-LABEL: func.func @iota_split
// CHECK:         %[[R:.*]] = graph.axis_index {axes = [tp]}
// CHECK-NEXT:    %[[N:.*]] = graph.constant {{.*}}dense<16> : tensor<i32>
// CHECK-NEXT:    %[[S:.*]] = graph.mul %[[R]], %[[N]]
// CHECK-NEXT:    graph.iota %[[S]] {dimension = 1} {{.*}} : tensor<i32> -> tensor<1x16xi64>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @iota_split(%x: tensor<8x64xi64> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>}) -> (tensor<8x64xi1> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>}) {
  %i = graph.iota {dimension = 1} : tensor<1x64xi64>
  %b = graph.broadcast_to %i : tensor<1x64xi64> -> tensor<8x64xi64>
  %e = graph.compare %x, %b {predicate = eq} : tensor<8x64xi64>, tensor<8x64xi64> -> tensor<8x64xi1>
  func.return %e : tensor<8x64xi1>
}
