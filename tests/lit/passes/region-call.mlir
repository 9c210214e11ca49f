// RUN: tessera-opt %s --split-input-file -p shard-propagate,insert-collectives | filecheck %s
// RUN: tessera-opt %s --split-input-file -p dce | filecheck %s --check-prefix=DCE

// A region called with two layouts of its weight is propagated once per layout: the
// first variant keeps the name, the second is @layer_1. The tp-split variant reduces
// its partial sum before returning; the call's results are never partial.
// CHECK-LABEL: func.func @two_layouts
// CHECK:         graph.call @layer(%x, %w) attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK:         graph.call @layer_1(%0, %v) attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK:       func.func private @layer({{.*}}%w: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>})
// CHECK:         graph.all_reduce %y {axes = [tp], kind = sum}
// CHECK:       func.func private @layer_1({{.*}}%w: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>})
// CHECK-NOT:     graph.all_reduce
// CHECK:         func.return
// DCE-LABEL:   func.func @two_layouts
// DCE:         func.func private @layer(
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @two_layouts(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>},
                       %w: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>},
                       %v: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>}) -> tensor<8x16xf32> {
  %0 = graph.call @layer(%x, %w) : (tensor<8x16xf32>, tensor<16x16xf32>) -> (tensor<8x16xf32>)
  %1 = graph.call @layer(%0, %v) : (tensor<8x16xf32>, tensor<16x16xf32>) -> (tensor<8x16xf32>)
  func.return %1 : tensor<8x16xf32>
}
func.func private @layer(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<8x16xf32> {
  %h = graph.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %t = graph.transpose %w {perm = [1, 0]} : tensor<16x16xf32> -> tensor<16x16xf32>
  %y = graph.matmul %h, %t : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  func.return %y : tensor<8x16xf32>
}

// -----

// dce erases a private function no call reaches (symbol-dce).
// DCE-LABEL: func.func @caller
// DCE:       func.func private @called
// DCE-NOT:   @uncalled
func.func @caller(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.call @called(%x) : (tensor<4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @called(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.exp %x : tensor<4xf32>
  func.return %0 : tensor<4xf32>
}
func.func private @uncalled(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
