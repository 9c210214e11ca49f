// RUN: tessera-opt %s -p shard-propagate,insert-collectives | filecheck %s

// Expert parallelism (GShard, Lepikhin et al. 2020, fig. 2): token groups split over
// (dp, ep), expert weights [E, ...] over ep. Dispatch keeps the groups' split; the expert
// matmul keeps dp on the groups and takes ep on the experts, so one all-to-all over ep
// moves ep from the groups to the experts after dispatch, and one moves it back before
// combine. Nothing is gathered.
// Sharding lists are written `{{\[\[}}dp], []]` because FileCheck reads `[[` as a variable.
// CHECK-LABEL: func.func @expert_parallel
// CHECK:         %[[D:.*]] = graph.moe_dispatch {{.*}}#graph.sharding<@mesh, {{\[\[}}dp, ep], [], [], []]>}
// CHECK-NEXT:    %[[A:.*]] = graph.all_to_all %[[D]] {axes = [ep], split_dim = 1, concat_dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [ep], [], []]>}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[A]], %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [ep], [], []]>}
// CHECK-NEXT:    %[[B:.*]] = graph.all_to_all %[[Y]] {axes = [ep], split_dim = 0, concat_dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp, ep], [], [], []]>}
// CHECK-NEXT:    graph.moe_combine %[[B]]
// CHECK-NOT:     graph.all_gather
graph.mesh @mesh axes = [dp = 2, ep = 2] topology = "{\"base\": \"dgx_h100\", \"levels\": [{\"latency_s\": 1e-15}], \"sharp\": {\"latency_s\": 1e-15}}"
func.func @expert_parallel(%x: tensor<4x6x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp, ep], [], []]>}, %choices: tensor<4x6x2xi32> {graph.sharding = #graph.sharding<@mesh, [[dp, ep], [], []]>}, %w: tensor<4x8x8xf32> {graph.sharding = #graph.sharding<@mesh, [[ep], [], []]>}) -> tensor<4x6x2x8xf32> {
  %slots, %sources = graph.moe_route %choices {experts = 4, capacity = 3} : tensor<4x6x2xi32> -> (tensor<4x6x2xi32>, tensor<4x4x3xi32>)
  %d = graph.moe_dispatch %x, %slots, %sources : tensor<4x6x8xf32>, tensor<4x6x2xi32>, tensor<4x4x3xi32> -> tensor<4x4x3x8xf32>
  %y = graph.matmul %d, %w : tensor<4x4x3x8xf32>, tensor<4x8x8xf32> -> tensor<4x4x3x8xf32>
  %c = graph.moe_combine %y, %slots, %sources : tensor<4x4x3x8xf32>, tensor<4x6x2xi32>, tensor<4x4x3xi32> -> tensor<4x6x2x8xf32>
  func.return %c : tensor<4x6x2x8xf32>
}

// The experts' weight gradient (a matmul's VJP) transposes the dispatched tokens as
// traced, before their all-to-all: the transpose is taken of the moved tokens instead
// (the forward's all-to-all reused), so the tokens are not sent over ep a second time.
// CHECK-LABEL: func.func @weight_gradient_reuses_dispatch_all_to_all
// CHECK:         %[[A:.*]] = graph.all_to_all %{{.*}} {axes = [ep], split_dim = 1, concat_dim = 0}
// CHECK-NEXT:    %[[Y:.*]] = graph.matmul %[[A]]
// CHECK-NEXT:    %[[T:.*]] = graph.transpose %[[A]] {perm = [0, 1, 3, 2]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp], [ep], [], []]>}
// CHECK-NEXT:    graph.matmul %[[T]], %[[Y]]
// CHECK-NOT:     graph.all_to_all
// CHECK:         graph.all_reduce %{{.*}} {axes = [dp], kind = sum}
func.func @weight_gradient_reuses_dispatch_all_to_all(%x: tensor<4x6x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp, ep], [], []]>}, %choices: tensor<4x6x2xi32> {graph.sharding = #graph.sharding<@mesh, [[dp, ep], [], []]>}, %w: tensor<4x8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[ep], [], []]>}) -> tensor<4x8x16xf32> {
  %slots, %sources = graph.moe_route %choices {experts = 4, capacity = 3} : tensor<4x6x2xi32> -> (tensor<4x6x2xi32>, tensor<4x4x3xi32>)
  %d = graph.moe_dispatch %x, %slots, %sources : tensor<4x6x8xf32>, tensor<4x6x2xi32>, tensor<4x4x3xi32> -> tensor<4x4x3x8xf32>
  %y = graph.matmul %d, %w : tensor<4x4x3x8xf32>, tensor<4x8x16xf32> -> tensor<4x4x3x16xf32>
  %t = graph.transpose %d {perm = [0, 1, 3, 2]} : tensor<4x4x3x8xf32> -> tensor<4x4x8x3xf32>
  %g = graph.matmul %t, %y : tensor<4x4x8x3xf32>, tensor<4x4x3x16xf32> -> tensor<4x4x8x16xf32>
  %s = graph.sum %g {axes = [0], keepdims = false} : tensor<4x4x8x16xf32> -> tensor<4x8x16xf32>
  %r = graph.shard %s {sharding = #graph.sharding<@mesh, [[ep], [], []]>} : tensor<4x8x16xf32>
  func.return %r : tensor<4x8x16xf32>
}
