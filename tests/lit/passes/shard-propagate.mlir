// RUN: tessera-opt %s --split-input-file -p shard-propagate | filecheck %s

// Sharding lists are written `{{\[\[}}dp], []]` because FileCheck reads `[[` as a variable.
// Function arguments are captured with `[^:]*` so that a capture stops at its own type.

// Megatron MLP (Shoeybi et al. 2019, fig. 3a): column-split w1, elementwise gelu, row-split
// w2; only the last matmul's output is partial, and dp on the batch rides along.
// CHECK-LABEL: func.func @megatron_mlp
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-SAME:    %[[W1:[^:]*]]: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-SAME:    %[[W2:[^:]*]]: tensor<256x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[H:.*]] = graph.matmul %[[X]], %[[W1]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp]]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[H]] {approximate = tanh} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp]]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[G]], %[[W2]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []], partial = sum[tp]>}
// CHECK-NEXT:    func.return %[[Y]]
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

// The same MLP with an unannotated input: it is written replicated, the hidden layer is
// column-split and the output partial, as with a batch split.
// CHECK-LABEL: func.func @megatron_mlp_replicated_input
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[H:.*]] = graph.matmul %[[X]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[H]] {approximate = none} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[G]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    func.return %[[Y]]
graph.mesh @mesh axes = [tp = 4]
func.func @megatron_mlp_replicated_input(%x: tensor<16x64xf32>,
                                         %w1: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                         %w2: tensor<256x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<16x64xf32> {
  %h = graph.matmul %x, %w1 : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>
  %g = graph.gelu %h {approximate = none} : tensor<16x256xf32>
  %y = graph.matmul %g, %w2 : tensor<16x256xf32>, tensor<256x64xf32> -> tensor<16x64xf32>
  func.return %y : tensor<16x64xf32>
}

// -----

// Megatron self-attention (fig. 3b): column-split q/k/v put the tp split on the merged
// H*D dim, which the reshape hands to the heads (its major part); heads stay split
// through transpose, q@k^T, softmax over keys and @v; the row-split output projection
// is the one partial sum. B=4, T=8, H=8, D=8.
// CHECK-LABEL: func.func @attention_heads_over_tp
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x8x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-SAME:    %[[WQ:[^:]*]]: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-SAME:    %[[WK:[^:]*]]: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-SAME:    %[[WV:[^:]*]]: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-SAME:    %[[WO:[^:]*]]: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[Q:.*]] = graph.matmul %[[X]], %[[WQ]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[K:.*]] = graph.matmul %[[X]], %[[WK]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[V:.*]] = graph.matmul %[[X]], %[[WV]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[Q4:.*]] = graph.reshape %[[Q]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp], []]>}
// CHECK-NEXT:    %[[K4:.*]] = graph.reshape %[[K]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp], []]>}
// CHECK-NEXT:    %[[V4:.*]] = graph.reshape %[[V]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp], []]>}
// CHECK-NEXT:    %[[QH:.*]] = graph.transpose %[[Q4]] {perm = [0, 2, 1, 3]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    %[[KT:.*]] = graph.transpose %[[K4]] {perm = [0, 2, 3, 1]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    %[[VH:.*]] = graph.transpose %[[V4]] {perm = [0, 2, 1, 3]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    %[[S:.*]] = graph.matmul %[[QH]], %[[KT]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    %[[P:.*]] = graph.softmax %[[S]] {axis = 3} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    %[[O:.*]] = graph.matmul %[[P]], %[[VH]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    %[[OT:.*]] = graph.transpose %[[O]] {perm = [0, 2, 1, 3]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp], []]>}
// CHECK-NEXT:    %[[O3:.*]] = graph.reshape %[[OT]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[O3]], %[[WO]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []], partial = sum[tp]>}
// CHECK-NEXT:    func.return %[[Y]]
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @attention_heads_over_tp(%x: tensor<4x8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], []]>},
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

