// RUN: tessera-opt %s --split-input-file -p lower-graph-to-schedule | filecheck %s
// RUN: tessera-opt %s --split-input-file -p lower-graph-to-schedule | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p lower-graph-to-schedule --print-op-generic | tessera-opt --split-input-file | filecheck %s

// Kernel grouping, start/wait placement and kernel names. The second and third RUN lines
// re-parse (and re-verify) the scheduled IR in custom and generic form.

// Megatron MLP after shard-partition: the first matmul takes gelu as its epilogue, the
// second matmul is a kernel alone, its partial sum becomes one start/wait pair.
// CHECK-LABEL: func.func @megatron_mlp
// CHECK-NEXT:    %[[G:.*]] = schedule.kernel @megatron_mlp_k0_matmul(%[[A:.*]] = %x, %[[B:.*]] = %w1) : (tensor<8x64xf32>, tensor<64x64xf32>) -> tensor<8x64xf32> {
// CHECK-NEXT:      %[[H:.*]] = graph.matmul %[[A]], %[[B]] : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
// CHECK-NEXT:      %[[G1:.*]] = graph.gelu %[[H]] {approximate = tanh} : tensor<8x64xf32>
// CHECK-NEXT:      schedule.yield %[[G1]] : tensor<8x64xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @megatron_mlp_k1_matmul(%[[C:.*]] = %[[G]], %[[D:.*]] = %w2)
// CHECK-NEXT:      %[[Y1:.*]] = graph.matmul %[[C]], %[[D]]
// CHECK-NEXT:      schedule.yield %[[Y1]] : tensor<8x64xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[HANDLE:.*]] = schedule.start all_reduce %[[Y]] {axes = [tp], kind = sum} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[HANDLE]] : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
// CHECK-NEXT:    func.return %[[R]] : tensor<8x64xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @megatron_mlp(%x: tensor<8x64xf32>, %w1: tensor<64x64xf32>, %w2: tensor<64x64xf32>) -> tensor<8x64xf32> attributes {graph.partitioned} {
  %h = graph.matmul %x, %w1 : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
  %g = graph.gelu %h {approximate = tanh} : tensor<8x64xf32>
  %y = graph.matmul %g, %w2 : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
  %r = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<8x64xf32>
  func.return %r : tensor<8x64xf32>
}

// -----

// A matmul absorbs its epilogue: the bias add and the activation.
// CHECK-LABEL: func.func @matmul_bias_gelu
// CHECK-NEXT:    %[[K:.*]] = schedule.kernel @matmul_bias_gelu_k0_matmul(%[[X:.*]] = %x, %[[W:.*]] = %w, %[[B:.*]] = %b)
// CHECK-NEXT:      %[[M:.*]] = graph.matmul %[[X]], %[[W]]
// CHECK-NEXT:      %[[A:.*]] = graph.add %[[M]], %[[B]]
// CHECK-NEXT:      %[[G:.*]] = graph.gelu %[[A]] {approximate = none}
// CHECK-NEXT:      schedule.yield %[[G]] : tensor<8x32xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[K]] : tensor<8x32xf32>
func.func @matmul_bias_gelu(%x: tensor<8x64xf32>, %w: tensor<64x32xf32>, %b: tensor<32xf32>) -> tensor<8x32xf32> {
  %m = graph.matmul %x, %w : tensor<8x64xf32>, tensor<64x32xf32> -> tensor<8x32xf32>
  %a = graph.add %m, %b : tensor<8x32xf32>, tensor<32xf32> -> tensor<8x32xf32>
  %g = graph.gelu %a {approximate = none} : tensor<8x32xf32>
  func.return %g : tensor<8x32xf32>
}

// -----

// A row reduction absorbs its elementwise prologue (a scale) and epilogue (the affine
// gamma/beta), and the kernel is named after the reduction.
// CHECK-LABEL: func.func @layer_norm_affine
// CHECK-NEXT:    %[[K:.*]] = schedule.kernel @layer_norm_affine_k0_layer_norm(%[[X:.*]] = %x, %[[S:.*]] = %s, %[[G:.*]] = %gamma, %[[B:.*]] = %beta)
// CHECK-NEXT:      %[[P:.*]] = graph.mul %[[X]], %[[S]]
// CHECK-NEXT:      %[[N:.*]] = graph.layer_norm %[[P]] {axes = [1], eps = 1.0e-05}
// CHECK-NEXT:      %[[M:.*]] = graph.mul %[[N]], %[[G]]
// CHECK-NEXT:      %[[O:.*]] = graph.add %[[M]], %[[B]]
// CHECK-NEXT:      schedule.yield %[[O]] : tensor<8x64xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[K]]
func.func @layer_norm_affine(%x: tensor<8x64xf32>, %s: tensor<64xf32>, %gamma: tensor<64xf32>, %beta: tensor<64xf32>) -> tensor<8x64xf32> {
  %p = graph.mul %x, %s : tensor<8x64xf32>, tensor<64xf32> -> tensor<8x64xf32>
  %n = graph.layer_norm %p {axes = [1], eps = 1.0e-05} : tensor<8x64xf32>
  %m = graph.mul %n, %gamma : tensor<8x64xf32>, tensor<64xf32> -> tensor<8x64xf32>
  %o = graph.add %m, %beta : tensor<8x64xf32>, tensor<64xf32> -> tensor<8x64xf32>
  func.return %o : tensor<8x64xf32>
}

