// RUN: tessera-opt %s --split-input-file --verify-diagnostics

// A function's argument and result shardings are verified against their mesh: the mesh
// exists, the axes exist and appear once, and a global function's dims divide.

graph.mesh @mesh axes = [dp = 2, tp = 2]
// expected-error@-1 {{argument #0 of @f: unknown mesh axis 'zz'; the mesh has axes ['dp', 'tp']}}
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [zz]]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 2]
// expected-error@-1 {{argument #0 of @f: sharding names mesh @other, which is not defined; meshes: @mesh}}
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@other, [[dp], []]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 2]
// expected-error@-1 {{argument #0 of @f: mesh axis 'dp' is used more than once}}
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [dp]]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 2]
// expected-error@-1 {{result #0 of @f: dim 0 of size 5 is not divisible by mesh axes dp=2 (2 shards)}}
func.func @f(%x: tensor<5x4xf32>) -> (tensor<5x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) {
  func.return %x : tensor<5x4xf32>
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 2]
// expected-error@-1 {{argument #0 of @f: sharding has 1 dims but the tensor has rank 2 (shape [4, 4])}}
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}