// A pre-norm transformer layer: the only partial values are the outputs of the two
// row-split projections; each residual add has a non-partial operand, so its result
// is whole (the all-reduce goes before the add) and the next layer_norm sees no partial.
// CHECK-LABEL: func.func @transformer_layer
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x8x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    %[[LN1:.*]] = graph.layer_norm %[[X]] {{.*}}attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    graph.matmul %[[LN1]], {{.*}}<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    graph.matmul %[[LN1]], {{.*}}<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    graph.matmul %[[LN1]], {{.*}}<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-COUNT-3: graph.reshape {{.*}}<@mesh, {{\[\[}}dp], [], [tp], []]>}
// CHECK-COUNT-3: graph.transpose {{.*}}<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    graph.matmul {{.*}}<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    graph.softmax {{.*}}<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    graph.matmul {{.*}}<@mesh, {{\[\[}}dp], [tp], [], []]>}
// CHECK-NEXT:    graph.transpose {{.*}}<@mesh, {{\[\[}}dp], [], [tp], []]>}
// CHECK-NEXT:    graph.reshape {{.*}}<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[ATTN:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}dp], [], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[R1:.*]] = graph.add %[[X]], %[[ATTN]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    %[[LN2:.*]] = graph.layer_norm %[[R1]] {{.*}}attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    %[[H:.*]] = graph.matmul %[[LN2]], {{.*}}<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[H]] {{.*}}<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK-NEXT:    %[[MLP:.*]] = graph.matmul %[[G]], {{.*}}<@mesh, {{\[\[}}dp], [], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[R2:.*]] = graph.add %[[R1]], %[[MLP]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    func.return %[[R2]]
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @transformer_layer(%x: tensor<4x8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], []]>},
                             %wq: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                             %wk: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                             %wv: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                             %wo: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                             %w1: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                             %w2: tensor<256x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<4x8x64xf32> {
  %ln1 = graph.layer_norm %x {axes = [2], eps = 1.0e-05} : tensor<4x8x64xf32>
  %q = graph.matmul %ln1, %wq : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  %k = graph.matmul %ln1, %wk : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  %v = graph.matmul %ln1, %wv : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
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
  %attn = graph.matmul %o3, %wo : tensor<4x8x64xf32>, tensor<64x64xf32> -> tensor<4x8x64xf32>
  %r1 = graph.add %x, %attn : tensor<4x8x64xf32>
  %ln2 = graph.layer_norm %r1 {axes = [2], eps = 1.0e-05} : tensor<4x8x64xf32>
  %h = graph.matmul %ln2, %w1 : tensor<4x8x64xf32>, tensor<64x256xf32> -> tensor<4x8x256xf32>
  %g = graph.gelu %h {approximate = tanh} : tensor<4x8x256xf32>
  %mlp = graph.matmul %g, %w2 : tensor<4x8x256xf32>, tensor<256x64xf32> -> tensor<4x8x64xf32>
  %r2 = graph.add %r1, %mlp : tensor<4x8x64xf32>
  func.return %r2 : tensor<4x8x64xf32>
}

// -----

