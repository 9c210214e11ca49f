// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s
// RUN: not tessera-opt %s --split-input-file 2>&1 | filecheck %s --check-prefix=LOCATED
// RUN: not tessera-opt %s --split-input-file -p shard-propagate 2>&1 | filecheck %s --check-prefix=LOCATED

// Every sharding names a graph.mesh of the module and fits it: the axes exist and
// appear once, the rank matches, and a global function's dims divide. This holds for
// function arguments and results, op results (as shard-propagate sets them) and
// graph.shard constraints. (Before, a sharding naming a missing mesh was accepted and
// shard-propagate silently renamed it to @mesh; without any graph.mesh nothing was
// checked.)

// A sharding constraint naming a missing mesh (shard-propagate renamed it to @mesh).
// LOCATED-NOT: Traceback
// LOCATED:     shardings.mlir:[[# @LINE + 4]]:3: error: graph.shard: sharding: sharding names mesh @other, which is not defined; meshes: @mesh
// CHECK: graph.shard: sharding: sharding names mesh @other, which is not defined; meshes: @mesh{{$}}
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.shard %x {sharding = #graph.sharding<@other, [[dp]]>} : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

// CHECK: argument #0 of @f: unknown mesh axis 'zz'; the mesh has axes ['dp', 'tp']{{$}}
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [zz]]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

// CHECK: argument #0 of @f: sharding names mesh @other, which is not defined; meshes: @mesh{{$}}
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@other, [[dp], []]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

// CHECK: argument #0 of @f: mesh axis 'dp' is used more than once{{$}}
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], [dp]]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

// CHECK: result #0 of @f: dim 0 of size 5 is not divisible by mesh axes dp=2 (2 shards){{$}}
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @f(%x: tensor<5x4xf32>) -> (tensor<5x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) {
  func.return %x : tensor<5x4xf32>
}

// -----

// CHECK: argument #0 of @f: sharding has 1 dims but the tensor has rank 2 (shape [4, 4]){{$}}
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

// A module with shardings and no mesh at all.
// CHECK: argument #0 of @f: sharding names mesh @mesh, which is not defined; the module has no graph.mesh{{$}}
func.func @f(%x: tensor<4x4xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) -> tensor<4x4xf32> {
  func.return %x : tensor<4x4xf32>
}

// -----

// Op results' shardings.
// CHECK: graph.neg: result #0: sharding names mesh @other, which is not defined; meshes: @mesh{{$}}
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.neg %x attributes {graph.sharding = #graph.sharding<@other, [[dp]]>} : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

// CHECK: graph.matmul: result #0: unknown mesh axis 'tp'; the mesh has axes ['dp']{{$}}
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %y = graph.matmul %x, %x attributes {graph.sharding = #graph.sharding<@mesh, [[dp], []], partial = sum[tp]>} : tensor<4x4xf32>
  func.return %y : tensor<4x4xf32>
}

// -----

// CHECK: graph.neg: result #0: dim 0 of size 3 is not divisible by mesh axes dp=2 (2 shards){{$}}
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = graph.neg %x attributes {graph.sharding = #graph.sharding<@mesh, [[dp]]>} : tensor<3xf32>
  func.return %y : tensor<3xf32>
}

// -----

// CHECK: graph.split: expected graph.sharding to give one sharding per result (2), found 1{{$}}
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<4xf32>) -> tensor<2xf32> {
  %a, %b = graph.split %x {axis = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[]]>} : tensor<4xf32> -> (tensor<2xf32>, tensor<2xf32>)
  func.return %a : tensor<2xf32>
}

// -----

// CHECK: graph.neg: result #0: expected a #graph.sharding<...> for graph.sharding, found 1 : i64{{$}}
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.neg %x attributes {graph.sharding = 1} : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

// A partitioned function has local shapes: its dims need not divide.
// CHECK: func.func @local(%x: tensor<3xf32> {graph.sharding = #graph.sharding<@mesh, {{\[\[}}dp]]>}) -> tensor<3xf32> attributes {graph.partitioned} {
graph.mesh @mesh axes = [dp = 2]
func.func @local(%x: tensor<3xf32> {graph.sharding = #graph.sharding<@mesh, [[dp]]>}) -> tensor<3xf32> attributes {graph.partitioned} {
  %y = graph.neg %x attributes {graph.sharding = #graph.sharding<@mesh, [[dp]]>} : tensor<3xf32>
  func.return %y : tensor<3xf32>
}
