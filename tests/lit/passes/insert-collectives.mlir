// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives | filecheck %s

// Sharding lists are written `{{\[\[}}dp], []]` because FileCheck reads `[[` as a variable.
// Function arguments are captured with `[^:]*` so that a capture stops at its own type.
// `graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}` matches any collective.

// Megatron MLP (Shoeybi et al. 2019, fig. 3a): column-split w1, local gelu, row-split w2;
// the only communication is one all-reduce over tp of the second matmul's partial output.
// CHECK-LABEL: func.func @megatron_mlp
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32>
// CHECK-SAME:    %[[W1:[^:]*]]: tensor<64x256xf32>
// CHECK-SAME:    %[[W2:[^:]*]]: tensor<256x64xf32>
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         %[[H:.*]] = graph.matmul %[[X]], %[[W1]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp]]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[H]]
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[G]], %[[W2]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT:    func.return %[[R]]
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

// Megatron self-attention (fig. 3b), heads split over tp: q/k/v projections, head
// reshape/transpose, scores, softmax over keys and @v are all local; the row-split
// output projection is the one all-reduce. B=4, T=8, H=8, D=8.
// CHECK-LABEL: func.func @attention_heads_over_tp
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         graph.softmax {{.*}}<@mesh, {{\[\[}}], [tp], [], []]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], [], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    func.return %[[R]]
graph.mesh @mesh axes = [tp = 4]
func.func @attention_heads_over_tp(%x: tensor<4x8x64xf32>,
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

// A pre-norm transformer layer on dp x tp: exactly two all-reduces in the forward pass,
// one per row-split projection, each just before its residual add; layer_norm (over the
// whole hidden dim) and the residual adds are local.
// CHECK-LABEL: func.func @transformer_layer
// CHECK-SAME:    %[[X:[^:]*]]: tensor<4x8x64xf32>
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         %[[ATTN:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}dp], [], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[AR1:.*]] = graph.all_reduce %[[ATTN]] {axes = [tp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    %[[R1:.*]] = graph.add %[[X]], %[[AR1]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NEXT:    %[[LN2:.*]] = graph.layer_norm %[[R1]] {{.*}}attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         %[[MLP:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}dp], [], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[AR2:.*]] = graph.all_reduce %[[MLP]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[R2:.*]] = graph.add %[[R1]], %[[AR2]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [], []]>}
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

// Reducing over a split dim all-reduces the small result (16 values), with the
// reduction's own kind, just before the return; the 64x16 input is never gathered.
// CHECK-LABEL: func.func @reduce_over_split_dim
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[S:.*]] = graph.sum %{{.*}} {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = sum[tp]>}
// CHECK-NEXT:    %[[MX:.*]] = graph.max %{{.*}} {axes = [0], keepdims = true} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = max[tp]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mean %{{.*}} {axes = [0], keepdims = false} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = mean[tp]>}
// CHECK-NEXT:    %[[RS:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum} {{.*}} : tensor<16xf32>
// CHECK-NEXT:    %[[RMX:.*]] = graph.all_reduce %[[MX]] {axes = [tp], kind = max} {{.*}} : tensor<1x16xf32>
// CHECK-NEXT:    %[[RM:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = mean} {{.*}} : tensor<16xf32>
// CHECK-NEXT:    func.return %[[RS]], %[[RMX]], %[[RM]]
graph.mesh @mesh axes = [tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @reduce_over_split_dim(%x: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<16xf32>, tensor<1x16xf32>, tensor<16xf32>) {
  %e = graph.exp %x : tensor<64x16xf32>
  %s = graph.sum %e {axes = [0], keepdims = false} : tensor<64x16xf32> -> tensor<16xf32>
  %mx = graph.max %e {axes = [0], keepdims = true} : tensor<64x16xf32> -> tensor<1x16xf32>
  %m = graph.mean %e {axes = [0], keepdims = false} : tensor<64x16xf32> -> tensor<16xf32>
  func.return %s, %mx, %m : tensor<16xf32>, tensor<1x16xf32>, tensor<16xf32>
}

// -----

// Normalisations over a split dim need no collective here: shard-partition expands
// them into local statistics and an all-reduce of those, so nothing is gathered.
// CHECK-LABEL: func.func @normalizations_over_split_dim
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         %[[A:.*]] = graph.softmax %{{.*}} {axis = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[B:.*]] = graph.layer_norm %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[C:.*]] = graph.rms_norm %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[D:.*]] = graph.log_softmax %{{.*}} {axis = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[A]], %[[B]], %[[C]], %[[D]]
graph.mesh @mesh axes = [tp = 4]
func.func @normalizations_over_split_dim(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>})
    -> (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) {
  %a = graph.softmax %x {axis = 1} : tensor<8x16xf32>
  %b = graph.layer_norm %x {axes = [1], eps = 1.0e-05} : tensor<8x16xf32>
  %c = graph.rms_norm %x {axes = [1], eps = 1.0e-06} : tensor<8x16xf32>
  %d = graph.log_softmax %x {axis = 1} : tensor<8x16xf32>
  func.return %a, %b, %c, %d : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Operands split over fewer axes than their partner are sliced locally (free), never
// gathered: %b gains tp after its dp; the replicated %c is sliced over dp, then tp.
// CHECK-LABEL: func.func @elementwise_free_slice
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32>
// CHECK-SAME:    %[[B:[^:]*]]: tensor<16x64xf32>
// CHECK-SAME:    %[[C:[^:]*]]: tensor<16x64xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[BS:.*]] = graph.all_slice %[[B]] {axes = [tp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT:    %[[A:.*]] = graph.add %[[BS]], %[[X]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT:    %[[C1:.*]] = graph.all_slice %[[C]] {axes = [dp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT:    %[[C2:.*]] = graph.all_slice %[[C1]] {axes = [tp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[C2]], %[[X]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT:    func.return %[[A]], %[[M]]
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @elementwise_free_slice(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp, tp], []]>},
                                  %b: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                                  %c: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<16x64xf32>, tensor<16x64xf32>) {
  %a = graph.add %b, %x : tensor<16x64xf32>
  %m = graph.mul %c, %x : tensor<16x64xf32>
  func.return %a, %m : tensor<16x64xf32>, tensor<16x64xf32>
}

