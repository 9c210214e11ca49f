// RUN: tessera-opt %s -p shard-propagate,insert-collectives | filecheck %s

// Sequence parallelism (Korthikanti et al. 2022, fig. 5) on a grouped-query attention
// block: the residual stream x [B=2, T=32, C=128] is split over tp along the sequence,
// q/k/v by columns (8 query heads, 4 k/v heads of 16), the output projection by rows.
// The normed input is all-gathered along the sequence once, for q, k and v alike (a k/v
// weight [128, 64] moves as many bytes as that gather, but the gather is made for q
// anyway); attention runs on each rank's heads; the row-split projection's partial sum
// is reduce-scattered back along the sequence. No weight is gathered.
// CHECK-LABEL: func.func @sp_attention
// CHECK-SAME:    %[[X:[^:]*]]: tensor<2x32x128xf32>
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         %[[H:.*]] = graph.mul {{.*}}<@mesh, {{\[\[}}], [tp], []]>}
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[H]] {axes = [tp], dim = 1} {{.*}}<@mesh, {{\[\[}}], [], []]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         graph.matmul %[[G]], %p_wq {{.*}}<@mesh, {{\[\[}}], [], [tp]]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         graph.matmul %[[G]], %p_wk {{.*}}<@mesh, {{\[\[}}], [], [tp]]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         graph.matmul %[[G]], %p_wv {{.*}}<@mesh, {{\[\[}}], [], [tp]]>}
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         graph.attention {{.*}}<@mesh, {{\[\[}}], [tp], [], []]>
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         %[[O:.*]] = graph.matmul {{.*}}, %p_wo {{.*}}partial = sum[tp]>}
// CHECK-NEXT:    %[[S:.*]] = graph.reduce_scatter %[[O]] {axes = [tp], dim = 1, kind = sum} {{.*}}<@mesh, {{\[\[}}], [tp], []]>}
// CHECK-NEXT:    graph.add %[[X]], %[[S]]
// CHECK-NOT:     graph.{{all_reduce|reduce_scatter|all_gather|all_to_all}}
// CHECK:         func.return
graph.mesh @mesh axes = [tp = 4]
func.func @sp_attention(%x: tensor<2x32x128xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp], []]>},
                        %p_ln1: tensor<128xf32>,
                        %p_wq: tensor<128x128xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                        %p_wk: tensor<128x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                        %p_wv: tensor<128x64xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                        %p_wo: tensor<128x128xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> tensor<2x32x128xf32> {
  %0 = graph.layer_norm %x {axes = [2], eps = 1.0e-05} : tensor<2x32x128xf32>
  %1 = graph.mul %0, %p_ln1 : tensor<2x32x128xf32>, tensor<128xf32> -> tensor<2x32x128xf32>
  %2 = graph.matmul %1, %p_wq : tensor<2x32x128xf32>, tensor<128x128xf32> -> tensor<2x32x128xf32>
  %3 = graph.reshape %2 : tensor<2x32x128xf32> -> tensor<2x32x8x16xf32>
  %4 = graph.transpose %3 {perm = [0, 2, 1, 3]} : tensor<2x32x8x16xf32> -> tensor<2x8x32x16xf32>
  %5 = graph.matmul %1, %p_wk : tensor<2x32x128xf32>, tensor<128x64xf32> -> tensor<2x32x64xf32>
  %6 = graph.reshape %5 : tensor<2x32x64xf32> -> tensor<2x32x4x16xf32>
  %7 = graph.transpose %6 {perm = [0, 2, 1, 3]} : tensor<2x32x4x16xf32> -> tensor<2x4x32x16xf32>
  %8 = graph.matmul %1, %p_wv : tensor<2x32x128xf32>, tensor<128x64xf32> -> tensor<2x32x64xf32>
  %9 = graph.reshape %8 : tensor<2x32x64xf32> -> tensor<2x32x4x16xf32>
  %10 = graph.transpose %9 {perm = [0, 2, 1, 3]} : tensor<2x32x4x16xf32> -> tensor<2x4x32x16xf32>
  %11, %12 = graph.attention %4, %7, %10 {causal = true, scale = 0.25} : tensor<2x8x32x16xf32>, tensor<2x4x32x16xf32>, tensor<2x4x32x16xf32> -> (tensor<2x8x32x16xf32>, tensor<2x8x32xf32>)
  %13 = graph.transpose %11 {perm = [0, 2, 1, 3]} : tensor<2x8x32x16xf32> -> tensor<2x32x8x16xf32>
  %14 = graph.reshape %13 : tensor<2x32x8x16xf32> -> tensor<2x32x128xf32>
  %15 = graph.matmul %14, %p_wo : tensor<2x32x128xf32>, tensor<128x128xf32> -> tensor<2x32x128xf32>
  %16 = graph.add %x, %15 : tensor<2x32x128xf32>
  %17 = graph.shard %16 {sharding = #graph.sharding<@mesh, [[], [tp], []]>} : tensor<2x32x128xf32>
  func.return %17 : tensor<2x32x128xf32>
}
