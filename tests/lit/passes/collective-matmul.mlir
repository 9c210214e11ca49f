// RUN: tessera-opt %s --split-input-file -p 'collective-matmul{chunks=2}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'collective-matmul{chunks=2}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p collective-matmul | filecheck %s --check-prefix=COST

// The first two RUN lines force two chunks (the second re-parses and re-verifies the
// result); the third lets the cost model (dgx_h100) choose: it decomposes the large
// gather and leaves the small one alone. Row order of a chunked gather: chunk j gathers
// rows j*c..(j+1)*c of every rank, so its result is n blocks of c rows; reshaped to
// (n, c) and concatenated on the c axis, the blocks line up as rank-major n*m rows.

// all_gather -> matmul: x's 4 rows are cut into 2 chunks of 2, each gathered (8 rows,
// 4 ranks x 2) and multiplied; the result keeps the matmul's sharding.
// CHECK-LABEL: func.func @gather_matmul
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<4x16xf32> {{.*}}, %[[W:[^:]*]]: tensor<16x8xf32> {{.*}})
// CHECK-NEXT:    %[[X0:.*]] = graph.slice %[[X]] {starts = [0, 0], limits = [2, 16], strides = [1, 1]} : tensor<4x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[X1:.*]] = graph.slice %[[X]] {starts = [2, 0], limits = [4, 16], strides = [1, 1]} : tensor<4x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[G0:.*]] = graph.all_gather %[[X0]] {axes = [tp], dim = 0} : tensor<2x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[G0]], %[[W]] : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[B0:.*]] = graph.reshape %[[Y0]] : tensor<8x8xf32> -> tensor<4x2x8xf32>
// CHECK-NEXT:    %[[G1:.*]] = graph.all_gather %[[X1]] {axes = [tp], dim = 0} : tensor<2x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[G1]], %[[W]] : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[B1:.*]] = graph.reshape %[[Y1]] : tensor<8x8xf32> -> tensor<4x2x8xf32>
// CHECK-NEXT:    %[[J:.*]] = graph.concat %[[B0]], %[[B1]] {axis = 1} : tensor<4x2x8xf32>, tensor<4x2x8xf32> -> tensor<4x4x8xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.reshape %[[J]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], [tp]]>} : tensor<4x4x8xf32> -> tensor<16x8xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<16x8xf32>
// COST-LABEL: func.func @gather_matmul
// COST-NEXT:    graph.all_gather
// COST-NEXT:    graph.matmul
// COST-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @gather_matmul(%x: tensor<4x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}, %w: tensor<16x8xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}) -> tensor<16x8xf32> attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<4x16xf32> -> tensor<16x16xf32>
  %y = graph.matmul %g, %w attributes {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>} : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  func.return %y : tensor<16x8xf32>
}

// -----

// matmul -> reduce_scatter: a's 16 rows are 4 rank blocks of 4; chunk j takes rows
// 2j..2j+2 of every block (8 rows), its product is reduce-scattered to 2 rows, and the
// two pieces of this rank's 4 rows are concatenated.
// CHECK-LABEL: func.func @matmul_reduce_scatter
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<16x8xf32>, %[[W:[^:]*]]: tensor<8x12xf32>)
// CHECK-NEXT:    %[[V:.*]] = graph.reshape %[[A]] : tensor<16x8xf32> -> tensor<4x4x8xf32>
// CHECK-NEXT:    %[[S0:.*]] = graph.slice %[[V]] {starts = [0, 0, 0], limits = [4, 2, 8], strides = [1, 1, 1]} : tensor<4x4x8xf32> -> tensor<4x2x8xf32>
// CHECK-NEXT:    %[[A0:.*]] = graph.reshape %[[S0]] : tensor<4x2x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[S1:.*]] = graph.slice %[[V]] {starts = [0, 2, 0], limits = [4, 4, 8], strides = [1, 1, 1]} : tensor<4x4x8xf32> -> tensor<4x2x8xf32>
// CHECK-NEXT:    %[[A1:.*]] = graph.reshape %[[S1]] : tensor<4x2x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[A0]], %[[W]] : tensor<8x8xf32>, tensor<8x12xf32> -> tensor<8x12xf32>
// CHECK-NEXT:    %[[R0:.*]] = graph.reduce_scatter %[[Y0]] {axes = [tp], dim = 0, kind = sum} : tensor<8x12xf32> -> tensor<2x12xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[A1]], %[[W]] : tensor<8x8xf32>, tensor<8x12xf32> -> tensor<8x12xf32>
// CHECK-NEXT:    %[[R1:.*]] = graph.reduce_scatter %[[Y1]] {axes = [tp], dim = 0, kind = sum} : tensor<8x12xf32> -> tensor<2x12xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.concat %[[R0]], %[[R1]] {axis = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}tp], []]>} : tensor<2x12xf32>, tensor<2x12xf32> -> tensor<4x12xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<4x12xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @matmul_reduce_scatter(%a: tensor<16x8xf32>, %w: tensor<8x12xf32>) -> tensor<4x12xf32> attributes {graph.partitioned} {
  %y = graph.matmul %a, %w : tensor<16x8xf32>, tensor<8x12xf32> -> tensor<16x12xf32>
  %r = graph.reduce_scatter %y {axes = [tp], dim = 0, kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, [[tp], []]>} : tensor<16x12xf32> -> tensor<4x12xf32>
  func.return %r : tensor<4x12xf32>
}