// -----

// softmax absorbs its scale prologue; the scalar constant is copied into the kernel.
// CHECK-LABEL: func.func @softmax_scale
// CHECK-NEXT:    %[[K:.*]] = schedule.kernel @softmax_scale_k0_softmax(%[[X:.*]] = %x) : (tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK-NEXT:      %[[C:.*]] = graph.constant dense<1.250000e-01> : tensor<f32>
// CHECK-NEXT:      %[[S:.*]] = graph.mul %[[X]], %[[C]]
// CHECK-NEXT:      %[[P:.*]] = graph.softmax %[[S]] {axis = 1}
// CHECK-NEXT:      schedule.yield %[[P]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[K]]
func.func @softmax_scale(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %c = graph.constant dense<0.125> : tensor<f32>
  %s = graph.mul %x, %c : tensor<8x16xf32>, tensor<f32> -> tensor<8x16xf32>
  %p = graph.softmax %s {axis = 1} : tensor<8x16xf32>
  func.return %p : tensor<8x16xf32>
}

// -----

// A chain of elementwise ops is one kernel; a second input (%y) joins as an input.
// CHECK-LABEL: func.func @elementwise_chain
// CHECK-NEXT:    %[[K:.*]] = schedule.kernel @elementwise_chain_k0_exp(%[[X:.*]] = %x, %[[Y:.*]] = %y)
// CHECK-NEXT:      %[[A:.*]] = graph.exp %[[X]]
// CHECK-NEXT:      %[[B:.*]] = graph.add %[[A]], %[[Y]]
// CHECK-NEXT:      %[[C:.*]] = graph.tanh %[[B]]
// CHECK-NEXT:      %[[D:.*]] = graph.relu %[[C]]
// CHECK-NEXT:      schedule.yield %[[D]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[K]]
func.func @elementwise_chain(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %a = graph.exp %x : tensor<4x8xf32>
  %b = graph.add %a, %y : tensor<4x8xf32>
  %c = graph.tanh %b : tensor<4x8xf32>
  %d = graph.relu %c : tensor<4x8xf32>
  func.return %d : tensor<4x8xf32>
}

// -----