// Reducing over a split dim leaves each rank a term of the result: the result is
// partial with the reduction's kind, and the input keeps its split (no gather). A
// reduction over an unsplit dim is local and keeps the other dims' split.
// CHECK-LABEL: func.func @reduce_over_split_dim
// CHECK:         %[[E:.*]] = graph.exp %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[E]] {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = sum[tp]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mean %[[E]] {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = mean[tp]>}
// CHECK-NEXT:    %[[MX:.*]] = graph.max %[[E]] {axes = [0], keepdims = true} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = max[tp]>}
// CHECK-NEXT:    %[[R:.*]] = graph.sum %[[E]] {axes = [1], keepdims = true} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    func.return %[[S]], %[[M]], %[[MX]], %[[R]]
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @reduce_over_split_dim(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<16xf32>, tensor<16xf32>, tensor<1x16xf32>, tensor<8x1xf32>) {
  %e = graph.exp %x : tensor<8x16xf32>
  %s = graph.sum %e {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  %m = graph.mean %e {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  %mx = graph.max %e {axes = [0], keepdims = true} : tensor<8x16xf32> -> tensor<1x16xf32>
  %r = graph.sum %e {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
  func.return %s, %m, %mx, %r : tensor<16xf32>, tensor<16xf32>, tensor<1x16xf32>, tensor<8x1xf32>
}

// -----

// softmax and layer_norm over a split dim reduce statistics internally but keep the
// dim: it stays split and the result is not partial.
// CHECK-LABEL: func.func @softmax_layer_norm_over_split_dim
// CHECK-NEXT:    %[[S:.*]] = graph.softmax %{{.*}} {axis = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[L:.*]] = graph.layer_norm %{{.*}} {axes = [1], eps = 1.0e-05} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[LS:.*]] = graph.log_softmax %[[L]] {axis = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[S]], %[[LS]]
graph.mesh @mesh axes = [tp = 4]
func.func @softmax_layer_norm_over_split_dim(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>})
    -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %s = graph.softmax %x {axis = 1} : tensor<8x16xf32>
  %l = graph.layer_norm %x {axes = [1], eps = 1.0e-05} : tensor<8x16xf32>
  %ls = graph.log_softmax %l {axis = 1} : tensor<8x16xf32>
  func.return %s, %ls : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Operands split differently: a 64x64 split on columns and a 64x1 column split on rows.
// Following the small operand's rows would all_to_all the big one (3072 B per device);
// following the big one's columns gathers the small one (192 B). The cheaper layout wins
// whatever the operand order.
// CHECK-LABEL: func.func @elementwise_cheaper_layout_wins
// CHECK-NEXT:    %[[R:.*]] = graph.add %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[R2:.*]] = graph.add %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[R]], %[[R2]]
graph.mesh @mesh axes = [tp = 4]
func.func @elementwise_cheaper_layout_wins(%a: tensor<64x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                           %b: tensor<64x1xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<64x64xf32>, tensor<64x64xf32>) {
  %r = graph.add %a, %b : tensor<64x64xf32>, tensor<64x1xf32> -> tensor<64x64xf32>
  %r2 = graph.add %b, %a : tensor<64x1xf32>, tensor<64x64xf32> -> tensor<64x64xf32>
  func.return %r, %r2 : tensor<64x64xf32>, tensor<64x64xf32>
}

// -----

// A free local slice beats communication: an operand that is whole (or split over
// fewer axes) is sliced to match a more split one, instead of gathering that one.
// CHECK-LABEL: func.func @elementwise_free_slice
// CHECK-NEXT:    %[[A:.*]] = graph.add %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT:    func.return %[[A]], %[[M]]
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @elementwise_free_slice(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp, tp], []]>},
                                  %b: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                                  %c: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<16x64xf32>, tensor<16x64xf32>) {
  %a = graph.add %b, %x : tensor<16x64xf32>
  %m = graph.mul %c, %b : tensor<16x64xf32>
  func.return %a, %m : tensor<16x64xf32>, tensor<16x64xf32>
}

// -----

// A contraction whose k is split on both operands gives each rank a partial product:
// the result is partial over that axis. A whole operand is sliced along k for free.
// CHECK-LABEL: func.func @contraction_split_on_both_operands
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[Z:.*]] = graph.matmul %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[B:.*]] = graph.matmul %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []], partial = sum[tp]>}
// CHECK-NEXT:    func.return %[[Y]], %[[Z]], %[[B]]
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @contraction_split_on_both_operands(%a: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                              %b: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                              %c: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>},
                                              %p: tensor<2x8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [], [tp]]>},
                                              %q: tensor<2x64x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp], []]>})
    -> (tensor<16x32xf32>, tensor<16x32xf32>, tensor<2x8x8xf32>) {
  %y = graph.matmul %a, %b : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %z = graph.matmul %a, %c : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %bm = graph.matmul %p, %q : tensor<2x8x64xf32>, tensor<2x64x8xf32> -> tensor<2x8x8xf32>
  func.return %y, %z, %bm : tensor<16x32xf32>, tensor<16x32xf32>, tensor<2x8x8xf32>
}

// -----

// Reshape keeps a split where it is one contiguous block on both sides: on the major
// dim of a merge or of a split. A split of a merged minor dim (strided once flattened)
// is dropped, and so is one that does not divide the new major dim. Transpose moves
// splits with their dims.
// CHECK-LABEL: func.func @reshape_transpose_split_dims
// CHECK-NEXT:    %[[MAJOR:.*]] = graph.reshape %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp]]>}
// CHECK-NEXT:    %[[MINOR:.*]] = graph.reshape %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]]>}
// CHECK-NEXT:    %[[UNFLAT:.*]] = graph.reshape %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[INNER:.*]] = graph.reshape %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp], []]>}
// CHECK-NEXT:    %[[SMALL:.*]] = graph.reshape %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[T:.*]] = graph.transpose %{{.*}} {perm = [1, 0]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [tp = 4]
func.func @reshape_transpose_split_dims(%rows: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                        %cols: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                        %flat: tensor<128xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>},
                                        %short: tensor<32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) {
  %major = graph.reshape %rows : tensor<8x16xf32> -> tensor<128xf32>
  %minor = graph.reshape %cols : tensor<8x16xf32> -> tensor<128xf32>
  %unflat = graph.reshape %flat : tensor<128xf32> -> tensor<8x16xf32>
  %inner = graph.reshape %cols : tensor<8x16xf32> -> tensor<8x4x4xf32>
  %small = graph.reshape %short : tensor<32xf32> -> tensor<2x16xf32>
  %t = graph.transpose %rows {perm = [1, 0]} : tensor<8x16xf32> -> tensor<16x8xf32>
  func.return
}