// -----

// matmul -> all_reduce: a is cut on its rows, each product all-reduced (over both mesh
// axes here) and the pieces concatenated.
// CHECK-LABEL: func.func @matmul_all_reduce
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<6x8xf32>, %[[W:[^:]*]]: tensor<8x12xf32>)
// CHECK-NEXT:    %[[A0:.*]] = graph.slice %[[A]] {starts = [0, 0], limits = [3, 8], strides = [1, 1]} : tensor<6x8xf32> -> tensor<3x8xf32>
// CHECK-NEXT:    %[[A1:.*]] = graph.slice %[[A]] {starts = [3, 0], limits = [6, 8], strides = [1, 1]} : tensor<6x8xf32> -> tensor<3x8xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[A0]], %[[W]] : tensor<3x8xf32>, tensor<8x12xf32> -> tensor<3x12xf32>
// CHECK-NEXT:    %[[R0:.*]] = graph.all_reduce %[[Y0]] {axes = [dp, tp], kind = sum} : tensor<3x12xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[A1]], %[[W]] : tensor<3x8xf32>, tensor<8x12xf32> -> tensor<3x12xf32>
// CHECK-NEXT:    %[[R1:.*]] = graph.all_reduce %[[Y1]] {axes = [dp, tp], kind = sum} : tensor<3x12xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.concat %[[R0]], %[[R1]] {axis = 0} : tensor<3x12xf32>, tensor<3x12xf32> -> tensor<6x12xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<6x12xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @matmul_all_reduce(%a: tensor<6x8xf32>, %w: tensor<8x12xf32>) -> tensor<6x12xf32> attributes {graph.partitioned} {
  %y = graph.matmul %a, %w : tensor<6x8xf32>, tensor<8x12xf32> -> tensor<6x12xf32>
  %r = graph.all_reduce %y {axes = [dp, tp], kind = sum} : tensor<6x12xf32>
  func.return %r : tensor<6x12xf32>
}

// -----

// A 3-D lhs [B, T, C] gathered on the sequence dim T: chunks of T, each product reshaped
// to [B, n, c, N], concatenated on the c axis (3) and reshaped back to [B, n*m, N].
// CHECK-LABEL: func.func @gather_sequence
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<2x4x16xf32>, %[[W:[^:]*]]: tensor<16x8xf32>)
// CHECK-NEXT:    %[[X0:.*]] = graph.slice %[[X]] {starts = [0, 0, 0], limits = [2, 2, 16], strides = [1, 1, 1]} : tensor<2x4x16xf32> -> tensor<2x2x16xf32>
// CHECK-NEXT:    %[[X1:.*]] = graph.slice %[[X]] {starts = [0, 2, 0], limits = [2, 4, 16], strides = [1, 1, 1]} : tensor<2x4x16xf32> -> tensor<2x2x16xf32>
// CHECK-NEXT:    %[[G0:.*]] = graph.all_gather %[[X0]] {axes = [tp], dim = 1} : tensor<2x2x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[G0]], %[[W]] : tensor<2x8x16xf32>, tensor<16x8xf32> -> tensor<2x8x8xf32>
// CHECK-NEXT:    %[[B0:.*]] = graph.reshape %[[Y0]] : tensor<2x8x8xf32> -> tensor<2x4x2x8xf32>
// CHECK-NEXT:    %[[G1:.*]] = graph.all_gather %[[X1]] {axes = [tp], dim = 1} : tensor<2x2x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[G1]], %[[W]] : tensor<2x8x16xf32>, tensor<16x8xf32> -> tensor<2x8x8xf32>
// CHECK-NEXT:    %[[B1:.*]] = graph.reshape %[[Y1]] : tensor<2x8x8xf32> -> tensor<2x4x2x8xf32>
// CHECK-NEXT:    %[[J:.*]] = graph.concat %[[B0]], %[[B1]] {axis = 2} : tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32> -> tensor<2x4x4x8xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.reshape %[[J]] : tensor<2x4x4x8xf32> -> tensor<2x16x8xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<2x16x8xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @gather_sequence(%x: tensor<2x4x16xf32>, %w: tensor<16x8xf32>) -> tensor<2x16x8xf32> attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 1} : tensor<2x4x16xf32> -> tensor<2x16x16xf32>
  %y = graph.matmul %g, %w : tensor<2x16x16xf32>, tensor<16x8xf32> -> tensor<2x16x8xf32>
  func.return %y : tensor<2x16x8xf32>
}