// -----

// Operands split on different dims: the split of one moves to the other's dim with a
// single all_to_all (3/4 of the local block), not an all_gather followed by a slice.
// CHECK-LABEL: func.func @elementwise_split_moves_dim
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x16xf32>
// CHECK-SAME:    %[[Y:[^:]*]]: tensor<16x16xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[T:.*]] = graph.all_to_all %[[Y]] {axes = [tp], split_dim = 0, concat_dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[A:.*]] = graph.add %[[X]], %[[T]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    func.return %[[A]]
graph.mesh @mesh axes = [tp = 4]
func.func @elementwise_split_moves_dim(%x: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                       %y: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<16x16xf32> {
  %a = graph.add %x, %y : tensor<16x16xf32>
  func.return %a : tensor<16x16xf32>
}

// -----

// A partial sum stays partial through ops linear in it (neg, mul by a whole value) and
// is all-reduced once, at the return.
// CHECK-LABEL: func.func @partial_through_linear_ops
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[Y]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[N]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[MR:.*]] = graph.all_reduce %[[M]] {axes = [tp], kind = sum}
// CHECK-NEXT:    func.return %[[MR]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_through_linear_ops(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                      %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                      %b: tensor<16x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> tensor<16x32xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %n = graph.neg %y : tensor<16x32xf32>
  %m = graph.mul %n, %b : tensor<16x32xf32>
  func.return %m : tensor<16x32xf32>
}

// -----

// A non-linear op (exp) needs the sum, so the value is all-reduced anyway: the linear
// consumers share that one all-reduce instead of staying partial and reducing again.
// CHECK-LABEL: func.func @partial_linear_vs_nonlinear
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[YR:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[YR]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[N]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[YR]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NOT:     graph.all_reduce
// CHECK:         func.return %[[E]], %[[M]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_linear_vs_nonlinear(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                       %b: tensor<16x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<16x32xf32>, tensor<16x32xf32>) {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %n = graph.neg %y : tensor<16x32xf32>
  %m = graph.mul %n, %b : tensor<16x32xf32>
  %e = graph.exp %y : tensor<16x32xf32>
  func.return %e, %m : tensor<16x32xf32>, tensor<16x32xf32>
}