// -----

// Both axes of a dp × tp mesh in one program: a dim split over both (major first), a
// mean over it partial over both, and dp on rows with tp on k in one matmul.
// CHECK-LABEL: func.func @dp_tp_mesh_both_axes
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mean %[[Y]] {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = mean[dp, tp]>}
// CHECK-NEXT:    %[[Z:.*]] = graph.matmul %{{.*}}, %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[Z]] {approximate = none} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT:    func.return %[[M]], %[[G]]
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @dp_tp_mesh_both_axes(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp, tp], []]>},
                                %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>},
                                %x2: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                                %w2: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<32xf32>, tensor<16x32xf32>) {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %m = graph.mean %y {axes = [0], keepdims = false} : tensor<16x32xf32> -> tensor<32xf32>
  %z = graph.matmul %x2, %w2 : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %g = graph.gelu %z {approximate = none} : tensor<16x32xf32>
  func.return %m, %g : tensor<32xf32>, tensor<16x32xf32>
}

// -----

// A user constraint in the middle that differs from the propagated layout is closed:
// the constraint's result keeps the user's layout (its consumers follow it) and the
// producer keeps the layout propagated from the input.
// CHECK-LABEL: func.func @conflicting_constraint
// CHECK-NEXT:    %[[E:.*]] = graph.exp %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[C:.*]] = graph.shard %[[E]] {sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[C]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[N]]
graph.mesh @mesh axes = [tp = 4]
func.func @conflicting_constraint(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<8x16xf32> {
  %e = graph.exp %x : tensor<8x16xf32>
  %c = graph.shard %e {sharding = #graph.sharding<@mesh, [[], [tp]]>} : tensor<8x16xf32>
  %n = graph.neg %c : tensor<8x16xf32>
  func.return %n : tensor<8x16xf32>
}

// -----

// An unannotated weight takes the layout its matmul uses: split along k like the
// activation, so the weight is not replicated and the product is partial.
// CHECK-LABEL: func.func @backward_into_weight
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-SAME:    %[[W:[^:]*]]: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[X]], %[[W]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    func.return %[[Y]]
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @backward_into_weight(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                %w: tensor<64x32xf32>) -> tensor<16x32xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  func.return %y : tensor<16x32xf32>
}

// -----

// With no annotated input, a constraint on a result flows backward through the matmul
// into both arguments: the weight is column-split, the activation whole.
// CHECK-LABEL: func.func @backward_from_constraint
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-SAME:    %[[W:[^:]*]]: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[X]], %[[W]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[C:.*]] = graph.shard %[[Y]] {{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[C]]
graph.mesh @mesh axes = [tp = 4]
func.func @backward_from_constraint(%x: tensor<16x64xf32>, %w: tensor<64x32xf32>) -> tensor<16x32xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %c = graph.shard %y {sharding = #graph.sharding<@mesh, [[], [tp]]>} : tensor<16x32xf32>
  func.return %c : tensor<16x32xf32>
}

// -----

// Ops linear in a partial value keep it partial (the all-reduce can wait): neg,
// transpose, add of two values partial over the same axis, mul by a whole value, sum.
// CHECK-LABEL: func.func @partial_through_linear_ops
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[Y]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[T:.*]] = graph.transpose %[[N]] {perm = [1, 0]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[A:.*]] = graph.add %[[T]], %[[T]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[A]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[M]] {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = sum[tp]>}
// CHECK-NEXT:    func.return %[[S]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_through_linear_ops(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                      %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                      %b: tensor<32x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> tensor<16xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %n = graph.neg %y : tensor<16x32xf32>
  %t = graph.transpose %n {perm = [1, 0]} : tensor<16x32xf32> -> tensor<32x16xf32>
  %a = graph.add %t, %t : tensor<32x16xf32>
  %m = graph.mul %a, %b : tensor<32x16xf32>
  %s = graph.sum %m {axes = [0], keepdims = false} : tensor<32x16xf32> -> tensor<16xf32>
  func.return %s : tensor<16xf32>
}