// A value with two consumers: both join its kernel, which has two outputs.
// CHECK-LABEL: func.func @two_consumers
// CHECK-NEXT:    %[[A:.*]], %[[B:.*]] = schedule.kernel @two_consumers_k0_exp(%[[X:.*]] = %x) : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
// CHECK-NEXT:      %[[E:.*]] = graph.exp %[[X]]
// CHECK-NEXT:      %[[N:.*]] = graph.neg %[[E]]
// CHECK-NEXT:      %[[S:.*]] = graph.abs %[[E]]
// CHECK-NEXT:      schedule.yield %[[N]], %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[A]], %[[B]]
func.func @two_consumers(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %e = graph.exp %x : tensor<4x8xf32>
  %a = graph.neg %e : tensor<4x8xf32>
  %b = graph.abs %e : tensor<4x8xf32>
  func.return %a, %b : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Serial: the start follows the producing kernel and its wait comes right after it
// (overlap-comm moves the wait down to the add). The add reads %z transposed.
// CHECK-LABEL: func.func @wait_after_start
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @wait_after_start_k0_matmul
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    %[[Z:.*]] = schedule.kernel @wait_after_start_k1_matmul(%{{.*}} = %u, %{{.*}} = %v)
// CHECK:         %[[O:.*]] = schedule.kernel @wait_after_start_k2_add(%[[RA:.*]] = %[[R]], %[[ZA:.*]] = %[[Z]])
// CHECK-NEXT:      %[[T:.*]] = graph.transpose %[[ZA]] {perm = [1, 0]}
// CHECK-NEXT:      graph.add %[[RA]], %[[T]]
// CHECK:         func.return %[[O]]
graph.mesh @mesh axes = [tp = 4]
func.func @wait_after_start(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>, %u: tensor<32x8xf32>, %v: tensor<8x8xf32>) -> tensor<8x32xf32> attributes {graph.partitioned} {
  %y = graph.matmul %x, %w : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %r = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32>
  %z = graph.matmul %u, %v : tensor<32x8xf32>, tensor<8x8xf32> -> tensor<32x8xf32>
  %t = graph.transpose %z {perm = [1, 0]} : tensor<32x8xf32> -> tensor<8x32xf32>
  %o = graph.add %r, %t : tensor<8x32xf32>
  func.return %o : tensor<8x32xf32>
}

// -----

// A graph.wait (per-rank code's h.wait()) is where the all-reduce is waited for: after
// the kernel traced before it (k1), before the one traced after it (k2), marked
// schedule.user_wait so that overlap-comm keeps it there. The wait op itself is gone:
// the add reads the collective's result.
// CHECK-LABEL: func.func @user_wait
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @user_wait_k0_matmul
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @user_wait_k1_exp
// CHECK:         %[[R:.*]] = schedule.wait %[[H]] attributes {schedule.user_wait}
// CHECK-NEXT:    %[[T:.*]] = schedule.kernel @user_wait_k2_tanh
// CHECK:         %[[O:.*]] = schedule.kernel @user_wait_k3_add(%{{.*}} = %[[R]])
// CHECK-NOT:     graph.wait
// CHECK:         func.return %[[O]], %[[E]], %[[T]]
graph.mesh @mesh axes = [tp = 4]
func.func @user_wait(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>, %u: tensor<8x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>) attributes {graph.partitioned} {
  %y = graph.matmul %x, %w : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %r = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32>
  %e = graph.exp %u : tensor<8x32xf32>
  %s = graph.wait %r : tensor<8x32xf32>
  %t = graph.tanh %u : tensor<8x32xf32>
  %o = graph.add %s, %s : tensor<8x32xf32>
  func.return %o, %e, %t : tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>
}

// -----

// Layout ops with one operand are read through by their consumers (cloned into the
// consumer's kernel, which evaluates them as index arithmetic): no layout kernel.
// CHECK-LABEL: func.func @reshape_transpose
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @reshape_transpose_k0_exp
// CHECK:         %[[N:.*]] = schedule.kernel @reshape_transpose_k1_neg(%[[EA:.*]] = %[[E]]) : (tensor<8x16xf32>) -> tensor<4x8x4xf32> {
// CHECK-NEXT:      %[[R:.*]] = graph.reshape %[[EA]]
// CHECK-NEXT:      %[[T:.*]] = graph.transpose %[[R]] {perm = [1, 0, 2]}
// CHECK-NEXT:      graph.neg %[[T]]
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[N]]
func.func @reshape_transpose(%x: tensor<8x16xf32>) -> tensor<4x8x4xf32> {
  %e = graph.exp %x : tensor<8x16xf32>
  %r = graph.reshape %e : tensor<8x16xf32> -> tensor<8x4x4xf32>
  %t = graph.transpose %r {perm = [1, 0, 2]} : tensor<8x4x4xf32> -> tensor<4x8x4xf32>
  %n = graph.neg %t : tensor<4x8x4xf32>
  func.return %n : tensor<4x8x4xf32>
}

// -----

// Two collectives, each started once its operand is made and waited for at once.
// CHECK-LABEL: func.func @two_collectives
// CHECK-NEXT:    %[[P:.*]] = schedule.kernel @two_collectives_k0_matmul
// CHECK:         %[[H1:.*]] = schedule.start all_reduce %[[P]] {axes = [tp], kind = sum} : tensor<8x8xf32> -> !schedule.handle<tensor<8x8xf32>>
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[H1]] : !schedule.handle<tensor<8x8xf32>> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[Q:.*]] = schedule.kernel @two_collectives_k1_matmul
// CHECK:         %[[H2:.*]] = schedule.start all_gather %[[Q]] {axes = [tp], dim = 0} : tensor<2x8xf32> -> !schedule.handle<tensor<8x8xf32>>
// CHECK-NEXT:    %[[G:.*]] = schedule.wait %[[H2]] : !schedule.handle<tensor<8x8xf32>> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[O:.*]] = schedule.kernel @two_collectives_k2_add(%{{.*}} = %[[G]], %{{.*}} = %[[R]])
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @two_collectives(%a: tensor<8x16xf32>, %b: tensor<16x8xf32>, %c: tensor<2x16xf32>, %d: tensor<16x8xf32>) -> tensor<8x8xf32> attributes {graph.partitioned} {
  %p = graph.matmul %a, %b : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
  %q = graph.matmul %c, %d : tensor<2x16xf32>, tensor<16x8xf32> -> tensor<2x8xf32>
  %r = graph.all_reduce %p {axes = [tp], kind = sum} : tensor<8x8xf32>
  %g = graph.all_gather %q {axes = [tp], dim = 0} : tensor<2x8xf32> -> tensor<8x8xf32>
  %o = graph.add %g, %r : tensor<8x8xf32>
  func.return %o : tensor<8x8xf32>
}

// -----