// -----

// Linear consumers only, but they would end in more bytes than the partial value holds
// (a [16, 32] product and a [32] sum, as in a layer norm's backward): one all_reduce of
// the value, shared, instead of one per result.
// CHECK-LABEL: func.func @partial_fanout_reduced_once
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[YR:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[YR]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[YR]] {{.*}}attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]]>}
// CHECK-NOT:     graph.all_reduce
// CHECK:         func.return %[[M]], %[[S]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_fanout_reduced_once(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                       %b: tensor<16x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<16x32xf32>, tensor<32xf32>) {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %m = graph.mul %y, %b : tensor<16x32xf32>
  %s = graph.sum %y {axes = [0], keepdims = false} : tensor<16x32xf32> -> tensor<32xf32>
  func.return %m, %s : tensor<16x32xf32>, tensor<32xf32>
}

// -----

// A constraint splitting a partial result's dim is one reduce_scatter (each rank
// receives 3/4 of a block), not an all_reduce of the whole tensor followed by a slice.
// CHECK-LABEL: func.func @partial_to_split_constraint
// CHECK-NOT:     graph.all_reduce
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[RS:.*]] = graph.reduce_scatter %[[Y]] {axes = [tp], dim = 0, kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[RS]] {{.*}}attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    func.return %[[G]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_to_split_constraint(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<16x32xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %c = graph.shard %y {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<16x32xf32>
  %g = graph.gelu %c {approximate = none} : tensor<16x32xf32>
  func.return %g : tensor<16x32xf32>
}

// -----

// Sequence parallelism (Korthikanti et al. 2022): a residual split over rows plus a
// row-split projection's partial output; the add takes the residual's split, so the
// partial is reduce-scattered into it and nothing is all-reduced or gathered.
// CHECK-LABEL: func.func @partial_into_split_residual
// CHECK-SAME:    %[[R:[^:]*]]: tensor<16x32xf32>
// CHECK-NOT:     graph.{{all_reduce|all_gather}}
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}partial = sum[tp]>}
// CHECK-NEXT:    %[[RS:.*]] = graph.reduce_scatter %[[Y]] {axes = [tp], dim = 0, kind = sum}
// CHECK-NEXT:    %[[Z:.*]] = graph.add %[[R]], %[[RS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    func.return %[[Z]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_into_split_residual(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                       %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                       %r: tensor<16x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<16x32xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %z = graph.add %r, %y : tensor<16x32xf32>
  func.return %z : tensor<16x32xf32>
}

// -----

