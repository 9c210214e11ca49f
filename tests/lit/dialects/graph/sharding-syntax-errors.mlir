// RUN: tessera-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// A partial sharding needs a known reduction kind.
func.func @bad_partial_kind(%x: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]], partial = product[tp]>}) -> tensor<8xf32> {
  func.return %x : tensor<8xf32>
}
// CHECK: partial reduction kind must be one of ('sum', 'mean', 'max', 'min', 'prod'), found 'product'

// -----

// The mesh is a symbol reference.
func.func @mesh_not_a_symbol(%x: tensor<8xf32> {graph.sharding = #graph.sharding<"mesh", [[]]>}) -> tensor<8xf32> {
  func.return %x : tensor<8xf32>
}
// CHECK: expected a mesh symbol like @mesh, found "mesh"

// -----

// `partial =` needs at least one kind[axes] group.
func.func @empty_partial(%x: tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]], partial = >}) -> tensor<8xf32> {
  func.return %x : tensor<8xf32>
}
// CHECK: expected partial axes like sum[tp]