// -----

// Left alone: a gather on the contracting dim (the matmul needs every column at once).
// CHECK-LABEL: func.func @gather_contracting_dim
// CHECK-NEXT:    graph.all_gather %{{.*}} {axes = [tp], dim = 1}
// CHECK-NEXT:    graph.matmul
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @gather_contracting_dim(%x: tensor<8x4xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 1} : tensor<8x4xf32> -> tensor<8x16xf32>
  %y = graph.matmul %g, %w : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
  func.return %y : tensor<8x8xf32>
}

// -----

// Left alone: the gathered value has a second user.
// CHECK-LABEL: func.func @gather_two_users
// CHECK-NEXT:    graph.all_gather
// CHECK-NEXT:    graph.matmul
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @gather_two_users(%x: tensor<4x16xf32>, %w: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x16xf32>) attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<4x16xf32> -> tensor<16x16xf32>
  %y = graph.matmul %g, %w : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  func.return %y, %g : tensor<16x8xf32>, tensor<16x16xf32>
}

// -----

// Left alone: 3 rows per rank do not split into 2 chunks, nor 12 result rows into
// 4 ranks x 2 chunks.
// CHECK-LABEL: func.func @not_divisible
// CHECK-NEXT:    graph.all_gather
// CHECK-NEXT:    graph.matmul
// CHECK-NEXT:    graph.matmul
// CHECK-NEXT:    graph.reduce_scatter
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @not_divisible(%x: tensor<3x16xf32>, %w: tensor<16x8xf32>, %a: tensor<12x8xf32>, %v: tensor<8x8xf32>) -> (tensor<12x8xf32>, tensor<3x8xf32>) attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<3x16xf32> -> tensor<12x16xf32>
  %y = graph.matmul %g, %w : tensor<12x16xf32>, tensor<16x8xf32> -> tensor<12x8xf32>
  %z = graph.matmul %a, %v : tensor<12x8xf32>, tensor<8x8xf32> -> tensor<12x8xf32>
  %r = graph.reduce_scatter %z {axes = [tp], dim = 0, kind = sum} : tensor<12x8xf32> -> tensor<3x8xf32>
  func.return %y, %r : tensor<12x8xf32>, tensor<3x8xf32>
}

// -----

// Left alone: a function in the global view (no graph.partitioned).
// CHECK-LABEL: func.func @global_view
// CHECK-NEXT:    graph.all_gather
// CHECK-NEXT:    graph.matmul
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @global_view(%x: tensor<16x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<16x16xf32>
  %y = graph.matmul %g, %w : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  func.return %y : tensor<16x8xf32>
}

// -----

// Large enough for the cost model: gathering 64 MiB of bf16 over 8 NVLink ranks costs
// about as much as the matmul, so overlapping chunks wins.
// CHECK-LABEL: func.func @large_gather
// CHECK-COUNT-2: graph.all_gather
// COST-LABEL: func.func @large_gather
// COST-NEXT:    graph.slice %x
// COST:         graph.all_gather
// COST:         graph.matmul
// COST:         graph.all_gather
// COST:         graph.matmul
// COST:         graph.concat
// COST:         func.return
graph.mesh @mesh axes = [tp = 8]
func.func @large_gather(%x: tensor<512x8192xbf16>, %w: tensor<8192x1024xbf16>) -> tensor<4096x1024xbf16> attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<512x8192xbf16> -> tensor<4096x8192xbf16>
  %y = graph.matmul %g, %w : tensor<4096x8192xbf16>, tensor<8192x1024xbf16> -> tensor<4096x1024xbf16>
  func.return %y : tensor<4096x1024xbf16>
}