// A function that is not partitioned and has no collectives lowers too: matmul + relu,
// then a row sum with its log epilogue.
// CHECK-LABEL: func.func @no_collectives
// CHECK-NEXT:    %[[R:.*]] = schedule.kernel @no_collectives_k0_matmul
// CHECK-NEXT:      graph.matmul
// CHECK-NEXT:      graph.relu
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[L:.*]] = schedule.kernel @no_collectives_k1_sum(%{{.*}} = %[[R]])
// CHECK-NEXT:      graph.sum
// CHECK-NEXT:      graph.log
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[L]]
func.func @no_collectives(%x: tensor<8x64xf32>, %w: tensor<64x64xf32>) -> tensor<8xf32> {
  %m = graph.matmul %x, %w : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
  %r = graph.relu %m : tensor<8x64xf32>
  %s = graph.sum %r {axes = [1], keepdims = false} : tensor<8x64xf32> -> tensor<8xf32>
  %l = graph.log %s : tensor<8xf32>
  func.return %l : tensor<8xf32>
}

// -----

// shard-partition's expansion of a softmax over a split axis: each statistic is a kernel
// and an all-reduce; exp(x - m) feeds both the sum and the division: the sum takes it as
// its prologue and it is also an output of that kernel, which the division reads.
// CHECK-LABEL: func.func @split_softmax
// CHECK-NEXT:    %[[M:.*]] = schedule.kernel @split_softmax_k0_max
// CHECK:         %[[H1:.*]] = schedule.start all_reduce %[[M]] {axes = [tp], kind = max}
// CHECK-NEXT:    %[[GM:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    %[[E:.*]], %[[S:.*]] = schedule.kernel @split_softmax_k1_sum(%{{.*}} = %x, %{{.*}} = %[[GM]])
// CHECK-NEXT:      graph.sub
// CHECK-NEXT:      %[[EXP:.*]] = graph.exp
// CHECK-NEXT:      %[[SUM:.*]] = graph.sum %[[EXP]]
// CHECK-NEXT:      schedule.yield %[[EXP]], %[[SUM]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[H2:.*]] = schedule.start all_reduce %[[S]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[GS:.*]] = schedule.wait %[[H2]]
// CHECK-NEXT:    %[[O:.*]] = schedule.kernel @split_softmax_k2_div(%{{.*}} = %[[E]], %{{.*}} = %[[GS]])
graph.mesh @mesh axes = [tp = 4]
func.func @split_softmax(%x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {graph.partitioned} {
  %0 = graph.max %x {axes = [1], keepdims = true} : tensor<8x4xf32> -> tensor<8x1xf32>
  %1 = graph.all_reduce %0 {axes = [tp], kind = max} : tensor<8x1xf32>
  %2 = graph.sub %x, %1 : tensor<8x4xf32>, tensor<8x1xf32> -> tensor<8x4xf32>
  %3 = graph.exp %2 : tensor<8x4xf32>
  %4 = graph.sum %3 {axes = [1], keepdims = true} : tensor<8x4xf32> -> tensor<8x1xf32>
  %5 = graph.all_reduce %4 {axes = [tp], kind = sum} : tensor<8x1xf32>
  %6 = graph.div %3, %5 : tensor<8x4xf32>, tensor<8x1xf32> -> tensor<8x4xf32>
  func.return %6 : tensor<8x4xf32>
}

// -----

// A collective of a function argument starts first thing.
// CHECK-LABEL: func.func @collective_of_argument
// CHECK-NEXT:    %[[H:.*]] = schedule.start all_gather %x {axes = [tp], dim = 1} : tensor<8x4xf32> -> !schedule.handle<tensor<8x16xf32>>
// CHECK-NEXT:    %[[G:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    %[[O:.*]] = schedule.kernel @collective_of_argument_k0_exp(%{{.*}} = %y, %{{.*}} = %[[G]])
graph.mesh @mesh axes = [tp = 4]
func.func @collective_of_argument(%x: tensor<8x4xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 1} : tensor<8x4xf32> -> tensor<8x16xf32>
  %e = graph.exp %y : tensor<8x16xf32>
  %o = graph.mul %e, %g : tensor<8x16xf32>
  func.return %o : tensor<8x16xf32>
}

// -----

// A collective whose operand is another collective's result, its result used twice: one
// start and one wait each (waiting for the operand must not start it a second time).
graph.mesh @mesh axes = [x = 2, y = 2]
// CHECK-LABEL: func.func @chained_collectives
func.func @chained_collectives(%a: tensor<3x12xf32>) -> (tensor<3x12xf32>, tensor<3x12xf32>) attributes {graph.partitioned} {
  // CHECK: %[[H0:.*]] = schedule.start all_gather %{{.*}} {axes = [y], dim = 0}
  // CHECK-NEXT: %[[W0:.*]] = schedule.wait %[[H0]]
  // CHECK-NEXT: %[[H1:.*]] = schedule.start all_gather %[[W0]] {axes = [x], dim = 0}
  // CHECK-NEXT: schedule.wait %[[H1]]
  // CHECK-NOT: schedule.start
  %0 = graph.all_gather %a {axes = [y], dim = 0} : tensor<3x12xf32> -> tensor<6x12xf32>
  %1 = graph.all_gather %0 {axes = [x], dim = 0} : tensor<6x12xf32> -> tensor<12x12xf32>
  %2 = graph.matmul %a, %1 : tensor<3x12xf32>, tensor<12x12xf32> -> tensor<3x12xf32>
  %3 = graph.tanh %1 : tensor<12x12xf32>
  %4 = graph.matmul %a, %3 : tensor<3x12xf32>, tensor<12x12xf32> -> tensor<3x12xf32>
  func.return %2, %4 : tensor<3x12xf32>, tensor<3x12xf32>
}

