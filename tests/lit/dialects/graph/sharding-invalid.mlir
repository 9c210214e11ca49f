// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

graph.mesh @mesh axes = [dp = 2, dp = 4]
// CHECK: graph.mesh: expected distinct axis names, found ['dp', 'dp']

// -----

// Found by the fuzzer: an axis named by a dotted word parsed, then failed in a pass
// with an error that named no line.
graph.mesh @mesh axes = [graph.matmul = 2]
// CHECK: graph.mesh: axis names are identifiers, found 'graph.matmul'

// -----

graph.mesh @mesh axes = [dp = 0]
// CHECK: graph.mesh: axis dp must have a positive size, found 0

// -----

func.func @bad_kind(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.all_reduce %x {axes = [tp], kind = product} : tensor<4xf32>
  func.return %a : tensor<4xf32>
}
// CHECK: graph.all_reduce: reduction kind must be one of ('sum', 'mean', 'max', 'min', 'prod'), found 'product'

// -----

func.func @repeated_axes(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.all_gather %x {axes = [tp, tp], dim = 0} : tensor<4xf32>
  func.return %a : tensor<4xf32>
}
// CHECK: graph.all_gather: mesh axes must be distinct, found ['tp', 'tp']

// -----

func.func @bad_dim(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.all_slice %x {axes = [tp], dim = 1} : tensor<4xf32>
  func.return %a : tensor<4xf32>
}
// CHECK: graph.all_slice: dim must be in [0, 1) for operand tensor<4xf32>, found [1]

// -----

func.func @same_dims(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %a = graph.all_to_all %x {axes = [tp], split_dim = 1, concat_dim = 1} : tensor<4x4xf32>
  func.return %a : tensor<4x4xf32>
}
// CHECK: graph.all_to_all: split_dim and concat_dim must be distinct, found [1, 1]

// -----

func.func @negative_src(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.broadcast %x {axes = [tp], src = -1} : tensor<4xf32>
  func.return %a : tensor<4xf32>
}
// CHECK: graph.broadcast: expected a non-negative source index, found -1

// -----

graph.mesh @mesh axes = [tp = 4]
func.func @wrong_local_size(%x: tensor<8xf32>) -> tensor<16xf32> attributes {graph.partitioned} {
  %a = graph.all_gather %x {axes = [tp], dim = 0} : tensor<8xf32> -> tensor<16xf32>
  func.return %a : tensor<16xf32>
}
// CHECK: graph.all_gather: result 0 type mismatch: expected tensor<32xf32>, found tensor<16xf32>

// -----

graph.mesh @mesh axes = [tp = 4]
func.func @indivisible_slice(%x: tensor<6xf32>) -> tensor<1xf32> attributes {graph.partitioned} {
  %a = graph.all_slice %x {axes = [tp], dim = 0} : tensor<6xf32> -> tensor<1xf32>
  func.return %a : tensor<1xf32>
}
// CHECK: graph.all_slice: dim 0 of tensor<6xf32> (size 6) is not divisible by the group of 4 ranks

// -----

graph.mesh @mesh axes = [tp = 4]
func.func @unknown_axis(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.all_reduce %x {axes = [dp], kind = sum} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.all_reduce: unknown mesh axes ['dp']; the mesh has ['tp']

// -----

func.func @no_mesh(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.all_reduce %x {axes = [tp], kind = sum} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.all_reduce: a partitioned function needs exactly one graph.mesh


// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_target_outside_group(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 4]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: target position 4 of pair [0, 4] is out of range (the group over ['tp'] has 4 ranks)

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_negative_source(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [dp, tp], pairs = [[-1, 1]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: source position -1 of pair [-1, 1] is out of range (the group over ['dp', 'tp'] has 8 ranks)

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_source_twice(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1], [0, 2]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: rank position 0 is the source of more than one pair

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_target_twice(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1], [2, 1]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: rank position 1 is the target of more than one pair

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_not_pairs(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1, 2]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: expected [source, target] pairs like {{\[\[}}0, 1], [1, 0]], found {{\[\[}}0, 1, 2]]

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_flat_list(%x: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [0, 1]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: expected [source, target] pairs like {{\[\[}}0, 1], [1, 0]], found [0, 1]

// -----

// A permute moves blocks between ranks: it has no meaning on a global value.
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_in_global_function(%x: tensor<8xf32>) -> tensor<8xf32> {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1]]} : tensor<8xf32>
  func.return %a : tensor<8xf32>
}
// CHECK: graph.collective_permute: moves blocks between ranks, so it belongs in a partitioned function (graph.partitioned); found in a global one

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @permute_type_changes(%x: tensor<8xf32>) -> tensor<4xf32> attributes {graph.partitioned} {
  %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1]]} : tensor<8xf32> -> tensor<4xf32>
  func.return %a : tensor<4xf32>
}
// CHECK: graph.collective_permute: result 0 type mismatch: expected tensor<8xf32>, found tensor<4xf32>

// -----

graph.mesh @mesh axes = [dp = 2] topology = "nvl73"
// CHECK: graph.mesh: bad topology: unknown topology 'nvl73': not a JSON file nor a preset; presets: single_gpu, dgx_h100, gb200_nvl72
