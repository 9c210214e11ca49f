// RUN: tessera-opt %s --split-input-file -p hoist-all-gathers | filecheck %s
// RUN: tessera-opt %s --split-input-file -p hoist-all-gathers | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'hoist-all-gathers,bucket-gradients{bucket_bytes=65536}' | filecheck %s --check-prefix=BUCKET

// A weight gradient's transposed activation, gathered along its columns: gathering it
// along its rows and transposing after moves the same bytes, and would start the gather
// where x is made (overlap-comm starts a gather at its operand), keeping the gathered x
// alive longer. It stays, and the two gathers are not bucketed (x's blocks are columns).
// CHECK-LABEL: func.func @transposed
// CHECK-NEXT:    %[[T:.*]] = graph.transpose
// CHECK-NEXT:    graph.all_gather %[[T]] {axes = [dp], dim = 1}
// CHECK-NEXT:    graph.all_gather
// CHECK-NEXT:    graph.matmul
// BUCKET-LABEL: func.func @transposed
// BUCKET-COUNT-2: graph.all_gather
// BUCKET-NOT:     graph.concat
graph.mesh @mesh axes = [dp = 2]
func.func @transposed(%x: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}, %g: tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) -> tensor<8x16xf32> attributes {graph.partitioned} {
  %t = graph.transpose %x {perm = [1, 0]} attributes {graph.sharding = #graph.sharding<@mesh, [[], [dp]]>} : tensor<4x8xf32> -> tensor<8x4xf32>
  %tg = graph.all_gather %t {axes = [dp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<8x4xf32> -> tensor<8x8xf32>
  %gg = graph.all_gather %g {axes = [dp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<4x16xf32> -> tensor<8x16xf32>
  %m = graph.matmul %tg, %gg attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<8x8xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  func.return %m : tensor<8x16xf32>
}

// -----

// A one-hot matrix cast(iota == ids) split over dp along the tokens: the [16, 4] floats
// are not gathered, the 4 integer ids are, and the compare and cast run on the gathered
// ids (the iota, a [16, 1] column the same on every dp rank, is read as it is).
// CHECK-LABEL: func.func @one_hot
// BUCKET-LABEL: func.func @one_hot
// CHECK-SAME:    (%[[IDS:[^:]*]]: tensor<1x4xi32>
// CHECK-NEXT:    %[[IOTA:.*]] = graph.iota {dimension = 0} {{.*}} : tensor<16x1xi32>
// CHECK-NEXT:    %[[IG:.*]] = graph.all_gather %[[IDS]] {axes = [dp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} : tensor<1x4xi32> -> tensor<1x8xi32>
// CHECK-NEXT:    %[[EQ:.*]] = graph.compare %[[IOTA]], %[[IG]] {predicate = eq} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} : tensor<16x1xi32>, tensor<1x8xi32> -> tensor<16x8xi1>
// CHECK-NEXT:    %[[F:.*]] = graph.cast %[[EQ]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} : tensor<16x8xi1> -> tensor<16x8xf32>
// CHECK-NEXT:    func.return %[[F]]
graph.mesh @mesh axes = [dp = 2]
func.func @one_hot(%ids: tensor<1x4xi32> {graph.sharding = #graph.sharding<@mesh, [[], [dp]]>}) -> tensor<16x8xf32> attributes {graph.partitioned} {
  %iota = graph.iota {dimension = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<16x1xi32>
  %eq = graph.compare %iota, %ids {predicate = eq} attributes {graph.sharding = #graph.sharding<@mesh, [[], [dp]]>} : tensor<16x1xi32>, tensor<1x4xi32> -> tensor<16x4xi1>
  %f = graph.cast %eq attributes {graph.sharding = #graph.sharding<@mesh, [[], [dp]]>} : tensor<16x4xi1> -> tensor<16x4xf32>
  %g = graph.all_gather %f {axes = [dp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<16x4xf32> -> tensor<16x8xf32>
  func.return %g : tensor<16x8xf32>
}

// -----

// Left alone: an elementwise op of two values split alike costs the same bytes gathered
// either way; a transpose read by another op too (it would run twice); an operand with
// no layout annotation (a partial sum may have none); random bits (not a function of the
// elements they sit with).
// CHECK-LABEL: func.func @left_alone
// CHECK:         %[[S:.*]] = graph.add
// CHECK-NEXT:    graph.all_gather %[[S]]
// CHECK:         %[[T:.*]] = graph.transpose
// CHECK-NEXT:    graph.all_gather %[[T]]
// CHECK:         %[[P:.*]] = graph.mul
// CHECK-NEXT:    graph.all_gather %[[P]]
// CHECK:         %[[R:.*]] = graph.random_bits
// CHECK-NEXT:    graph.all_gather %[[R]]
graph.mesh @mesh axes = [dp = 2]
func.func @left_alone(%a: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}, %b: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}, %c: tensor<4x8xf32>, %k0: tensor<i32> {graph.sharding = #graph.sharding<@mesh, []>}, %k1: tensor<i32> {graph.sharding = #graph.sharding<@mesh, []>}, %counter: tensor<4x8xi32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) -> (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x8xf32>, tensor<8x8xi32>) attributes {graph.partitioned} {
  %s = graph.add %a, %b attributes {graph.sharding = #graph.sharding<@mesh, [[dp], []]>} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %sg = graph.all_gather %s {axes = [dp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<4x8xf32> -> tensor<8x8xf32>
  %t = graph.transpose %a {perm = [1, 0]} attributes {graph.sharding = #graph.sharding<@mesh, [[], [dp]]>} : tensor<4x8xf32> -> tensor<8x4xf32>
  %tg = graph.all_gather %t {axes = [dp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<8x4xf32> -> tensor<8x8xf32>
  %p = graph.mul %a, %c attributes {graph.sharding = #graph.sharding<@mesh, [[dp], []]>} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %pg = graph.all_gather %p {axes = [dp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<4x8xf32> -> tensor<8x8xf32>
  %r = graph.random_bits %k0, %k1, %counter {stream = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[dp], []]>} : tensor<i32>, tensor<i32>, tensor<4x8xi32> -> tensor<4x8xi32>
  %rg = graph.all_gather %r {axes = [dp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<4x8xi32> -> tensor<8x8xi32>
  func.return %sg, %tg, %t, %pg, %rg : tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x8xf32>, tensor<8x8xi32>
}

// -----

// A widening cast under a transpose: the bf16 values are gathered (half the bytes), and
// the cast and the transpose redone on them, where the old gather's reader is.
// CHECK-LABEL: func.func @widened
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<4x8xbf16>
// CHECK-NEXT:    %[[XG:.*]] = graph.all_gather %[[X]] {axes = [dp], dim = 0} {{.*}} : tensor<4x8xbf16> -> tensor<8x8xbf16>
// CHECK-NEXT:    %[[F:.*]] = graph.cast %[[XG]] {{.*}} : tensor<8x8xbf16> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[T:.*]] = graph.transpose %[[F]] {perm = [1, 0]}
// CHECK-NEXT:    func.return %[[T]]
graph.mesh @mesh axes = [dp = 2]
func.func @widened(%x: tensor<4x8xbf16> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}) -> tensor<8x8xf32> attributes {graph.partitioned} {
  %f = graph.cast %x attributes {graph.sharding = #graph.sharding<@mesh, [[dp], []]>} : tensor<4x8xbf16> -> tensor<4x8xf32>
  %t = graph.transpose %f {perm = [1, 0]} attributes {graph.sharding = #graph.sharding<@mesh, [[], [dp]]>} : tensor<4x8xf32> -> tensor<8x4xf32>
  %g = graph.all_gather %t {axes = [dp], dim = 1} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<8x4xf32> -> tensor<8x8xf32>
  func.return %g : tensor<8x8xf32>
}
