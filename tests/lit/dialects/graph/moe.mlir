// RUN: tessera-opt %s --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file --print-op-generic | tessera-opt --split-input-file | filecheck %s

// A mixture-of-experts layer's ops (top-2 of 4 experts, capacity 3, groups of 6 tokens)
// verify and round-trip in the custom and the generic form.
// CHECK-LABEL: func.func @moe_layer
// CHECK:         %[[V:.*]], %[[I:.*]] = graph.top_k %{{.*}} {k = 2} : tensor<2x6x4xf32> -> (tensor<2x6x2xf32>, tensor<2x6x2xi32>)
// CHECK:         %[[S:.*]], %[[SRC:.*]] = graph.moe_route %[[I]] {experts = 4, capacity = 3} : tensor<2x6x2xi32> -> (tensor<2x6x2xi32>, tensor<2x4x3xi32>)
// CHECK:         %[[D:.*]] = graph.moe_dispatch %{{.*}}, %[[S]], %[[SRC]] : tensor<2x6x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x4x3x8xf32>
// CHECK:         graph.moe_combine %[[D]], %[[S]], %[[SRC]] : tensor<2x4x3x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x6x2x8xf32>
func.func @moe_layer(%x: tensor<2x6x8xf32>, %scores: tensor<2x6x4xf32>) -> tensor<2x6x2x8xf32> {
  %v, %i = graph.top_k %scores {k = 2} : tensor<2x6x4xf32> -> (tensor<2x6x2xf32>, tensor<2x6x2xi32>)
  %slots, %sources = graph.moe_route %i {experts = 4, capacity = 3} : tensor<2x6x2xi32> -> (tensor<2x6x2xi32>, tensor<2x4x3xi32>)
  %d = graph.moe_dispatch %x, %slots, %sources : tensor<2x6x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x4x3x8xf32>
  %c = graph.moe_combine %d, %slots, %sources : tensor<2x4x3x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x6x2x8xf32>
  func.return %c : tensor<2x6x2x8xf32>
}

// -----

// Dispatch of one row per choice (a combine's cotangent): [G, T, K, H] -> [G, E, C, H].
// CHECK-LABEL: func.func @dispatch_per_choice
// CHECK:         graph.moe_dispatch %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x6x2x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x4x3x8xf32>
func.func @dispatch_per_choice(%r: tensor<2x6x2x8xf32>, %slots: tensor<2x6x2xi32>, %sources: tensor<2x4x3xi32>) -> tensor<2x4x3x8xf32> {
  %d = graph.moe_dispatch %r, %slots, %sources : tensor<2x6x2x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x4x3x8xf32>
  func.return %d : tensor<2x4x3x8xf32>
}
