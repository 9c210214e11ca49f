// RUN: tessera-opt %s | filecheck %s --enable-var-scope
// RUN: tessera-opt %s | tessera-opt | filecheck %s --enable-var-scope
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s --enable-var-scope

// attention's masks: with `segments = true` the query and key segment ids (i32,
// [batch, Tq] and [batch, Tk]; batch: q's dims before the heads) follow q, k, v, before
// the position offsets; `window` (a sliding window by position) and `softcap` (scores
// c * tanh(s / c)) are properties. The backward takes the same operands and properties.
// CHECK-LABEL: func.func @attention_masks
// CHECK-SAME: (%[[Q:.*]]: tensor<2x4x16x8xf32>, %[[K:.*]]: tensor<2x2x16x8xf32>, %[[QS:.*]]: tensor<2x16xi32>, %[[KS:.*]]: tensor<2x16xi32>, %[[P:.*]]: tensor<i32>, %[[DO:.*]]: tensor<2x4x16x8xf32>, %[[L:.*]]: tensor<2x4x16xf32>) {
// CHECK-NEXT: %{{.*}}, %{{.*}} = graph.attention %[[Q]], %[[K]], %[[K]], %[[QS]], %[[KS]], %[[P]], %[[P]] {causal = true, scale = 0.35, window = 4, softcap = 30.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x16xi32>, tensor<2x16xi32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>){{$}}
// CHECK-NEXT: %{{.*}}, %{{.*}} = graph.attention %[[Q]], %[[K]], %[[K]], %[[QS]], %[[KS]] {causal = false, scale = 1.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x16xi32>, tensor<2x16xi32> -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>){{$}}
// CHECK-NEXT: %{{.*}}, %{{.*}}, %{{.*}} = graph.attention_backward %[[Q]], %[[K]], %[[K]], %[[DO]], %[[L]], %[[L]], %[[QS]], %[[KS]], %[[P]], %[[P]] {causal = true, scale = 0.35, window = 4, softcap = 30.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x16xi32>, tensor<2x16xi32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>){{$}}
// CHECK-NEXT: func.return
func.func @attention_masks(%q: tensor<2x4x16x8xf32>, %k: tensor<2x2x16x8xf32>, %qs: tensor<2x16xi32>, %ks: tensor<2x16xi32>, %p: tensor<i32>, %do: tensor<2x4x16x8xf32>, %lse: tensor<2x4x16xf32>) {
  %o, %l = graph.attention %q, %k, %k, %qs, %ks, %p, %p {causal = true, scale = 0.35, window = 4, softcap = 30.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x16xi32>, tensor<2x16xi32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>)
  %o1, %l1 = graph.attention %q, %k, %k, %qs, %ks {causal = false, scale = 1.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x16xi32>, tensor<2x16xi32> -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>)
  %dq, %dk, %dv = graph.attention_backward %q, %k, %k, %do, %lse, %lse, %qs, %ks, %p, %p {causal = true, scale = 0.35, window = 4, softcap = 30.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x16xi32>, tensor<2x16xi32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>)
  func.return
}