// -----

// Multi-output fusion: two independent chains (the moments) merge where one op reads
// both, and m and v, used by the update and returned, are outputs of the same kernel.
// CHECK-LABEL: func.func @adam_moments
// CHECK-NEXT:    %[[MN:.*]], %[[VN:.*]], %[[PN:.*]] = schedule.kernel @adam_moments_k0_mul(%{{.*}} = %m, %{{.*}} = %g, %{{.*}} = %v, %{{.*}} = %c, %{{.*}} = %p)
// CHECK-SAME:      -> (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) {
// CHECK:           %[[M:.*]] = graph.add
// CHECK:           %[[V:.*]] = graph.add
// CHECK:           graph.sqrt
// CHECK:           %[[P:.*]] = graph.sub
// CHECK-NEXT:      schedule.yield %[[M]], %[[V]], %[[P]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[PN]], %[[MN]], %[[VN]]
func.func @adam_moments(%p: tensor<16x8xf32>, %g: tensor<16x8xf32>, %m: tensor<16x8xf32>, %v: tensor<16x8xf32>, %c: tensor<f32>) -> (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) {
  %b1 = graph.constant dense<0.9> : tensor<f32>
  %nb1 = graph.constant dense<0.1> : tensor<f32>
  %m1 = graph.mul %m, %b1 : tensor<16x8xf32>, tensor<f32> -> tensor<16x8xf32>
  %g1 = graph.mul %g, %nb1 : tensor<16x8xf32>, tensor<f32> -> tensor<16x8xf32>
  %mn = graph.add %m1, %g1 : tensor<16x8xf32>
  %g2 = graph.mul %g, %g : tensor<16x8xf32>
  %vn = graph.add %v, %g2 : tensor<16x8xf32>
  %s = graph.sqrt %vn : tensor<16x8xf32>
  %u = graph.div %mn, %s : tensor<16x8xf32>
  %sc = graph.mul %u, %c : tensor<16x8xf32>, tensor<f32> -> tensor<16x8xf32>
  %pn = graph.sub %p, %sc : tensor<16x8xf32>
  func.return %pn, %mn, %vn : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>
}

// -----

// An output is computed over the whole iteration space: a scalar used by two kernels
// of a larger space stays a kernel of its own (it would be stored once per element).
// CHECK-LABEL: func.func @scalar_used_twice
// CHECK-NEXT:    %[[S:.*]] = schedule.kernel @scalar_used_twice_k0_exp(%{{.*}} = %t) : (tensor<f32>) -> tensor<f32> {
// CHECK:         schedule.kernel @scalar_used_twice_k1_mul(%{{.*}} = %x, %{{.*}} = %[[S]])
// CHECK:         schedule.kernel @scalar_used_twice_k2_mul(%{{.*}} = %y, %{{.*}} = %[[S]])
func.func @scalar_used_twice(%t: tensor<f32>, %x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = graph.exp %t : tensor<f32>
  %a = graph.mul %x, %s : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  %b = graph.mul %y, %s : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  func.return %a, %b : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Matmul prologues: the transposed weight and the head split (reshape, transpose) of a
// matmul's result are read in place by the matmuls. %q is also returned, so it is a
// kernel too, which reads the same layout ops.
// CHECK-LABEL: func.func @matmul_prologue
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @matmul_prologue_k0_matmul(%[[X:.*]] = %x, %[[W:.*]] = %w)
// CHECK-NEXT:      %[[WT:.*]] = graph.transpose %[[W]] {perm = [1, 0]}
// CHECK-NEXT:      graph.matmul %[[X]], %[[WT]]
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[Q:.*]] = schedule.kernel @matmul_prologue_k1_transpose(%{{.*}} = %[[Y]])
// CHECK-NEXT:      graph.reshape
// CHECK-NEXT:      graph.transpose
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[S:.*]] = schedule.kernel @matmul_prologue_k2_matmul(%[[YA:.*]] = %[[Y]], %[[K:.*]] = %k)
// CHECK-NEXT:      %[[R:.*]] = graph.reshape %[[YA]]
// CHECK-NEXT:      %[[QA:.*]] = graph.transpose %[[R]] {perm = [0, 2, 1, 3]}
// CHECK-NEXT:      %[[KT:.*]] = graph.transpose %[[K]] {perm = [0, 2, 3, 1]}
// CHECK-NEXT:      graph.matmul %[[QA]], %[[KT]]
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[Y]], %[[Q]], %[[S]]
func.func @matmul_prologue(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %k: tensor<2x8x4x8xf32>) -> (tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) {
  %wt = graph.transpose %w {perm = [1, 0]} : tensor<32x16xf32> -> tensor<16x32xf32>
  %y = graph.matmul %x, %wt : tensor<2x8x16xf32>, tensor<16x32xf32> -> tensor<2x8x32xf32>
  %r = graph.reshape %y : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %q = graph.transpose %r {perm = [0, 2, 1, 3]} : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %kt = graph.transpose %k {perm = [0, 2, 3, 1]} : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %s = graph.matmul %q, %kt : tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32> -> tensor<2x4x8x8xf32>
  func.return %y, %q, %s : tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>
}