// A constraint asking for a whole value is an all_gather of the split dim; one moving
// the split to another dim is an all_to_all. The constraints themselves disappear.
// CHECK-LABEL: func.func @constraints_gather_and_move
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32>
// CHECK-NOT:     graph.shard %
// CHECK:         %[[E:.*]] = graph.exp %[[X]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[E]] {axes = [tp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[G]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[T:.*]] = graph.all_to_all %[[E]] {axes = [tp], split_dim = 1, concat_dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[A:.*]] = graph.abs %[[T]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[N]], %[[A]]
graph.mesh @mesh axes = [tp = 4]
func.func @constraints_gather_and_move(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<16x64xf32>, tensor<16x64xf32>) {
  %e = graph.exp %x : tensor<16x64xf32>
  %c = graph.shard %e {sharding = #graph.sharding<@mesh, [[], []]>} : tensor<16x64xf32>
  %n = graph.neg %c : tensor<16x64xf32>
  %d = graph.shard %e {sharding = #graph.sharding<@mesh, [[], [tp]]>} : tensor<16x64xf32>
  %a = graph.abs %d : tensor<16x64xf32>
  func.return %n, %a : tensor<16x64xf32>, tensor<16x64xf32>
}

// -----

// Collectives written by the user state a layout: an all_reduce of a value that is not
// partial is a no-op and disappears; an all_gather of a split dim and an all_reduce of
// a partial value stay real collectives.
// CHECK-LABEL: func.func @user_collectives
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32>
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[X]]
// CHECK-NEXT:    %[[N:.*]] = graph.neg %[[E]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[E]] {axes = [tp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul {{.*}}partial = sum[tp]>}
// CHECK-NEXT:    %[[S:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}
// CHECK-NEXT:    func.return %[[N]], %[[G]], %[[S]]
graph.mesh @mesh axes = [tp = 4]
func.func @user_collectives(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                            %a: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                            %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<16x64xf32>, tensor<16x64xf32>, tensor<16x32xf32>) {
  %e = graph.exp %x : tensor<16x64xf32>
  %r = graph.all_reduce %e {axes = [tp], kind = sum} : tensor<16x64xf32>
  %n = graph.neg %r : tensor<16x64xf32>
  %g = graph.all_gather %e {axes = [tp], dim = 0} : tensor<16x64xf32>
  %y = graph.matmul %a, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %s = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<16x32xf32>
  func.return %n, %g, %s : tensor<16x64xf32>, tensor<16x64xf32>, tensor<16x32xf32>
}

// -----

// Megatron MLP with a data-parallel batch on a dp x tp mesh, ending in a mean loss:
// logits are all-reduced over tp only (cross_entropy needs whole classes), the per-rank
// loss is a partial mean over dp, reduced over dp alone; the batch is never gathered.
// CHECK-LABEL: func.func @dp_tp_mlp_loss
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-SAME:    %[[L:[^:]*]]: tensor<16xi32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp]]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_slice|all_to_all}}
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}<@mesh, {{\[\[}}dp], []], partial = sum[tp]>}
// CHECK-NEXT:    %[[YR:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT:    %[[LOSS:.*]] = graph.cross_entropy %[[YR]], %[[L]] {reduction = mean} attributes {graph.sharding = #graph.sharding<@mesh, [], partial = mean[dp]>}
// CHECK-NEXT:    %[[LR:.*]] = graph.all_reduce %[[LOSS]] {axes = [dp], kind = mean} attributes {graph.sharding = #graph.sharding<@mesh, []>}
// CHECK-NEXT:    func.return %[[LR]]
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

// A partial value needed whole by three operands (exp, tanh, both sides of a mul) is
// all-reduced once and the result shared.
// CHECK-LABEL: func.func @partial_used_many_times_reduced_once
// CHECK:         %[[Y:.*]] = graph.matmul {{.*}}partial = sum[tp]>}
// CHECK-NEXT:    %[[YR:.*]] = graph.all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[E:.*]] = graph.exp %[[YR]]
// CHECK-NEXT:    %[[T:.*]] = graph.tanh %[[YR]]
// CHECK-NEXT:    %[[M:.*]] = graph.mul %[[YR]], %[[YR]]
// CHECK-NOT:     graph.all_reduce
// CHECK:         func.return %[[E]], %[[T]], %[[M]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_used_many_times_reduced_once(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                                %w: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>})
    -> (tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>) {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32>
  %e = graph.exp %y : tensor<16x32xf32>
  %t = graph.tanh %y : tensor<16x32xf32>
  %m = graph.mul %y, %y : tensor<16x32xf32>
  func.return %e, %t, %m : tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>
}

// -----

// A split value that two consumers need whole (strided slices of its split dim) is
// gathered once.
// CHECK-LABEL: func.func @gather_shared_by_two_consumers
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x16xf32>
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[X]] {axes = [tp], dim = 1}
// CHECK-NEXT:    %[[A:.*]] = graph.slice %[[G]] {starts = [0, 0], limits = [8, 16], strides = [1, 2]}
// CHECK-NEXT:    %[[B:.*]] = graph.slice %[[G]] {starts = [0, 1], limits = [8, 16], strides = [1, 2]}
// CHECK-NEXT:    func.return %[[A]], %[[B]]
graph.mesh @mesh axes = [tp = 4]
func.func @gather_shared_by_two_consumers(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>})
    -> (tensor<8x8xf32>, tensor<8x8xf32>) {
  %a = graph.slice %x {starts = [0, 0], limits = [8, 16], strides = [1, 2]} : tensor<8x16xf32> -> tensor<8x8xf32>
  %b = graph.slice %x {starts = [0, 1], limits = [8, 16], strides = [1, 2]} : tensor<8x16xf32> -> tensor<8x8xf32>
  func.return %a, %b : tensor<8x8xf32>, tensor<8x8xf32>
}

