// RUN: tessera-opt %s -p 'autodiff{function=loss}' | filecheck %s --check-prefix=AD

// The backward of a region is a manual function too: it recomputes the body and
// transposes it per rank. all_gather's transpose is the rank's slice (all_slice); the
// weight w is the same on every rank (in_spec replicated) while its cotangent varies
// over dp, so the cotangent is summed over dp (the transpose of w's implicit broadcast).
// AD-LABEL: func.func @loss_grad
// AD:         graph.call @body_bwd(%x, %w, %{{.*}}) : (tensor<8x16xf32>, tensor<16x16xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<16x16xf32>)
// AD:       func.func private @body_bwd({{.*}}) -> (tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [tp]]>}, tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>}) attributes {graph.partitioned, graph.manual}
// AD:         %[[W:.*]] = graph.all_reduce %{{.*}} {axes = [dp], kind = sum} : tensor<16x16xf32>
// AD:         %[[X:.*]] = graph.all_slice %{{.*}} {axes = [tp], dim = 1} : tensor<4x16xf32> -> tensor<4x8xf32>
// AD:         func.return %[[X]], %[[W]]
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @loss(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<f32> {
  %y = graph.call @body(%x, %w) : (tensor<8x16xf32>, tensor<16x16xf32>) -> (tensor<8x16xf32>)
  %l = graph.sum %y {axes = [0, 1], keepdims = false} : tensor<8x16xf32> -> tensor<f32>
  func.return %l : tensor<f32>
}
func.func private @body(%x: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [tp]]>},
                        %w: tensor<16x16xf32> {graph.sharding = #graph.sharding<@mesh, [[], []]>})
    -> (tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) attributes {graph.partitioned, graph.manual} {
  %g = graph.all_gather %x {axes = [tp], dim = 1} : tensor<4x8xf32> -> tensor<4x16xf32>
  %y = graph.matmul %g, %w : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  func.return %y : tensor<4x16xf32>
}
