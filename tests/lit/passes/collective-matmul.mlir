// RUN: tessera-opt %s --split-input-file -p 'collective-matmul{chunks=2}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'collective-matmul{chunks=2}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p collective-matmul | filecheck %s --check-prefix=COST

// The first two RUN lines force two chunks (the second re-parses and re-verifies the
// result); the third lets simulation on dgx_h100 choose: it decomposes the large
// gather and leaves the small one alone. Row order of a chunked gather: chunk j gathers
// rows j*c..(j+1)*c of every rank, so its result is n blocks of c rows; reshaped to
// (n, c) and concatenated on the c axis, the blocks line up as rank-major n*m rows.
// Chunks are software-pipelined: an op's chunk j is issued one step after the chunk j
// of a collective it depends on (chunk 1's gather before chunk 0's matmul).

// all_gather -> matmul: x's 4 rows are cut into 2 chunks of 2, each gathered (8 rows,
// 4 ranks x 2) and multiplied; the result keeps the matmul's sharding.
// CHECK-LABEL: func.func @gather_matmul
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<4x16xf32> {{.*}}, %[[W:[^:]*]]: tensor<16x8xf32> {{.*}})
// CHECK-NEXT:    %[[X0:.*]] = graph.slice %[[X]] {starts = [0, 0], limits = [2, 16], strides = [1, 1]} : tensor<4x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[X1:.*]] = graph.slice %[[X]] {starts = [2, 0], limits = [4, 16], strides = [1, 1]} : tensor<4x16xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[G0:.*]] = graph.all_gather %[[X0]] {axes = [tp], dim = 0} : tensor<2x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    %[[G1:.*]] = graph.all_gather %[[X1]] {axes = [tp], dim = 0} : tensor<2x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[G0]], %[[W]] : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[G1]], %[[W]] : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[B0:.*]] = graph.reshape %[[Y0]] : tensor<8x8xf32> -> tensor<4x2x8xf32>
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
// CHECK-NEXT:    %[[G1:.*]] = graph.all_gather %[[X1]] {axes = [tp], dim = 1} : tensor<2x2x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[G0]], %[[W]] : tensor<2x8x16xf32>, tensor<16x8xf32> -> tensor<2x8x8xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[G1]], %[[W]] : tensor<2x8x16xf32>, tensor<16x8xf32> -> tensor<2x8x8xf32>
// CHECK-NEXT:    %[[B0:.*]] = graph.reshape %[[Y0]] : tensor<2x8x8xf32> -> tensor<2x4x2x8xf32>
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

// Large enough for the simulation: gathering 64 MiB of bf16 over 8 NVLink ranks costs
// about as much as the matmul, so overlapping chunks wins.
// CHECK-LABEL: func.func @large_gather
// CHECK-COUNT-2: graph.all_gather
// COST-LABEL: func.func @large_gather
// COST-NEXT:    graph.slice %x
// COST:         graph.all_gather
// COST:         graph.all_gather
// COST:         graph.matmul
// COST:         graph.matmul
// COST:         graph.concat
// COST:         func.return
graph.mesh @mesh axes = [tp = 8]
func.func @large_gather(%x: tensor<512x8192xbf16>, %w: tensor<8192x1024xbf16>) -> tensor<4096x1024xbf16> attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<512x8192xbf16> -> tensor<4096x8192xbf16>
  %y = graph.matmul %g, %w : tensor<4096x8192xbf16>, tensor<8192x1024xbf16> -> tensor<4096x1024xbf16>
  func.return %y : tensor<4096x1024xbf16>
}

// -----

