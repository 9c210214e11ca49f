// RUN: tessera-opt %s --split-input-file -p 'bucket-gradients{bucket_bytes=1024}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'bucket-gradients{bucket_bytes=1024}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'bucket-gradients{bucket_bytes=0}' | filecheck %s --check-prefix=OFF

// Two gradients reduced over dp and used only at the return: one all-reduce of their
// flattened concatenation, where the second one was; each result is sliced back out and
// keeps its sharding.
// CHECK-LABEL: func.func @two_gradients
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<4x8xf32>, %[[B:[^:]*]]: tensor<8xf32>)
// CHECK-NEXT:    %[[GA:.*]] = graph.mul %[[A]], %[[A]] : tensor<4x8xf32>
// CHECK-NEXT:    %[[GB:.*]] = graph.mul %[[B]], %[[B]]
// CHECK-NEXT:    %[[FA:.*]] = graph.reshape %[[GA]] : tensor<4x8xf32> -> tensor<32xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.concat %[[FA]], %[[GB]] {axis = 0} : tensor<32xf32>, tensor<8xf32> -> tensor<40xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[P]] {axes = [dp], kind = sum} : tensor<40xf32>
// CHECK-NEXT:    %[[SA:.*]] = graph.slice %[[R]] {starts = [0], limits = [32], strides = [1]} : tensor<40xf32> -> tensor<32xf32>
// CHECK-NEXT:    %[[RA:.*]] = graph.reshape %[[SA]] attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}], []]>} : tensor<32xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[SB:.*]] = graph.slice %[[R]] {starts = [32], limits = [40], strides = [1]} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]]>} : tensor<40xf32> -> tensor<8xf32>
// CHECK-NEXT:    func.return %[[RA]], %[[SB]]
// OFF-LABEL: func.func @two_gradients
// OFF:         graph.all_reduce
// OFF:         graph.all_reduce
// OFF-NOT:     graph.concat
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @two_gradients(%a: tensor<4x8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) attributes {graph.partitioned} {
  %ga = graph.mul %a, %a : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %ra = graph.all_reduce %ga {axes = [dp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, [[], []]>} : tensor<4x8xf32> -> tensor<4x8xf32>
  %gb = graph.mul %b, %b : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %rb = graph.all_reduce %gb {axes = [dp], kind = sum} attributes {graph.sharding = #graph.sharding<@mesh, [[]]>} : tensor<8xf32> -> tensor<8xf32>
  func.return %ra, %rb : tensor<4x8xf32>, tensor<8xf32>
}

// -----

// A use closes the bucket: the first all-reduce's result is read before the second is
// made (a tensor-parallel forward), so both stay as they are.
// CHECK-LABEL: func.func @used_at_once
// CHECK-NEXT:    graph.all_reduce
// CHECK-NEXT:    graph.mul
// CHECK-NEXT:    graph.all_reduce
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @used_at_once(%a: tensor<8xf32>) -> tensor<8xf32> attributes {graph.partitioned} {
  %r = graph.all_reduce %a {axes = [tp], kind = sum} : tensor<8xf32> -> tensor<8xf32>
  %m = graph.mul %r, %r : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %s = graph.all_reduce %m {axes = [tp], kind = sum} : tensor<8xf32> -> tensor<8xf32>
  func.return %s : tensor<8xf32>
}

// -----

// Buckets are per (axes, kind, dtype) and hold at most 1024 bytes: the three 128-float
// (512-byte) sums over dp fill one bucket of two and leave the third alone; the mean and
// the sum over tp are in other buckets (of one: unchanged). A 1024-byte gradient is never
// bucketed.
// CHECK-LABEL: func.func @bucket_limits
// CHECK-NEXT:    graph.all_reduce %{{.*}} {axes = [dp], kind = mean} : tensor<128xf32>
// CHECK-NEXT:    graph.all_reduce %{{.*}} {axes = [tp], kind = sum} : tensor<128xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.concat %{{.*}}, %{{.*}} {axis = 0} : tensor<128xf32>, tensor<128xf32> -> tensor<256xf32>
// CHECK-NEXT:    graph.all_reduce %[[P]] {axes = [dp], kind = sum} : tensor<256xf32>
// CHECK-NEXT:    graph.slice
// CHECK-NEXT:    graph.slice
// CHECK-NEXT:    graph.all_reduce %{{.*}} {axes = [dp], kind = sum} : tensor<128xf32>
// CHECK-NEXT:    graph.all_reduce %{{.*}} {axes = [dp], kind = sum} : tensor<256xf32>
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @bucket_limits(%a: tensor<128xf32>, %big: tensor<256xf32>) -> (tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<256xf32>) attributes {graph.partitioned} {
  %r0 = graph.all_reduce %a {axes = [dp], kind = sum} : tensor<128xf32> -> tensor<128xf32>
  %r1 = graph.all_reduce %a {axes = [dp], kind = mean} : tensor<128xf32> -> tensor<128xf32>
  %r2 = graph.all_reduce %a {axes = [tp], kind = sum} : tensor<128xf32> -> tensor<128xf32>
  %r3 = graph.all_reduce %a {axes = [dp], kind = sum} : tensor<128xf32> -> tensor<128xf32>
  %r4 = graph.all_reduce %a {axes = [dp], kind = sum} : tensor<128xf32> -> tensor<128xf32>
  %r5 = graph.all_reduce %big {axes = [dp], kind = sum} : tensor<256xf32> -> tensor<256xf32>
  func.return %r0, %r1, %r2, %r3, %r4, %r5 : tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<256xf32>
}

// -----

// An all-reduce over a group of one rank moves nothing and is not bucketed.
// CHECK-LABEL: func.func @single_rank_group
// CHECK-NOT:     graph.concat
// CHECK:         func.return
graph.mesh @mesh axes = [dp = 1, tp = 2]
func.func @single_rank_group(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {graph.partitioned} {
  %ra = graph.all_reduce %a {axes = [dp], kind = sum} : tensor<8xf32> -> tensor<8xf32>
  %rb = graph.all_reduce %b {axes = [dp], kind = sum} : tensor<8xf32> -> tensor<8xf32>
  func.return %ra, %rb : tensor<8xf32>, tensor<8xf32>
}

// -----

// insert-collectives places an all-reduce at its first use; the pass first moves each one
// to just after its operand's producer, so both gradients share a bucket that starts as
// soon as the second exists, before the unrelated add and the uses.
// CHECK-LABEL: func.func @hoisted_to_producer
// CHECK-NEXT:    %[[GA:.*]] = graph.mul %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK-NEXT:    %[[GB:.*]] = graph.mul %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.concat %[[GA]], %[[GB]] {axis = 0} : tensor<8xf32>, tensor<8xf32> -> tensor<16xf32>
// CHECK-NEXT:    %[[R:.*]] = graph.all_reduce %[[P]] {axes = [dp], kind = sum} : tensor<16xf32>
// CHECK-NEXT:    %[[RA:.*]] = graph.slice %[[R]] {starts = [0], limits = [8], strides = [1]}
// CHECK-NEXT:    %[[RB:.*]] = graph.slice %[[R]] {starts = [8], limits = [16], strides = [1]}
// CHECK-NEXT:    graph.add
// CHECK-NEXT:    graph.mul %[[RA]], %[[RA]]
// CHECK-NEXT:    graph.mul %[[RB]], %[[RB]]
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @hoisted_to_producer(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) attributes {graph.partitioned} {
  %ga = graph.mul %a, %a : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %gb = graph.mul %b, %b : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %x = graph.add %a, %b : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %ra = graph.all_reduce %ga {axes = [dp], kind = sum} : tensor<8xf32> -> tensor<8xf32>
  %ua = graph.mul %ra, %ra : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  %rb = graph.all_reduce %gb {axes = [dp], kind = sum} : tensor<8xf32> -> tensor<8xf32>
  %ub = graph.mul %rb, %rb : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
  func.return %x, %ua, %ub : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Reduce-scatters are bucketed too, apart from all-reduces, where the ranks' blocks are
// contiguous: the operand split on its first dim is packed as one row per rank of dp = 2
// (a reshape) with the one split on dim 1 of 1x4x3 (nothing before it), one
// reduce-scatter of the rows, each result sliced from the rank's row and reshaped. A
// split inner dim with a dim of size 2 before it (2x4x3) would need a transposed copy:
// it stays alone.
// CHECK-LABEL: func.func @scatters
// CHECK:         %[[RA:.*]] = graph.reshape %{{.*}} : tensor<4x8xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[RB:.*]] = graph.reshape %{{.*}} : tensor<1x4x3xf32> -> tensor<2x6xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.concat %[[RA]], %[[RB]] {axis = 1} : tensor<2x16xf32>, tensor<2x6xf32> -> tensor<2x22xf32>
// CHECK-NEXT:    %[[S:.*]] = graph.reduce_scatter %[[P]] {axes = [dp], dim = 0, kind = sum} : tensor<2x22xf32> -> tensor<1x22xf32>
// CHECK-NEXT:    %[[SA:.*]] = graph.slice %[[S]] {starts = [0, 0], limits = [1, 16], strides = [1, 1]} : tensor<1x22xf32> -> tensor<1x16xf32>
// CHECK-NEXT:    graph.reshape %[[SA]] : tensor<1x16xf32> -> tensor<2x8xf32>
// CHECK-NEXT:    %[[SB:.*]] = graph.slice %[[S]] {starts = [0, 16], limits = [1, 22], strides = [1, 1]} : tensor<1x22xf32> -> tensor<1x6xf32>
// CHECK-NEXT:    graph.reshape %[[SB]] : tensor<1x6xf32> -> tensor<1x2x3xf32>
// CHECK-NEXT:    graph.reduce_scatter %{{.*}} {axes = [dp], dim = 1, kind = sum} : tensor<2x4x3xf32> -> tensor<2x2x3xf32>
// CHECK-NEXT:    func.return
// OFF-LABEL: func.func @scatters
// OFF-NOT:     graph.concat
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @scatters(%a: tensor<4x8xf32>, %b: tensor<1x4x3xf32>, %c: tensor<2x4x3xf32>) -> (tensor<2x8xf32>, tensor<1x2x3xf32>, tensor<2x2x3xf32>) attributes {graph.partitioned} {
  %ga = graph.mul %a, %a : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %ra = graph.reduce_scatter %ga {axes = [dp], dim = 0, kind = sum} : tensor<4x8xf32> -> tensor<2x8xf32>
  %gb = graph.mul %b, %b : tensor<1x4x3xf32>, tensor<1x4x3xf32> -> tensor<1x4x3xf32>
  %rb = graph.reduce_scatter %gb {axes = [dp], dim = 1, kind = sum} : tensor<1x4x3xf32> -> tensor<1x2x3xf32>
  %rc = graph.reduce_scatter %c {axes = [dp], dim = 1, kind = sum} : tensor<2x4x3xf32> -> tensor<2x2x3xf32>
  func.return %ra, %rb, %rc : tensor<2x8xf32>, tensor<1x2x3xf32>, tensor<2x2x3xf32>
}

// -----

// All-gathers of one (axes, dtype) with no use between them are combined where the last
// was (never moved earlier): each block flattened into one row, one gather of the rows
// over dp = 2, the rows split into the members' column ranges in one pass (their
// columns are strided: FSDP2's split_with_sizes_copy), each reshaped (a gathered dim 1
// of 1x2x3 too: nothing before it). The gather of dim 1 of 2x2x3 stays alone.
// CHECK-LABEL: func.func @gathers
// CHECK:         graph.all_gather %{{.*}} {axes = [dp], dim = 1} : tensor<2x2x3xf32> -> tensor<2x4x3xf32>
// CHECK:         %[[FA:.*]] = graph.reshape %{{.*}} : tensor<2x8xf32> -> tensor<1x16xf32>
// CHECK-NEXT:    %[[FB:.*]] = graph.reshape %{{.*}} : tensor<1x2x3xf32> -> tensor<1x6xf32>
// CHECK-NEXT:    %[[P:.*]] = graph.concat %[[FA]], %[[FB]] {axis = 1} : tensor<1x16xf32>, tensor<1x6xf32> -> tensor<1x22xf32>
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %[[P]] {axes = [dp], dim = 0} : tensor<1x22xf32> -> tensor<2x22xf32>
// CHECK-NEXT:    %[[SA:.*]], %[[SB:.*]] = graph.split %[[G]] {axis = 1} : tensor<2x22xf32> -> (tensor<2x16xf32>, tensor<2x6xf32>)
// CHECK-NEXT:    graph.reshape %[[SA]] : tensor<2x16xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    graph.reshape %[[SB]] : tensor<2x6xf32> -> tensor<1x4x3xf32>
// CHECK-NEXT:    func.return
// OFF-LABEL: func.func @gathers
// OFF-NOT:     graph.concat
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @gathers(%a: tensor<2x8xf32>, %b: tensor<1x2x3xf32>, %c: tensor<2x2x3xf32>) -> (tensor<4x8xf32>, tensor<1x4x3xf32>, tensor<2x4x3xf32>) attributes {graph.partitioned} {
  %gc = graph.all_gather %c {axes = [dp], dim = 1} : tensor<2x2x3xf32> -> tensor<2x4x3xf32>
  %ga = graph.all_gather %a {axes = [dp], dim = 0} : tensor<2x8xf32> -> tensor<4x8xf32>
  %gb = graph.all_gather %b {axes = [dp], dim = 1} : tensor<1x2x3xf32> -> tensor<1x4x3xf32>
  func.return %ga, %gb, %gc : tensor<4x8xf32>, tensor<1x4x3xf32>, tensor<2x4x3xf32>
}

// -----

// All-gathers made at the function's start (ZeRO-3's parameters) first move down to
// their first uses: gathers read by different layers stay apart, so each layer's
// parameters are whole only for it; the two read by one matmul are combined there.
// CHECK-LABEL: func.func @gathers_at_their_uses
// CHECK:         %[[G0:.*]] = graph.all_gather %w0 {axes = [dp], dim = 0} : tensor<4x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[Y0:.*]] = graph.matmul %x, %[[G0]]
// CHECK-NEXT:    %[[Z0:.*]] = graph.tanh %[[Y0]]
// CHECK:         graph.concat
// CHECK-NEXT:    %[[G:.*]] = graph.all_gather %{{.*}} {axes = [dp], dim = 0} : tensor<1x64xf32> -> tensor<2x64xf32>
// CHECK:         graph.matmul
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [dp = 2]
func.func @gathers_at_their_uses(%x: tensor<8x8xf32>, %w0: tensor<4x8xf32>, %w1: tensor<4x8xf32>, %w2: tensor<4x8xf32>) -> tensor<8x8xf32> attributes {graph.partitioned} {
  %g0 = graph.all_gather %w0 {axes = [dp], dim = 0} : tensor<4x8xf32> -> tensor<8x8xf32>
  %g1 = graph.all_gather %w1 {axes = [dp], dim = 0} : tensor<4x8xf32> -> tensor<8x8xf32>
  %g2 = graph.all_gather %w2 {axes = [dp], dim = 0} : tensor<4x8xf32> -> tensor<8x8xf32>
  %y0 = graph.matmul %x, %g0 : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %z0 = graph.tanh %y0 : tensor<8x8xf32>
  %w = graph.add %g1, %g2 : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %y1 = graph.matmul %z0, %w : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  func.return %y1 : tensor<8x8xf32>
}
