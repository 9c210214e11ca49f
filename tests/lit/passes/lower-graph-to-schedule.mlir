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

// A value with two consumers is not fused into either: three kernels.
// CHECK-LABEL: func.func @two_consumers
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @two_consumers_k0_exp(%{{.*}} = %x)
// CHECK-NEXT:      graph.exp
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[A:.*]] = schedule.kernel @two_consumers_k1_neg(%{{.*}} = %[[E]])
// CHECK-NEXT:      graph.neg
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[B:.*]] = schedule.kernel @two_consumers_k2_abs(%{{.*}} = %[[E]])
// CHECK-NEXT:      graph.abs
// CHECK-NEXT:      schedule.yield
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
// (overlap-comm moves the wait down to the add).
// CHECK-LABEL: func.func @wait_after_start
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @wait_after_start_k0_matmul
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    %[[Z:.*]] = schedule.kernel @wait_after_start_k1_matmul(%{{.*}} = %u, %{{.*}} = %v)
// CHECK:         %[[T:.*]] = schedule.kernel @wait_after_start_k2_transpose(%{{.*}} = %[[Z]])
// CHECK:         %[[O:.*]] = schedule.kernel @wait_after_start_k3_add(%{{.*}} = %[[R]], %{{.*}} = %[[T]])
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

// Layout ops are kernels of their own and take no epilogue.
// CHECK-LABEL: func.func @reshape_transpose
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @reshape_transpose_k0_exp
// CHECK:         %[[R:.*]] = schedule.kernel @reshape_transpose_k1_reshape(%{{.*}} = %[[E]])
// CHECK-NEXT:      graph.reshape
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[T:.*]] = schedule.kernel @reshape_transpose_k2_transpose(%{{.*}} = %[[R]])
// CHECK-NEXT:      graph.transpose
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[N:.*]] = schedule.kernel @reshape_transpose_k3_neg(%{{.*}} = %[[T]])
// CHECK:         func.return %[[N]]
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
// and an all-reduce; exp(x - m) feeds both the sum and the division, so it is a kernel
// output and the sum does not take it as a prologue.
// CHECK-LABEL: func.func @split_softmax
// CHECK-NEXT:    %[[M:.*]] = schedule.kernel @split_softmax_k0_max
// CHECK:         %[[H1:.*]] = schedule.start all_reduce %[[M]] {axes = [tp], kind = max}
// CHECK-NEXT:    %[[GM:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @split_softmax_k1_sub(%{{.*}} = %x, %{{.*}} = %[[GM]])
// CHECK-NEXT:      graph.sub
// CHECK-NEXT:      graph.exp
// CHECK-NEXT:      schedule.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[S:.*]] = schedule.kernel @split_softmax_k2_sum(%{{.*}} = %[[E]])
// CHECK:         %[[H2:.*]] = schedule.start all_reduce %[[S]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[GS:.*]] = schedule.wait %[[H2]]
// CHECK-NEXT:    %[[O:.*]] = schedule.kernel @split_softmax_k3_div(%{{.*}} = %[[E]], %{{.*}} = %[[GS]])
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