// Propagation (a Megatron layer's tail): the chunks of the attention output's all_reduce
// flow through the residual add (x cut alike), the layer norm (not over the cut dim),
// the scale (broadcast, used whole), the MLP and its all_reduce and the second residual
// add; only the return needs the whole value. Pipelined: chunk 0's MLP is issued after
// chunk 1's projection, and the final add one step later again.
// CHECK-LABEL: func.func @attention_out_mlp
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<8x4xf32>, %[[WO:[^:]*]]: tensor<4x16xf32>, %[[X:[^:]*]]: tensor<8x16xf32>, %[[G:[^:]*]]: tensor<16xf32>, %[[W1:[^:]*]]: tensor<16x8xf32>, %[[W2:[^:]*]]: tensor<8x16xf32>)
// CHECK-NEXT:    %[[A0:.*]] = graph.slice %[[A]] {starts = [0, 0], limits = [4, 4], strides = [1, 1]}
// CHECK-NEXT:    %[[A1:.*]] = graph.slice %[[A]] {starts = [4, 0], limits = [8, 4], strides = [1, 1]}
// CHECK-NEXT:    %[[X0:.*]] = graph.slice %[[X]] {starts = [0, 0], limits = [4, 16], strides = [1, 1]}
// CHECK-NEXT:    %[[X1:.*]] = graph.slice %[[X]] {starts = [4, 0], limits = [8, 16], strides = [1, 1]}
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[A0]], %[[WO]] : tensor<4x4xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
// CHECK-NEXT:    %[[R0:.*]] = graph.all_reduce %[[Y0]] {axes = [tp], kind = sum} : tensor<4x16xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[A1]], %[[WO]]
// CHECK-NEXT:    %[[R1:.*]] = graph.all_reduce %[[Y1]] {axes = [tp], kind = sum} : tensor<4x16xf32>
// CHECK-NEXT:    %[[H0:.*]] = graph.add %[[X0]], %[[R0]] : tensor<4x16xf32>
// CHECK-NEXT:    %[[N0:.*]] = graph.layer_norm %[[H0]] {axes = [1], eps = 1.0e-05} : tensor<4x16xf32>
// CHECK-NEXT:    %[[S0:.*]] = graph.mul %[[N0]], %[[G]] : tensor<4x16xf32>, tensor<16xf32> -> tensor<4x16xf32>
// CHECK-NEXT:    %[[U0:.*]] = graph.matmul %[[S0]], %[[W1]] : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[V0:.*]] = graph.gelu %[[U0]] {approximate = none} : tensor<4x8xf32>
// CHECK-NEXT:    %[[Z0:.*]] = graph.matmul %[[V0]], %[[W2]] : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
// CHECK-NEXT:    %[[Q0:.*]] = graph.all_reduce %[[Z0]] {axes = [tp], kind = sum} : tensor<4x16xf32>
// CHECK-NEXT:    %[[H1:.*]] = graph.add %[[X1]], %[[R1]]
// CHECK-NEXT:    %[[N1:.*]] = graph.layer_norm %[[H1]]
// CHECK-NEXT:    %[[S1:.*]] = graph.mul %[[N1]], %[[G]]
// CHECK-NEXT:    %[[U1:.*]] = graph.matmul %[[S1]], %[[W1]]
// CHECK-NEXT:    %[[V1:.*]] = graph.gelu %[[U1]]
// CHECK-NEXT:    %[[Z1:.*]] = graph.matmul %[[V1]], %[[W2]]
// CHECK-NEXT:    %[[Q1:.*]] = graph.all_reduce %[[Z1]]
// CHECK-NEXT:    %[[O0:.*]] = graph.add %[[H0]], %[[Q0]] : tensor<4x16xf32>
// CHECK-NEXT:    %[[O1:.*]] = graph.add %[[H1]], %[[Q1]] : tensor<4x16xf32>
// CHECK-NEXT:    %[[O:.*]] = graph.concat %[[O0]], %[[O1]] {axis = 0} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT:    func.return %[[O]] : tensor<8x16xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @attention_out_mlp(%a: tensor<8x4xf32>, %wo: tensor<4x16xf32>, %x: tensor<8x16xf32>, %g: tensor<16xf32>, %w1: tensor<16x8xf32>, %w2: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {graph.partitioned} {
  %y = graph.matmul %a, %wo : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %r = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<8x16xf32>
  %h = graph.add %x, %r : tensor<8x16xf32>
  %n = graph.layer_norm %h {axes = [1], eps = 1.0e-05} : tensor<8x16xf32>
  %s = graph.mul %n, %g : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %u = graph.matmul %s, %w1 : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
  %v = graph.gelu %u {approximate = none} : tensor<8x8xf32>
  %z = graph.matmul %v, %w2 : tensor<8x8xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %q = graph.all_reduce %z {axes = [tp], kind = sum} : tensor<8x16xf32>
  %o = graph.add %h, %q attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<8x16xf32>
  func.return %o : tensor<8x16xf32>
}

