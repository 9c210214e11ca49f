// RUN: tessera-opt %s --split-input-file -p 'choose-collective-algorithms{topology=dgx_h100x2}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'choose-collective-algorithms{topology=dgx_h100x2}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'choose-collective-algorithms{topology=dgx_h100x2 force=ring}' | filecheck %s --check-prefix=RING
// RUN: tessera-opt %s --split-input-file -p 'choose-collective-algorithms{topology=dgx_h100}' | filecheck %s --check-prefix=ONE-NODE
// By default the pass prices the graph.mesh's topology, else enough DGX H100 nodes (here 2).
// RUN: tessera-opt %s --split-input-file -p 'choose-collective-algorithms' | filecheck %s

// 16 MiB over both DGX nodes: reduce within each node, all-reduce across, gather back.
// CHECK-LABEL: func.func @across_nodes
// CHECK:         schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = hierarchical, domain = 8} :
// RING-LABEL:  func.func @across_nodes
// RING:          schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = ring} :
// On one 8-GPU node the 16-rank group cannot be priced: left unannotated.
// ONE-NODE-LABEL: func.func @across_nodes
// ONE-NODE:       schedule.start all_reduce %x {axes = [dp, tp], kind = sum} :
graph.mesh @mesh axes = [dp = 2, tp = 8]
func.func @across_nodes(%x: tensor<2048x2048xf32>) -> tensor<2048x2048xf32> {
  %h = schedule.start all_reduce %x {axes = [dp, tp], kind = sum} : tensor<2048x2048xf32> -> !schedule.handle<tensor<2048x2048xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<2048x2048xf32>> -> tensor<2048x2048xf32>
  func.return %r : tensor<2048x2048xf32>
}

// -----

// Within one node: NVLink SHARP for 4 MiB, the tree for 256 bytes, the ring above NVLS's
// 128 MiB limit.
// CHECK-LABEL: func.func @within_a_node
// CHECK:         schedule.start all_reduce %x {axes = [tp], kind = sum, algorithm = nvls} :
// CHECK:         schedule.start all_reduce %s {axes = [tp], kind = max, algorithm = tree} :
// CHECK:         schedule.start all_reduce %b {axes = [tp], kind = sum, algorithm = ring} :
// RING-LABEL:  func.func @within_a_node
// RING-COUNT-3:  algorithm = ring}
// The mesh's 16 ranks do not fit one 8-GPU node: no group of it is annotated.
// ONE-NODE-LABEL: func.func @within_a_node
// ONE-NODE-NOT:   algorithm
// ONE-NODE:       func.return
graph.mesh @mesh axes = [dp = 2, tp = 8]
func.func @within_a_node(%x: tensor<1024x1024xf32>, %s: tensor<8x8xf32>, %b: tensor<8192x8192xf32>) -> (tensor<1024x1024xf32>, tensor<8x8xf32>, tensor<8192x8192xf32>) {
  %h0 = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<1024x1024xf32> -> !schedule.handle<tensor<1024x1024xf32>>
  %h1 = schedule.start all_reduce %s {axes = [tp], kind = max} : tensor<8x8xf32> -> !schedule.handle<tensor<8x8xf32>>
  %h2 = schedule.start all_reduce %b {axes = [tp], kind = sum} : tensor<8192x8192xf32> -> !schedule.handle<tensor<8192x8192xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<1024x1024xf32>> -> tensor<1024x1024xf32>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<8x8xf32>> -> tensor<8x8xf32>
  %r2 = schedule.wait %h2 : !schedule.handle<tensor<8192x8192xf32>> -> tensor<8192x8192xf32>
  func.return %r0, %r1, %r2 : tensor<1024x1024xf32>, tensor<8x8xf32>, tensor<8192x8192xf32>
}

// -----

