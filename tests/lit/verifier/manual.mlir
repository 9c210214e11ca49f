// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s
// RUN: not tessera-opt %s --split-input-file 2>&1 | filecheck %s --check-prefix=LOCATED

// What a manual function (a dist.shard_map body: graph.manual) claims is checked: an
// out_spec that leaves a mesh axis unsplit claims the result is the same on every rank
// along it, which the body must keep; a global caller's operands must have the body's
// argument types as per-rank blocks; every argument and result has a spec; and the
// body's collectives name axes of the mesh and permutations.

// The result varies over tp (it adds the rank's position), but out_specs claims it
// replicated over tp.
// LOCATED-NOT: Traceback
// LOCATED:     manual.mlir:[[# @LINE + 11]]:3: error: @body: out_specs[0] ({{\[\[}}]]) claims the result is replicated over 'tp'
// CHECK: @body: out_specs[0] ({{\[\[}}]]) claims the result is replicated over 'tp', but it varies over 'tp' (it depends on the rank's position there); reduce or gather it over 'tp' in the body (dist.all_reduce, dist.all_gather), or split a dim over 'tp' in out_specs{{$}}
graph.mesh @mesh axes = [tp = 2]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = graph.call @body(%x) : (tensor<8xf32>) -> (tensor<8xf32>)
  func.return %y : tensor<8xf32>
}
func.func private @body(%a: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) -> (tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) attributes {graph.partitioned, graph.manual} {
  %i = graph.axis_index {axes = [tp]} : tensor<i32>
  %c = graph.cast %i : tensor<i32> -> tensor<f32>
  %y = graph.add %a, %c : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
  func.return %y : tensor<8xf32>
}

// -----

// Gathered over tp the value is the same on both ranks: the claim holds. A permute
// makes it vary again.
// CHECK: @body: out_specs[0] ({{\[\[}}]]) claims the result is replicated over 'tp'{{.*}}
graph.mesh @mesh axes = [tp = 2]
func.func private @body(%a: tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> (tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) attributes {graph.partitioned, graph.manual} {
  %g = graph.all_gather %a {axes = [tp], dim = 0} : tensor<4xf32> -> tensor<8xf32>
  %p = graph.collective_permute %g {axes = [tp], pairs = [[0, 1], [1, 0]]} : tensor<8xf32>
  func.return %p : tensor<8xf32>
}

// -----

// The caller's operand, laid out as the in_spec, gives blocks of another type.
// CHECK: graph.call @body: operand #0 of type tensor<8xf32> laid out as {{\[\[}}tp]] gives per-rank blocks tensor<4xf32>, but the manual function's operand #0 is tensor<8xf32>{{$}}
graph.mesh @mesh axes = [tp = 2]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = graph.call @body(%x) : (tensor<8xf32>) -> (tensor<8xf32>)
  func.return %y : tensor<8xf32>
}
func.func private @body(%a: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> (tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) attributes {graph.partitioned, graph.manual} {
  %r = graph.all_reduce %a {axes = [tp], kind = sum} : tensor<8xf32>
  func.return %r : tensor<8xf32>
}

// -----

// CHECK: @body: manual function result #0 has no graph.sharding spec{{$}}
graph.mesh @mesh axes = [tp = 2]
func.func private @body(%a: tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> tensor<4xf32> attributes {graph.partitioned, graph.manual} {
  func.return %a : tensor<4xf32>
}

// -----

// A permutation whose target repeats.
// CHECK: graph.collective_permute: rank position 1 is the target of more than one pair{{$}}
graph.mesh @mesh axes = [tp = 2]
func.func private @body(%a: tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> (tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) attributes {graph.partitioned, graph.manual} {
  %p = graph.collective_permute %a {axes = [tp], pairs = [[0, 1], [1, 1]]} : tensor<4xf32>
  func.return %p : tensor<4xf32>
}

// -----

// An axis the mesh does not have.
// CHECK: graph.all_reduce: unknown mesh axes ['pp']; the mesh has ['tp']{{$}}
graph.mesh @mesh axes = [tp = 2]
func.func private @body(%a: tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> (tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) attributes {graph.partitioned, graph.manual} {
  %r = graph.all_reduce %a {axes = [pp], kind = sum} : tensor<4xf32>
  func.return %r : tensor<4xf32>
}