// -----

// Propagation stops at a reduction over the cut dim: the exp chunks are concatenated
// just before the sum, which keeps its place; the softmax after it (over the other dim)
// is chunked there, and its chunks concatenated for the return.
// CHECK-LABEL: func.func @propagation_stops
// CHECK-NEXT:    %[[A0:.*]] = graph.slice
// CHECK-NEXT:    %[[A1:.*]] = graph.slice
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[A0]]
// CHECK-NEXT:    %[[R0:.*]] = graph.all_reduce %[[Y0]]
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[A1]]
// CHECK-NEXT:    %[[R1:.*]] = graph.all_reduce %[[Y1]]
// CHECK-NEXT:    %[[E0:.*]] = graph.exp %[[R0]] : tensor<4x6xf32>
// CHECK-NEXT:    %[[E1:.*]] = graph.exp %[[R1]] : tensor<4x6xf32>
// CHECK-NEXT:    %[[E:.*]] = graph.concat %[[E0]], %[[E1]] {axis = 0} : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.sum %[[E]] {axes = [0], keepdims = false} : tensor<8x6xf32> -> tensor<6xf32>
// CHECK-NEXT:    %[[M0:.*]] = graph.softmax %[[E0]] {axis = 1} : tensor<4x6xf32>
// CHECK-NEXT:    %[[M1:.*]] = graph.softmax %[[E1]] {axis = 1} : tensor<4x6xf32>
// CHECK-NEXT:    %[[M:.*]] = graph.concat %[[M0]], %[[M1]] {axis = 0}
// CHECK-NEXT:    func.return %[[M]], %[[S]] : tensor<8x6xf32>, tensor<6xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @propagation_stops(%a: tensor<8x4xf32>, %w: tensor<4x6xf32>) -> (tensor<8x6xf32>, tensor<6xf32>) attributes {graph.partitioned} {
  %y = graph.matmul %a, %w : tensor<8x4xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
  %r = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<8x6xf32>
  %e = graph.exp %r : tensor<8x6xf32>
  %s = graph.sum %e {axes = [0], keepdims = false} : tensor<8x6xf32> -> tensor<6xf32>
  %m = graph.softmax %e {axis = 1} : tensor<8x6xf32>
  func.return %m, %s : tensor<8x6xf32>, tensor<6xf32>
}

// -----