// all_gather, reduce_scatter and all_to_all across nodes are hierarchical too (the
// all_to_all: within each node, then one message per node pair); a broadcast and a
// one-rank group are left alone (and lose a stale annotation).
// CHECK-LABEL: func.func @gather_and_scatter
// CHECK:         schedule.start all_gather %x {axes = [dp, tp], dim = 0, algorithm = hierarchical, domain = 8} :
// CHECK:         schedule.start reduce_scatter %y {axes = [dp, tp], kind = mean, dim = 1, algorithm = hierarchical, domain = 8} :
// CHECK:         schedule.start broadcast %y {axes = [dp, tp], src = 3} :
// CHECK:         schedule.start all_to_all %y {axes = [dp, tp], split_dim = 0, concat_dim = 1, algorithm = hierarchical, domain = 8} :
// CHECK:         schedule.start all_reduce %y {axes = [one], kind = sum} :
// RING-LABEL:  func.func @gather_and_scatter
// RING:          schedule.start all_gather %x {axes = [dp, tp], dim = 0, algorithm = ring} :
// RING:          schedule.start reduce_scatter %y {axes = [dp, tp], kind = mean, dim = 1, algorithm = ring} :
graph.mesh @mesh axes = [dp = 2, tp = 8, one = 1]
func.func @gather_and_scatter(%x: tensor<64x256xf32>, %y: tensor<64x256xf32>) -> (tensor<1024x256xf32>, tensor<64x16xf32>, tensor<64x256xf32>, tensor<4x4096xf32>, tensor<64x256xf32>) {
  %h0 = schedule.start all_gather %x {axes = [dp, tp], dim = 0} : tensor<64x256xf32> -> !schedule.handle<tensor<1024x256xf32>>
  %h1 = schedule.start reduce_scatter %y {axes = [dp, tp], kind = mean, dim = 1} : tensor<64x256xf32> -> !schedule.handle<tensor<64x16xf32>>
  %h2 = schedule.start broadcast %y {axes = [dp, tp], src = 3} : tensor<64x256xf32> -> !schedule.handle<tensor<64x256xf32>>
  %h3 = schedule.start all_to_all %y {axes = [dp, tp], split_dim = 0, concat_dim = 1} : tensor<64x256xf32> -> !schedule.handle<tensor<4x4096xf32>>
  %h4 = schedule.start all_reduce %y {axes = [one], kind = sum, algorithm = tree} : tensor<64x256xf32> -> !schedule.handle<tensor<64x256xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<1024x256xf32>> -> tensor<1024x256xf32>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<64x16xf32>> -> tensor<64x16xf32>
  %r2 = schedule.wait %h2 : !schedule.handle<tensor<64x256xf32>> -> tensor<64x256xf32>
  %r3 = schedule.wait %h3 : !schedule.handle<tensor<4x4096xf32>> -> tensor<4x4096xf32>
  %r4 = schedule.wait %h4 : !schedule.handle<tensor<64x256xf32>> -> tensor<64x256xf32>
  func.return %r0, %r1, %r2, %r3, %r4 : tensor<1024x256xf32>, tensor<64x16xf32>, tensor<64x256xf32>, tensor<4x4096xf32>, tensor<64x256xf32>
}

// -----

// Mesh (tp = 8, dp = 2) over [dp, tp]: group members 0, 2, 4, ... alternate between the
// nodes, so domains of consecutive members are not the machine's nodes: not hierarchical
// (the fastest other algorithm, here the tree, is chosen).
// CHECK-LABEL: func.func @interleaved_nodes
// CHECK:         schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = tree} :
// Over [tp, dp] of the same mesh, the members are 0, 1, ..., 15 again.
// CHECK:         schedule.start all_reduce %x {axes = [tp, dp], kind = sum, algorithm = hierarchical, domain = 8} :
graph.mesh @mesh axes = [tp = 8, dp = 2]
func.func @interleaved_nodes(%x: tensor<2048x2048xf32>) -> (tensor<2048x2048xf32>, tensor<2048x2048xf32>) {
  %h0 = schedule.start all_reduce %x {axes = [dp, tp], kind = sum} : tensor<2048x2048xf32> -> !schedule.handle<tensor<2048x2048xf32>>
  %h1 = schedule.start all_reduce %x {axes = [tp, dp], kind = sum} : tensor<2048x2048xf32> -> !schedule.handle<tensor<2048x2048xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<2048x2048xf32>> -> tensor<2048x2048xf32>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<2048x2048xf32>> -> tensor<2048x2048xf32>
  func.return %r0, %r1 : tensor<2048x2048xf32>, tensor<2048x2048xf32>
}

// -----

// An 8-rank mesh fits one DGX node (its default topology, dgx_h100): its all-reduces get
// the one-node algorithms there too, never hierarchical.
// CHECK-LABEL: func.func @one_node_mesh
// CHECK:         schedule.start all_reduce %x {axes = [tp], kind = sum, algorithm = nvls} :
// CHECK:         schedule.start all_reduce %x {axes = [dp, tp], kind = min, algorithm = nvls} :
// ONE-NODE-LABEL: func.func @one_node_mesh
// ONE-NODE:       schedule.start all_reduce %x {axes = [tp], kind = sum, algorithm = nvls} :
// ONE-NODE:       schedule.start all_reduce %x {axes = [dp, tp], kind = min, algorithm = nvls} :
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @one_node_mesh(%x: tensor<1024x1024xf32>) -> (tensor<1024x1024xf32>, tensor<1024x1024xf32>) {
  %h0 = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<1024x1024xf32> -> !schedule.handle<tensor<1024x1024xf32>>
  %h1 = schedule.start all_reduce %x {axes = [dp, tp], kind = min} : tensor<1024x1024xf32> -> !schedule.handle<tensor<1024x1024xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<1024x1024xf32>> -> tensor<1024x1024xf32>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<1024x1024xf32>> -> tensor<1024x1024xf32>
  func.return %r0, %r1 : tensor<1024x1024xf32>, tensor<1024x1024xf32>
}