// -----

// A partial value whose linear consumers would end in more bytes than it holds is
// reduced first, once (a layer norm's backward: the input gradient [16, 32] and the
// weight gradient [32] from one incoming gradient): it is not partial, nor is anything
// computed from it.
// CHECK-LABEL: func.func @partial_fanout_reduced_first
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[Y]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[Y]] {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]]>}
// CHECK-NEXT:    func.return %[[M]], %[[S]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_fanout_reduced_first(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                        %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                        %b: tensor<16x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<16x32xf32>, tensor<32xf32>) {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %m = graph.mul %y, %b : tensor<16x32xf32>
  %s = graph.sum %y {axes = [0], keepdims = false} : tensor<16x32xf32> -> tensor<32xf32>
  func.return %m, %s : tensor<16x32xf32>, tensor<32xf32>
}

// -----

// Ops not linear in a partial value need its sum first, so their results are whole:
// exp, add of a partial and a whole value, mul of two partial values, and a max
// partial through neg (-max(a, b) is not max(-a, -b)).
// CHECK-LABEL: func.func @partial_dropped_by_nonlinear_ops
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[Y]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[A:.*]] = graph.add %[[Y]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[Y]], %[[Y]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[MX:.*]] = graph.max %{{.*}} {axes = [1], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = max[tp]>}
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[MX]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]]>}
// CHECK-NEXT:    func.return %[[E]], %[[A]], %[[M]], %[[N]]
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @partial_dropped_by_nonlinear_ops(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                            %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                            %b: tensor<16x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>},
                                            %c: tensor<32x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>})
    -> (tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<32xf32>) {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %e = graph.exp %y : tensor<16x32xf32>
  %a = graph.add %y, %b : tensor<16x32xf32>
  %m = graph.mul %y, %y : tensor<16x32xf32>
  %mx = graph.max %c {axes = [1], keepdims = false} : tensor<32x16xf32> -> tensor<32xf32>
  %n = graph.neg %mx : tensor<32xf32>
  func.return %e, %a, %m, %n : tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<32xf32>
}

// -----