// -----

// A weight gradient, the batch sum of a batched matmul, is one matmul with the batch
// folded into K: x moved to [16, 2, 8] (composed with its transpose) and viewed as
// [16, 16], dy viewed as [16, 32].
// CHECK-LABEL: func.func @batch_summed_matmul
// CHECK-NEXT:    %[[S:.*]] = schedule.kernel @batch_summed_matmul_k0_matmul(%[[X:.*]] = %x, %[[DY:.*]] = %dy) : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32> {
// CHECK-NEXT:      %[[T:.*]] = graph.transpose %[[X]] {perm = [2, 0, 1]} : tensor<2x8x16xf32> -> tensor<16x2x8xf32>
// CHECK-NEXT:      %[[A:.*]] = graph.reshape %[[T]] : tensor<16x2x8xf32> -> tensor<16x16xf32>
// CHECK-NEXT:      %[[B:.*]] = graph.reshape %[[DY]] : tensor<2x8x32xf32> -> tensor<16x32xf32>
// CHECK-NEXT:      %[[M:.*]] = graph.matmul %[[A]], %[[B]] : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
// CHECK-NEXT:      schedule.yield %[[M]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[S]]
func.func @batch_summed_matmul(%x: tensor<2x8x16xf32>, %dy: tensor<2x8x32xf32>) -> tensor<16x32xf32> {
  %xt = graph.transpose %x {perm = [0, 2, 1]} : tensor<2x8x16xf32> -> tensor<2x16x8xf32>
  %p = graph.matmul %xt, %dy : tensor<2x16x8xf32>, tensor<2x8x32xf32> -> tensor<2x16x32xf32>
  %s = graph.sum %p {axes = [0], keepdims = false} : tensor<2x16x32xf32> -> tensor<16x32xf32>
  func.return %s : tensor<16x32xf32>
}

// -----