// -----

// Constants are built whole on every rank and sliced (free) where a consumer is split;
// a constant that broadcasts over the split dim is used whole.
// CHECK-LABEL: func.func @constants_sliced_for_split_consumers
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32>
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[B:.*]] = graph.constant attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} dense<1.000000e+00> : tensor<16x64xf32>
// CHECK-NEXT:    %[[BS:.*]] = graph.all_slice %[[B]] {axes = [tp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[Z:.*]] = graph.add %[[X]], %[[BS]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    %[[C:.*]] = graph.constant attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]]>} dense<2.000000e+00> : tensor<64xf32>
// CHECK-NEXT:    %[[CS:.*]] = graph.all_slice %[[C]] {axes = [tp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp]]>}
// CHECK-NEXT:    %[[Z2:.*]] = graph.mul %[[Z]], %[[CS]]
// CHECK-NEXT:    %[[D:.*]] = graph.constant attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} dense<3.000000e+00> : tensor<16x1xf32>
// CHECK-NEXT:    %[[Z3:.*]] = graph.sub %[[Z2]], %[[D]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>}
// CHECK-NEXT:    func.return %[[Z3]]
graph.mesh @mesh axes = [tp = 4]
func.func @constants_sliced_for_split_consumers(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<16x64xf32> {
  %b = graph.constant dense<1.0> : tensor<16x64xf32>
  %z = graph.add %x, %b : tensor<16x64xf32>
  %c = graph.constant dense<2.0> : tensor<64xf32>
  %z2 = graph.mul %z, %c : tensor<16x64xf32>, tensor<64xf32> -> tensor<16x64xf32>
  %d = graph.constant dense<3.0> : tensor<16x1xf32>
  %z3 = graph.sub %z2, %d : tensor<16x64xf32>, tensor<16x1xf32> -> tensor<16x64xf32>
  func.return %z3 : tensor<16x64xf32>
}

// -----

// Moving a split from tp on columns to dp on rows: the free dp slice comes first, so
// the tp all_gather that follows moves half the bytes it would on the unsliced block.
// CHECK-LABEL: func.func @slice_before_gather
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16x64xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.all_slice %[[X]] {axes = [dp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp]]>}
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[S]] {axes = [tp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT:    func.return %[[G]]
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @slice_before_gather(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<16x64xf32> {
  %c = graph.shard %x {sharding = #graph.sharding<@mesh, [[dp], []]>} : tensor<16x64xf32>
  func.return %c : tensor<16x64xf32>
}

// -----

// A sum over both mesh axes leaves a value partial over dp and tp: one all_reduce over
// both axes (a ring over all 8 ranks moves 2(n-1)/n of the data once), not one per axis.
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
// CHECK-LABEL: func.func @partial_over_two_axes
func.func @partial_over_two_axes(%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>}) -> tensor<f32> {
  // CHECK: %[[S:.*]] = graph.sum %{{.*}} {axes = [0, 1], keepdims = false}
  // CHECK-NEXT: graph.all_reduce %[[S]] {axes = [tp, dp], kind = sum}
  // CHECK-NOT: graph.all_reduce
  %s = graph.sum %x {axes = [0, 1], keepdims = false} : tensor<16x64xf32> -> tensor<f32>
  func.return %s : tensor<f32>
}

// -----

// Slice before reducing: a value partial over tp, constrained to rows over (dp, tp), is
// sliced over dp (free), then reduce-scattered over tp: 0.375 of the local bytes, not an
// all_reduce (1.5x) + slices. The slice moves up to x (the matmul takes the dp prefix of
// the rows' (dp, tp) split), so each rank also multiplies half the rows.
// (K = 512 makes splitting the contraction clearly cheaper than gathering x and w.)
graph.mesh @mesh axes = [dp = 2, tp = 4]
// CHECK-LABEL: func.func @slice_before_reduce
func.func @slice_before_reduce(%x: tensor<64x512xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                               %w: tensor<512x64xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<64x64xf32> {
  // CHECK: %[[S:.*]] = graph.all_slice %{{.*}} {axes = [dp], dim = 0}
  // CHECK-NEXT: %[[Y:.*]] = graph.matmul %[[S]]
  // CHECK-NEXT: graph.reduce_scatter %[[Y]] {axes = [tp], dim = 0, kind = sum}
  // CHECK-NOT: graph.all_reduce
  %y = graph.matmul %x, %w : tensor<64x512xf32>, tensor<512x64xf32> -> tensor<64x64xf32>
  %z = graph.shard %y {sharding = #graph.sharding<@mesh, [[dp, tp], []]>} : tensor<64x64xf32>
  func.return %z : tensor<64x64xf32>
}

// -----

// Vocab-parallel lookup: the partial lookup is all-reduced over tp (the 8x16 result, not
// the 64x16 table), or reduce-scattered straight into a consumer's tp-split layout.
// CHECK-LABEL: func.func @vocab_parallel_embedding
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[E:.*]] = graph.gather
// CHECK-NEXT:    graph.all_reduce %[[E]] {axes = [tp], kind = sum}
graph.mesh @mesh axes = [dp = 2, tp = 4] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @vocab_parallel_embedding(%t: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                    %i: tensor<8xi64> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<8x16xf32> {
  %e = graph.gather %t, %i {axis = 0} : tensor<64x16xf32>, tensor<8xi64> -> tensor<8x16xf32>
  func.return %e : tensor<8x16xf32>
}

// -----

// CHECK-LABEL: func.func @vocab_parallel_embedding_scattered
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[E:.*]] = graph.gather
// CHECK-NEXT:    graph.reduce_scatter %[[E]] {axes = [tp], dim = 0, kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NOT:     graph.all_reduce
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @vocab_parallel_embedding_scattered(%t: tensor<64x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                                              %i: tensor<8xi64>) -> tensor<8x16xf32> {
  %e = graph.gather %t, %i {axis = 0} : tensor<64x16xf32>, tensor<8xi64> -> tensor<8x16xf32>
  %s = graph.shard %e {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<8x16xf32>
  func.return %s : tensor<8x16xf32>
}

// -----

// A table small next to the lookup is still gathered: all-gathering 4x16 costs less than
// all-reducing the 64x16 result (the cost model decides, not the rule).
// CHECK-LABEL: func.func @small_table
// CHECK:         graph.all_gather %{{.*}} {axes = [tp], dim = 0}
// CHECK-NOT:     graph.all_reduce
graph.mesh @mesh axes = [tp = 4]
func.func @small_table(%t: tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>},
                       %i: tensor<64xi64>) -> tensor<64x16xf32> {
  %e = graph.gather %t, %i {axis = 0} : tensor<4x16xf32>, tensor<64xi64> -> tensor<64x16xf32>
  func.return %e : tensor<64x16xf32>
}

// -----

// The layout a user wants reaches the reshape that makes the value: the split moves from
// the transposed minor dim to the major one by an all-to-all (a quarter of the bytes of
// gathering it), and the constraint then has nothing to do.
// CHECK-LABEL: func.func @transpose_flatten
// CHECK-NEXT:    %[[T:.*]] = graph.transpose
// CHECK-NEXT:    %[[A:.*]] = graph.all_to_all %[[T]] {axes = [tp], split_dim = 0, concat_dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[F:.*]] = graph.reshape %[[A]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp]]>}
// CHECK-NEXT:    func.return %[[F]]
graph.mesh @mesh axes = [tp = 4]
func.func @transpose_flatten(%x: tensor<64x128xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<8192xf32> {
  %t = graph.transpose %x {perm = [1, 0]} : tensor<64x128xf32> -> tensor<128x64xf32>
  %f = graph.reshape %t : tensor<128x64xf32> -> tensor<8192xf32>
  %s = graph.shard %f {sharding = #graph.sharding<@mesh, [[tp]]>} : tensor<8192xf32>
  func.return %s : tensor<8192xf32>
}

// -----

// Vocab-parallel cross-entropy: no gather of the logits; the loss's mean over dp-split
// rows is all-reduced over dp (the statistics over tp are shard-partition's).
// CHECK-LABEL: func.func @vocab_parallel_cross_entropy
// CHECK-NOT:     graph.all_gather
// CHECK:         %[[C:.*]] = graph.cross_entropy
// CHECK-NEXT:    graph.all_reduce %[[C]] {axes = [dp], kind = mean}
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @vocab_parallel_cross_entropy(%x: tensor<8x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                                        %l: tensor<8xi64> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<f32> {
  %c = graph.cross_entropy %x, %l {reduction = mean} : tensor<8x64xf32>, tensor<8xi64> -> tensor<f32>
  func.return %c : tensor<f32>
}

// -----

// A partial sum is reduce-scattered straight into the split its (non-linear) users
// want, rather than all-reduced and then sliced.
// CHECK-LABEL: func.func @partial_into_split_users
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul
// CHECK-NEXT:    %[[R:.*]] = graph.reduce_scatter %[[Y]] {axes = [tp], dim = 0, kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>}
// CHECK-NEXT:    %[[G:.*]] = graph.gelu %[[R]]
// CHECK-NEXT:    %[[T:.*]] = graph.tanh %[[G]]
// CHECK-NEXT:    func.return %[[T]]
graph.mesh @mesh axes = [tp = 4]
func.func @partial_into_split_users(%a: tensor<64x256xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                                    %b: tensor<256x128xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<64x128xf32> {
  %y = graph.matmul %a, %b : tensor<64x256xf32>, tensor<256x128xf32> -> tensor<64x128xf32>
  %g = graph.gelu %y {approximate = none} : tensor<64x128xf32>
  %t = graph.tanh %g : tensor<64x128xf32>
  %s = graph.shard %t {sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<64x128xf32>
  func.return %s : tensor<64x128xf32>
}

// -----

// Sums partial over the same axes in another order add up before one all-reduce (a
// global gradient norm: each gradient's squared sum, split dp x tp or tp x dp).
// CHECK-LABEL: func.func @partial_axes_in_either_order
// CHECK:         graph.add {{.*}} partial = sum[dp, tp]>}
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %{{.*}} {axes = [dp, tp], kind = sum}
// CHECK-NOT:     graph.all_reduce
// CHECK:         func.return %[[R]]
graph.mesh @mesh axes = [dp = 2, tp = 2] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @partial_axes_in_either_order(%a: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                                        %b: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[tp, dp]]>}) -> tensor<f32> {
  %sa = graph.sum %a {axes = [0, 1], keepdims = false} : tensor<4x8xf32> -> tensor<f32>
  %sb = graph.sum %b {axes = [0], keepdims = false} : tensor<8xf32> -> tensor<f32>
  %s = graph.add %sa, %sb : tensor<f32>
  func.return %s : tensor<f32>
}

// -----

// A constraint tagged graph.remat (a ZeRO-3 backward's copy of a parameter's gather)
// gathers the argument again instead of reusing the forward's gather.
// CHECK-LABEL: func.func @gathered_again
// CHECK:         %[[F:.*]] = graph.all_gather %w {axes = [dp], dim = 0}
// CHECK:         graph.matmul %x, %[[F]]
// CHECK:         %[[B:.*]] = graph.all_gather %w {axes = [dp], dim = 0} attributes {{{.*}}graph.remat = -1 : i64{{.*}}}
// CHECK:         graph.matmul %{{.*}}, %[[B]]
graph.mesh @mesh axes = [dp = 2]
func.func @gathered_again(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %g = graph.shard %w {sharding = #graph.sharding<@mesh, [[], []]>} : tensor<8x8xf32>
  %y = graph.matmul %x, %g : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %t = graph.tanh %y : tensor<4x8xf32>
  %b = graph.shard %w {sharding = #graph.sharding<@mesh, [[], []]>} attributes {graph.remat = -1 : i64} : tensor<8x8xf32>
  %z = graph.matmul %t, %b : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  func.return %y, %z : tensor<4x8xf32>, tensor<4x8xf32>
}