// Vocab-parallel lookup: the table split over tp on the vocabulary (the gathered axis, a
// sum-reduction factor) gives a result partial over tp (each rank looks up the rows it
// holds); dp on the ids rides along. The table is not gathered.
// CHECK-LABEL: func.func @vocab_parallel_embedding
// CHECK:         graph.gather %{{.*}}, %{{.*}} {axis = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []], partial = sum[tp]>}
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @vocab_parallel_embedding(%t: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                    %i: tensor<8xi64> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<8x16xf32> {
  %e = graph.gather %t, %i {axis = 0} : tensor<64x16xf32>, tensor<8xi64> -> tensor<8x16xf32>
  func.return %e : tensor<8x16xf32>
}

// -----

// split / concat / slice along a split dim keep it split (a BLOCKS factor): each rank
// holds its block of every piece, and shard-partition moves the blocks into place,
// which moves less than gathering the dim.
// CHECK-LABEL: func.func @blocks_stay_split
// CHECK-NEXT:    %[[G:.*]], %[[U:.*]] = graph.split %{{.*}} {axis = 1} attributes {graph.sharding = [#graph.sharding<@mesh, {{\[\[}}], [tp]]>, #graph.sharding<@mesh, {{\[\[}}], [tp]]>]}
// CHECK-NEXT:    %[[C:.*]] = graph.concat %[[U]], %[[G]] {axis = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[S:.*]] = graph.slice %[[C]] {starts = [0, 16], limits = [8, 48], strides = [1, 1]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[S]]
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @blocks_stay_split(%h: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<8x32xf32> {
  %g, %u = graph.split %h {axis = 1} : tensor<8x64xf32> -> (tensor<8x32xf32>, tensor<8x32xf32>)
  %c = graph.concat %u, %g {axis = 1} : tensor<8x32xf32>, tensor<8x32xf32> -> tensor<8x64xf32>
  %s = graph.slice %c {starts = [0, 16], limits = [8, 48], strides = [1, 1]} : tensor<8x64xf32> -> tensor<8x32xf32>
  func.return %s : tensor<8x32xf32>
}

// -----

// Vocab-parallel cross-entropy: the class dim split over tp is a statistic (reduced inside
// the op), so the loss is not partial over tp; the mean over dp-split rows is partial
// (mean) over dp.
// CHECK-LABEL: func.func @vocab_parallel_cross_entropy
// CHECK:         graph.cross_entropy %{{.*}}, %{{.*}} {reduction = mean} attributes {graph.sharding = #graph.sharding<@mesh, [], partial = mean[dp]>}
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @vocab_parallel_cross_entropy(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                                        %l: tensor<8xi64> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<f32> {
  %c = graph.cross_entropy %x, %l {reduction = mean} : tensor<8x64xf32>, tensor<8xi64> -> tensor<f32>
  func.return %c : tensor<f32>
}

// -----

// Pieces that cannot be split among the ranks (chunks of 2 columns over tp = 4) need the
// dim whole; so does a strided slice.
// CHECK-LABEL: func.func @blocks_that_do_not_divide
// CHECK-NEXT:    graph.split %{{.*}} {axis = 1} attributes {graph.sharding = [#graph.sharding<@mesh, {{\[\[}}], []]>, #graph.sharding<@mesh, {{\[\[}}], []]>, #graph.sharding<@mesh, {{\[\[}}], []]>, #graph.sharding<@mesh, {{\[\[}}], []]>]}
// CHECK-NEXT:    graph.slice %{{.*}} {starts = [0, 0], limits = [8, 8], strides = [1, 2]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
graph.mesh @mesh axes = [tp = 4]
func.func @blocks_that_do_not_divide(%h: tensor<8x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> (tensor<8x2xf32>, tensor<8x4xf32>) {
  %a, %b, %c, %d = graph.split %h {axis = 1} : tensor<8x8xf32> -> (tensor<8x2xf32>, tensor<8x2xf32>, tensor<8x2xf32>, tensor<8x2xf32>)
  %s = graph.slice %h {starts = [0, 0], limits = [8, 8], strides = [1, 2]} : tensor<8x8xf32> -> tensor<8x4xf32>
  func.return %a, %s : tensor<8x2xf32>, tensor<8x4xf32>
}

// -----

// Result-side proposals: the split a value's user wants reaches its producer. The
// flatten cannot carry its operand's split (on the minor dim it merges), but it takes
// the split the constraint wants on its major dim (insert-collectives moves it there
// by one all-to-all instead of a gather).
// CHECK-LABEL: func.func @transpose_flatten
// CHECK-NEXT:    %[[T:.*]] = graph.transpose %{{.*}} {perm = [1, 0]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[F:.*]] = graph.reshape %[[T]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp]]>}
graph.mesh @mesh axes = [tp = 4]
func.func @transpose_flatten(%x: tensor<64x128xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<8192xf32> {
  %t = graph.transpose %x {perm = [1, 0]} : tensor<64x128xf32> -> tensor<128x64xf32>
  %f = graph.reshape %t : tensor<128x64xf32> -> tensor<8192xf32>
  %s = graph.shard %f {sharding = #graph.sharding<@mesh, [[tp]]>} : tensor<8192xf32>
  func.return %s : tensor<8192xf32>
}

// -----

// A partial sum whose users are not linear takes, through them, the split the last
// one's constraint wants: gelu and tanh run on rows, so the sum can be reduce-scattered.
// CHECK-LABEL: func.func @partial_into_split_users
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul {{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[Y]] {approximate = none} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[T:.*]] = graph.tanh %[[G]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
graph.mesh @mesh axes = [tp = 4]
func.func @partial_into_split_users(%a: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                    %b: tensor<256x128xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<64x128xf32> {
  %y = graph.matmul %a, %b : tensor<64x256xf32>, tensor<256x128xf32> -> tensor<64x128xf32>
  %g = graph.gelu %y {approximate = none} : tensor<64x128xf32>
  %t = graph.tanh %g : tensor<64x128xf32>
  %s = graph.shard %t {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<64x128xf32>
  func.return %s : tensor<64x128xf32>
}