// Several reductions over the same rows are one kernel (a layer norm's backward: the
// statistics, then the means of the gradient terms), with their prologues and epilogues.
// CHECK-LABEL: func.func @norm_backward
// CHECK-NEXT:    %[[DX:.*]] = schedule.kernel @norm_backward_k0_mean(%{{.*}} = %x, %{{.*}} = %dy, %{{.*}} = %w) : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32> {
// CHECK-NEXT:      graph.mean
// CHECK-NEXT:      graph.sub
// CHECK-NEXT:      graph.mul
// CHECK-NEXT:      graph.mean
// CHECK-NEXT:      graph.rsqrt
// CHECK-NEXT:      graph.mul
// CHECK-NEXT:      graph.mul
// CHECK-NEXT:      graph.mul
// CHECK-NEXT:      graph.mean
// CHECK-NEXT:      graph.mean
// CHECK-NEXT:      graph.mul
// CHECK-NEXT:      graph.sub
// CHECK-NEXT:      graph.sub
// CHECK-NEXT:      %[[O:.*]] = graph.mul
// CHECK-NEXT:      schedule.yield %[[O]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[DX]]
func.func @norm_backward(%x: tensor<8x16xf32>, %dy: tensor<8x16xf32>, %w: tensor<16xf32>) -> tensor<8x16xf32> {
  %mu = graph.mean %x {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
  %xc = graph.sub %x, %mu : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
  %sq = graph.mul %xc, %xc : tensor<8x16xf32>
  %var = graph.mean %sq {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
  %rs = graph.rsqrt %var : tensor<8x1xf32>
  %xh = graph.mul %xc, %rs : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
  %g = graph.mul %dy, %w : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
  %gx = graph.mul %g, %xh : tensor<8x16xf32>
  %m1 = graph.mean %gx {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
  %m2 = graph.mean %g {axes = [1], keepdims = true} : tensor<8x16xf32> -> tensor<8x1xf32>
  %t1 = graph.mul %xh, %m1 : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
  %t2 = graph.sub %g, %m2 : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
  %t3 = graph.sub %t2, %t1 : tensor<8x16xf32>
  %dx = graph.mul %t3, %rs : tensor<8x16xf32>, tensor<8x1xf32> -> tensor<8x16xf32>
  func.return %dx : tensor<8x16xf32>
}

// -----

// Reductions over the same rows that read the same input are one kernel even when
// neither uses the other (a layer norm's bias and weight gradients).
// CHECK-LABEL: func.func @sibling_sums
// CHECK-NEXT:    %[[DB:.*]], %[[DW:.*]] = schedule.kernel @sibling_sums_k0_sum(%[[DY:.*]] = %dy, %[[X:.*]] = %x)
// CHECK-NEXT:      %[[B:.*]] = graph.sum %[[DY]] {axes = [0], keepdims = false}
// CHECK-NEXT:      %[[P:.*]] = graph.mul %[[DY]], %[[X]]
// CHECK-NEXT:      %[[W:.*]] = graph.sum %[[P]] {axes = [0], keepdims = false}
// CHECK-NEXT:      schedule.yield %[[B]], %[[W]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[DW]], %[[DB]]
func.func @sibling_sums(%x: tensor<8x16xf32>, %dy: tensor<8x16xf32>) -> (tensor<16xf32>, tensor<16xf32>) {
  %db = graph.sum %dy {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  %dyx = graph.mul %dy, %x : tensor<8x16xf32>
  %dw = graph.sum %dyx {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  func.return %dw, %db : tensor<16xf32>, tensor<16xf32>
}

// -----

// No cycle through a collective: %a's kernel cannot take the add, which waits for the
// all-reduce of %a.
// CHECK-LABEL: func.func @through_collective
// CHECK-NEXT:    %[[A:.*]] = schedule.kernel @through_collective_k0_exp
// CHECK-NEXT:      graph.exp
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[H:.*]] = schedule.start all_reduce %[[A]]
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    schedule.kernel @through_collective_k1_add(%{{.*}} = %[[A]], %{{.*}} = %[[R]])
graph.mesh @mesh axes = [tp = 4]
func.func @through_collective(%x: tensor<8x8xf32>) -> tensor<8x8xf32> attributes {graph.partitioned} {
  %a = graph.exp %x : tensor<8x8xf32>
  %r = graph.all_reduce %a {axes = [tp], kind = sum} : tensor<8x8xf32>
  %b = graph.add %a, %r : tensor<8x8xf32>
  func.return %b : tensor<8x8xf32>
}

// -----

// No prologue fusion into a matmul by a merge: the add reads %a and the matmul's result,
// but %a's kernel does not join the matmul's, whose operand %a is.
// CHECK-LABEL: func.func @no_prologue_through_merge
// CHECK-NEXT:    %[[A:.*]] = schedule.kernel @no_prologue_through_merge_k0_exp
// CHECK:         schedule.kernel @no_prologue_through_merge_k1_matmul(%{{.*}} = %[[A]], %{{.*}} = %w)
// CHECK-NEXT:      graph.matmul
// CHECK-NEXT:      graph.add
// CHECK-NEXT:      schedule.yield
func.func @no_prologue_through_merge(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %a = graph.exp %x : tensor<8x8xf32>
  %m = graph.matmul %a, %w : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %b = graph.add %a, %m : tensor<8x8xf32>
  func.return %b : tensor<8x8xf32>
}

// -----

// A block move (shard-partition's chunk of a split dim): each local half is a kernel of
// its own (it leaves for a collective), each collective_permute a start/wait pair, and
// the sums of the permuted halves join their consumer's kernel.
// CHECK-LABEL: func.func @block_move
// CHECK-NEXT:    %[[L:.*]] = schedule.kernel @block_move_k0_slice(%{{.*}} = %h)
// CHECK-NEXT:      graph.slice %{{.*}} {starts = [0, 0], limits = [8, 8], strides = [1, 1]}
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[S0:.*]] = schedule.start collective_permute %[[L]] {axes = [tp], pairs = {{\[\[}}0, 0], [1, 2]]} : tensor<8x8xf32> -> !schedule.handle<tensor<8x8xf32>>
// CHECK-NEXT:    %[[W0:.*]] = schedule.wait %[[S0]] : !schedule.handle<tensor<8x8xf32>> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[S1:.*]] = schedule.start collective_permute %[[L]] {axes = [tp], pairs = {{\[\[}}2, 0], [3, 2]]}
// CHECK-NEXT:    %[[W1:.*]] = schedule.wait %[[S1]]
// CHECK-NEXT:    %[[R:.*]] = schedule.kernel @block_move_k1_slice(%{{.*}} = %h)
// CHECK-NEXT:      graph.slice %{{.*}} {starts = [0, 8], limits = [8, 16], strides = [1, 1]}
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[S2:.*]] = schedule.start collective_permute %[[R]] {axes = [tp], pairs = {{\[\[}}0, 1], [1, 3]]}
// CHECK-NEXT:    %[[W2:.*]] = schedule.wait %[[S2]]
// CHECK-NEXT:    %[[S3:.*]] = schedule.start collective_permute %[[R]] {axes = [tp], pairs = {{\[\[}}2, 1], [3, 3]]}
// CHECK-NEXT:    %[[W3:.*]] = schedule.wait %[[S3]]
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @block_move_k2_add(%[[A:.*]] = %[[W0]], %[[B:.*]] = %[[W2]], %[[C:.*]] = %[[W1]], %[[D:.*]] = %[[W3]])
// CHECK-NEXT:      %[[G:.*]] = graph.add %[[A]], %[[B]] : tensor<8x8xf32>
// CHECK-NEXT:      %[[U:.*]] = graph.add %[[C]], %[[D]] : tensor<8x8xf32>
// CHECK-NEXT:      graph.mul %[[G]], %[[U]] : tensor<8x8xf32>
graph.mesh @mesh axes = [tp = 4]
func.func @block_move(%h: tensor<8x16xf32>) -> tensor<8x8xf32> attributes {graph.partitioned} {
  %0 = graph.slice %h {starts = [0, 0], limits = [8, 8], strides = [1, 1]} : tensor<8x16xf32> -> tensor<8x8xf32>
  %1 = graph.collective_permute %0 {axes = [tp], pairs = [[0, 0], [1, 2]]} : tensor<8x8xf32>
  %2 = graph.slice %h {starts = [0, 8], limits = [8, 16], strides = [1, 1]} : tensor<8x16xf32> -> tensor<8x8xf32>
  %3 = graph.collective_permute %2 {axes = [tp], pairs = [[0, 1], [1, 3]]} : tensor<8x8xf32>
  %g = graph.add %1, %3 : tensor<8x8xf32>
  %4 = graph.collective_permute %0 {axes = [tp], pairs = [[2, 0], [3, 2]]} : tensor<8x8xf32>
  %5 = graph.collective_permute %2 {axes = [tp], pairs = [[2, 1], [3, 3]]} : tensor<8x8xf32>
  %u = graph.add %4, %5 : tensor<8x8xf32>
  %y = graph.mul %g, %u : tensor<8x8xf32>
  func.return %y : tensor<8x8xf32>
}

// -----

// No elementwise group spans an attention kernel it depends on: the sum of each step's
// partial result (a ring's online-softmax merge) is a kernel of that step, emitted
// before the next step's attention, so the partial results are not all live at once.
// CHECK-LABEL: func.func @no_fusion_across_attention
// CHECK:         %[[A0:.*]], %{{.*}} = schedule.kernel @no_fusion_across_attention_k0_attention(
// CHECK:         %[[A1:.*]], %{{.*}} = schedule.kernel @no_fusion_across_attention_k1_attention(
// CHECK:         %[[S1:.*]] = schedule.kernel @no_fusion_across_attention_k2_add(%{{.*}} = %[[A0]], %{{.*}} = %[[A1]])
// CHECK:         %[[A2:.*]], %{{.*}} = schedule.kernel @no_fusion_across_attention_k3_attention(
// CHECK:         %[[S2:.*]] = schedule.kernel @no_fusion_across_attention_k4_add(%{{.*}} = %[[S1]], %{{.*}} = %[[A2]])
// CHECK-NEXT:      graph.add
// CHECK-NEXT:      graph.tanh
// CHECK-NEXT:      schedule.yield
func.func @no_fusion_across_attention(%q: tensor<2x8x4xf32>, %k0: tensor<2x8x4xf32>, %k1: tensor<2x8x4xf32>, %k2: tensor<2x8x4xf32>) -> tensor<2x8x4xf32> {
  %a0, %l0 = graph.attention %q, %k0, %k0 {causal = false, scale = 0.5} : tensor<2x8x4xf32>, tensor<2x8x4xf32>, tensor<2x8x4xf32> -> (tensor<2x8x4xf32>, tensor<2x8xf32>)
  %a1, %l1 = graph.attention %q, %k1, %k1 {causal = false, scale = 0.5} : tensor<2x8x4xf32>, tensor<2x8x4xf32>, tensor<2x8x4xf32> -> (tensor<2x8x4xf32>, tensor<2x8xf32>)
  %s1 = graph.add %a0, %a1 : tensor<2x8x4xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  %a2, %l2 = graph.attention %q, %k2, %k2 {causal = false, scale = 0.5} : tensor<2x8x4xf32>, tensor<2x8x4xf32>, tensor<2x8x4xf32> -> (tensor<2x8x4xf32>, tensor<2x8xf32>)
  %s2 = graph.add %s1, %a2 : tensor<2x8x4xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  %t = graph.tanh %s2 : tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  func.return %t : tensor<2x8x4xf32>
}
