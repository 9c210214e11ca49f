// RUN: tessera-opt %s --split-input-file -p unzigzag-attention | filecheck %s
// RUN: tessera-opt %s --split-input-file -p unzigzag-attention | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'shard-propagate,insert-collectives,shard-partition{context="all_gather"},unzigzag-attention' | filecheck %s --check-prefix=CP

// unzigzag-attention (issue 19): causal attention whose sequence is stored in zig-zag
// order (zigzag = 2: 4 chunks, stored chunks 0 1 2 3 hold true chunks 0 3 1 2) becomes
// natural-order attention. Unsharded, q, k, v are put in true order by slices and a
// concat (true chunk t lies at stored chunk 0, 2, 3, 1), one call computes, and o and
// lse go back (stored chunk s from true chunk 0, 3, 1, 2).

// CHECK-LABEL: func.func @whole
// CHECK-NOT:     zigzag
// CHECK:         %[[Q0:.*]] = graph.slice %q {starts = [0, 0, 0], limits = [1, 2, 4]
// CHECK-NEXT:    %[[Q1:.*]] = graph.slice %q {starts = [0, 4, 0], limits = [1, 6, 4]
// CHECK-NEXT:    %[[Q2:.*]] = graph.slice %q {starts = [0, 6, 0], limits = [1, 8, 4]
// CHECK-NEXT:    %[[Q3:.*]] = graph.slice %q {starts = [0, 2, 0], limits = [1, 4, 4]
// CHECK-NEXT:    %[[QN:.*]] = graph.concat %[[Q0]], %[[Q1]], %[[Q2]], %[[Q3]] {axis = 1}
// CHECK:         %[[O:.*]], %{{.*}} = graph.attention %[[QN]], %{{.*}}, %{{.*}} {causal = true, scale = 0.5} :
// CHECK-NEXT:    %[[O0:.*]] = graph.slice %[[O]] {starts = [0, 0, 0], limits = [1, 2, 4]
// CHECK-NEXT:    %[[O3:.*]] = graph.slice %[[O]] {starts = [0, 6, 0], limits = [1, 8, 4]
// CHECK-NEXT:    %[[O1:.*]] = graph.slice %[[O]] {starts = [0, 2, 0], limits = [1, 4, 4]
// CHECK-NEXT:    %[[O2:.*]] = graph.slice %[[O]] {starts = [0, 4, 0], limits = [1, 6, 4]
// CHECK-NEXT:    %[[OS:.*]] = graph.concat %[[O0]], %[[O3]], %[[O1]], %[[O2]] {axis = 1}
// CHECK:         func.return %[[OS]]
// CP-LABEL:    func.func @whole
func.func @whole(%q: tensor<1x8x4xf32>, %k: tensor<1x8x4xf32>, %v: tensor<1x8x4xf32>) -> tensor<1x8x4xf32> {
  %o, %lse = graph.attention %q, %k, %v {causal = true, scale = 0.5, zigzag = 2} : tensor<1x8x4xf32>, tensor<1x8x4xf32>, tensor<1x8x4xf32> -> (tensor<1x8x4xf32>, tensor<1x8xf32>)
  func.return %o : tensor<1x8x4xf32>
}

// -----

// Not causal: attention does not depend on the order; the attribute goes.

// CHECK-LABEL: func.func @full
// CHECK-NEXT:    graph.attention %q, %k, %v {causal = false, scale = 0.5} :
// CP-LABEL:    func.func @full
func.func @full(%q: tensor<1x8x4xf32>, %k: tensor<1x8x4xf32>, %v: tensor<1x8x4xf32>) -> tensor<1x8x4xf32> {
  %o, %lse = graph.attention %q, %k, %v {causal = false, scale = 0.5, zigzag = 2} : tensor<1x8x4xf32>, tensor<1x8x4xf32>, tensor<1x8x4xf32> -> (tensor<1x8x4xf32>, tensor<1x8xf32>)
  func.return %o : tensor<1x8x4xf32>
}

// -----

// Context parallelism by all-gather over cp = 2 of a sequence stored zig-zag over 2
// ranks: each rank's queries are two stored chunks, true chunks r and 3 - r (from
// graph.axis_index), one call each with its true start as the causal offset against the
// gathered keys put in true order; no permute moves anything.

// CP-LABEL:    func.func @split
// CP-NOT:        graph.collective_permute
// CP:            %[[K:.*]] = graph.all_gather %k
// CP:            %[[V:.*]] = graph.all_gather %v
// CP:            %[[KN:.*]] = graph.concat {{.*}} {axis = 1} {{.*}} : {{.*}} -> tensor<1x16x4xf32>
// CP:            %[[VN:.*]] = graph.concat {{.*}} {axis = 1} {{.*}} : {{.*}} -> tensor<1x16x4xf32>
// CP:            %[[R:.*]] = graph.axis_index {axes = [cp]}
// CP:            %[[BASE:.*]] = graph.mul %[[R]], %{{.*}}
// CP:            %[[C0:.*]] = graph.add %[[BASE]], %{{.*}}
// CP:            %[[S0:.*]] = graph.mul %[[C0]], %{{.*}}
// CP:            %[[Q0:.*]] = graph.slice %q {starts = [0, 0, 0], limits = [1, 4, 4]
// CP:            %[[O0:.*]], %{{.*}} = graph.attention %[[Q0]], %[[KN]], %[[VN]], %[[S0]], %{{.*}} {causal = true, scale = 0.5}
// CP:            %[[C1:.*]] = graph.sub %{{.*}}, %[[BASE]]
// CP:            %[[S1:.*]] = graph.mul %[[C1]], %{{.*}}
// CP:            %[[Q1:.*]] = graph.slice %q {starts = [0, 4, 0], limits = [1, 8, 4]
// CP:            %[[O1:.*]], %{{.*}} = graph.attention %[[Q1]], %[[KN]], %[[VN]], %[[S1]], %{{.*}} {causal = true, scale = 0.5}
// CP:            %[[O:.*]] = graph.concat %[[O0]], %[[O1]] {axis = 1}
// CP-NOT:        graph.collective_permute
// CP:            func.return %[[O]]
graph.mesh @mesh axes = [cp = 2]
func.func @split(%q: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                 %k: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>},
                 %v: tensor<1x16x4xf32> {graph.sharding = #graph.sharding<@mesh, [[], [cp], []]>}) -> tensor<1x16x4xf32> {
  %o, %lse = graph.attention %q, %k, %v {causal = true, scale = 0.5, zigzag = 2} : tensor<1x16x4xf32>, tensor<1x16x4xf32>, tensor<1x16x4xf32> -> (tensor<1x16x4xf32>, tensor<1x16xf32>)
  func.return %o : tensor<1x16x4xf32>
}