// Sequence-parallel MLP: the reduce_scatter chunks (2 of this rank's 4 rows each) flow
// through the residual add and the layer norm into the all_gather on the cut dim, whose
// chunks hold 2 rows of every rank (4 blocks); through the MLP to the reduce_scatter,
// which brings them back to 2 of this rank's rows; one concatenation at the end.
// CHECK-LABEL: func.func @sequence_parallel_mlp
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<16x4xf32>, %[[WO:[^:]*]]: tensor<4x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>, %[[W1:[^:]*]]: tensor<8x4xf32>, %[[W2:[^:]*]]: tensor<4x8xf32>)
// CHECK-NEXT:    %[[V:.*]] = graph.reshape %[[A]] : tensor<16x4xf32> -> tensor<4x4x4xf32>
// CHECK-NEXT:    graph.slice %[[V]] {starts = [0, 0, 0], limits = [4, 2, 4], strides = [1, 1, 1]}
// CHECK-NEXT:    %[[A0:.*]] = graph.reshape {{.*}} : tensor<4x2x4xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    graph.slice %[[V]] {starts = [0, 2, 0], limits = [4, 4, 4], strides = [1, 1, 1]}
// CHECK-NEXT:    %[[A1:.*]] = graph.reshape {{.*}} : tensor<4x2x4xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    %[[X0:.*]] = graph.slice %[[X]] {starts = [0, 0], limits = [2, 8], strides = [1, 1]}
// CHECK-NEXT:    %[[X1:.*]] = graph.slice %[[X]] {starts = [2, 0], limits = [4, 8], strides = [1, 1]}
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %[[A0]], %[[WO]] : tensor<8x4xf32>, tensor<4x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[R0:.*]] = graph.reduce_scatter %[[Y0]] {axes = [tp], dim = 0, kind = sum} : tensor<8x8xf32> -> tensor<2x8xf32>
// CHECK-NEXT:    %[[Y1:.*]] = graph.matmul %[[A1]], %[[WO]]
// CHECK-NEXT:    %[[R1:.*]] = graph.reduce_scatter %[[Y1]]
// CHECK-NEXT:    %[[H0:.*]] = graph.add %[[X0]], %[[R0]] : tensor<2x8xf32>
// CHECK-NEXT:    %[[N0:.*]] = graph.layer_norm %[[H0]]
// CHECK-NEXT:    %[[G0:.*]] = graph.all_gather %[[N0]] {axes = [tp], dim = 0} : tensor<2x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[H1:.*]] = graph.add %[[X1]], %[[R1]]
// CHECK-NEXT:    %[[N1:.*]] = graph.layer_norm %[[H1]]
// CHECK-NEXT:    %[[G1:.*]] = graph.all_gather %[[N1]]
// CHECK-NEXT:    %[[U0:.*]] = graph.matmul %[[G0]], %[[W1]] : tensor<8x8xf32>, tensor<8x4xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    %[[T0:.*]] = graph.gelu %[[U0]] {approximate = tanh}
// CHECK-NEXT:    %[[Z0:.*]] = graph.matmul %[[T0]], %[[W2]]
// CHECK-NEXT:    %[[Q0:.*]] = graph.reduce_scatter %[[Z0]] {axes = [tp], dim = 0, kind = sum} : tensor<8x8xf32> -> tensor<2x8xf32>
// CHECK-NEXT:    %[[U1:.*]] = graph.matmul %[[G1]], %[[W1]]
// CHECK-NEXT:    %[[T1:.*]] = graph.gelu %[[U1]]
// CHECK-NEXT:    %[[Z1:.*]] = graph.matmul %[[T1]], %[[W2]]
// CHECK-NEXT:    %[[Q1:.*]] = graph.reduce_scatter %[[Z1]]
// CHECK-NEXT:    %[[O0:.*]] = graph.add %[[H0]], %[[Q0]] : tensor<2x8xf32>
// CHECK-NEXT:    %[[O1:.*]] = graph.add %[[H1]], %[[Q1]] : tensor<2x8xf32>
// CHECK-NEXT:    %[[O:.*]] = graph.concat %[[O0]], %[[O1]] {axis = 0} : tensor<2x8xf32>, tensor<2x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    func.return %[[O]] : tensor<4x8xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @sequence_parallel_mlp(%a: tensor<16x4xf32>, %wo: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w1: tensor<8x4xf32>, %w2: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {graph.partitioned} {
  %y = graph.matmul %a, %wo : tensor<16x4xf32>, tensor<4x8xf32> -> tensor<16x8xf32>
  %r = graph.reduce_scatter %y {axes = [tp], dim = 0, kind = sum} : tensor<16x8xf32> -> tensor<4x8xf32>
  %h = graph.add %x, %r : tensor<4x8xf32>
  %n = graph.layer_norm %h {axes = [1], eps = 1.0e-05} : tensor<4x8xf32>
  %g = graph.all_gather %n {axes = [tp], dim = 0} : tensor<4x8xf32> -> tensor<16x8xf32>
  %u = graph.matmul %g, %w1 : tensor<16x8xf32>, tensor<8x4xf32> -> tensor<16x4xf32>
  %v = graph.gelu %u {approximate = tanh} : tensor<16x4xf32>
  %z = graph.matmul %v, %w2 : tensor<16x4xf32>, tensor<4x8xf32> -> tensor<16x8xf32>
  %q = graph.reduce_scatter %z {axes = [tp], dim = 0, kind = sum} : tensor<16x8xf32> -> tensor<4x8xf32>
  %o = graph.add %h, %q : tensor<4x8xf32>
  func.return %o : tensor<4x8xf32>
}
