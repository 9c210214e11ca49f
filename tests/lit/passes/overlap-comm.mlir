// RUN: tessera-opt %s --split-input-file -p overlap-comm | filecheck %s
// RUN: tessera-opt %s --split-input-file -p overlap-comm | tessera-opt --split-input-file | filecheck %s

// The wait moves down past independent kernels to the kernel that uses its result.
// CHECK-LABEL: func.func @wait_sinks_to_first_use
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]]
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @k1
// CHECK:         %[[T:.*]] = schedule.kernel @k2
// CHECK:         %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    %[[O:.*]] = schedule.kernel @k3(%{{.*}} = %[[R]], %{{.*}} = %[[T]])
graph.mesh @mesh axes = [tp = 4]
func.func @wait_sinks_to_first_use(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>, %u: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x, %b = %w) : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.matmul %a, %b : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %t = schedule.kernel @k2(%a = %e) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.tanh %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %o = schedule.kernel @k3(%a = %r, %b = %t) : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.add %a, %b : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// A start placed late moves up to just after the kernel that makes its operand.
// CHECK-LABEL: func.func @start_hoists_to_producer
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]]
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @k1
// CHECK:         %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    schedule.kernel @k2
graph.mesh @mesh axes = [tp = 4]
func.func @start_hoists_to_producer(%x: tensor<8x32xf32>, %u: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %o = schedule.kernel @k2(%a = %r, %b = %e) : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.add %a, %b : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// A collective of a function argument starts first thing.
// CHECK-LABEL: func.func @argument_starts_first
// CHECK-NEXT:    %[[H:.*]] = schedule.start all_gather %x {axes = [tp], dim = 0}
// CHECK-NEXT:    schedule.kernel @k0
// CHECK:         schedule.wait %[[H]]
// CHECK-NEXT:    schedule.kernel @k1
graph.mesh @mesh axes = [tp = 4]
func.func @argument_starts_first(%x: tensor<2x32xf32>, %u: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %e = schedule.kernel @k0(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start all_gather %x {axes = [tp], dim = 0} : tensor<2x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %g = schedule.wait %h : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %o = schedule.kernel @k1(%a = %g, %b = %e) : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.add %a, %b : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// Two starts after the same kernel keep their order (the stream runs them in order).
// CHECK-LABEL: func.func @starts_keep_their_order
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0
// CHECK:         %[[H1:.*]] = schedule.start all_reduce %[[Y]] {axes = [tp], kind = sum}
// CHECK-NEXT:    %[[H2:.*]] = schedule.start all_reduce %[[Y]] {axes = [dp], kind = sum}
// CHECK-NEXT:    schedule.kernel @k1
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @starts_keep_their_order(%x: tensor<8x32xf32>, %u: tensor<8x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>) {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h1 = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %h2 = schedule.start all_reduce %y {axes = [dp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r2 = schedule.wait %h2 : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  func.return %r1, %r2, %e : tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>
}

// -----

// A result only returned is waited for just before the return.
// CHECK-LABEL: func.func @returned_waits_at_the_end
// CHECK:         schedule.start all_reduce
// CHECK-NEXT:    schedule.kernel @k1
// CHECK:         %[[R:.*]] = schedule.wait
// CHECK-NEXT:    func.return %[[R]]
graph.mesh @mesh axes = [tp = 4]
func.func @returned_waits_at_the_end(%x: tensor<8x32xf32>, %u: tensor<8x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xf32>) {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %r, %e : tensor<8x32xf32>, tensor<8x32xf32>
}

// -----

// Chained collectives: the second starts on the first's result, so the first's wait
// stays just before it; the second's wait moves past the independent kernel.
// CHECK-LABEL: func.func @chained_collectives
// CHECK:         %[[H1:.*]] = schedule.start reduce_scatter
// CHECK-NEXT:    %[[W1:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    %[[H2:.*]] = schedule.start all_gather %[[W1]]
// CHECK-NEXT:    schedule.kernel @k1
// CHECK:         schedule.wait %[[H2]]
// CHECK-NEXT:    schedule.kernel @k2
graph.mesh @mesh axes = [tp = 4]
func.func @chained_collectives(%x: tensor<8x32xf32>, %u: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h1 = schedule.start reduce_scatter %y {axes = [tp], dim = 0, kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<2x32xf32>>
  %w1 = schedule.wait %h1 : !schedule.handle<tensor<2x32xf32>> -> tensor<2x32xf32>
  %h2 = schedule.start all_gather %w1 {axes = [tp], dim = 0} : tensor<2x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %w2 = schedule.wait %h2 : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %o = schedule.kernel @k2(%a = %w2, %b = %e) : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.add %a, %b : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// A send's wait gives nothing: it moves to the end of the function.
// CHECK-LABEL: func.func @send_waits_at_the_end
// CHECK:         %[[H:.*]] = schedule.start send
// CHECK-NEXT:    schedule.kernel @k1
// CHECK:         schedule.wait %[[H]]
// CHECK-NEXT:    func.return
graph.mesh @mesh axes = [pp = 2]
func.func @send_waits_at_the_end(%x: tensor<8x32xf32>, %u: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start send %y {axes = [pp], offset = 1} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  schedule.wait %h : !schedule.handle<tensor<8x32xf32>>
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %e : tensor<8x32xf32>
}

// -----

// Already overlapped as far as the data allow: nothing moves.
// CHECK-LABEL: func.func @nothing_to_move
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]]
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    schedule.kernel @k1(%{{.*}} = %[[R]])
graph.mesh @mesh axes = [tp = 4]
func.func @nothing_to_move(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %o = schedule.kernel @k1(%a = %r) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.tanh %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// Data-parallel gradients: each all-reduce starts as its gradient is made (last layer
// first), and every wait moves to the optimizer kernel that reads it, so the transfers
// run under the remaining backward kernels.
// CHECK-LABEL: func.func @gradients_overlap_backward
// CHECK-NEXT:    %[[G2:.*]] = schedule.kernel @grad_layer2
// CHECK:         %[[H2:.*]] = schedule.start all_reduce %[[G2]] {axes = [dp], kind = sum}
// CHECK-NEXT:    %[[G1:.*]] = schedule.kernel @grad_layer1
// CHECK:         %[[H1:.*]] = schedule.start all_reduce %[[G1]] {axes = [dp], kind = sum}
// CHECK-NEXT:    %[[G0:.*]] = schedule.kernel @grad_layer0
// CHECK:         %[[H0:.*]] = schedule.start all_reduce %[[G0]] {axes = [dp], kind = sum}
// CHECK-NEXT:    %[[R2:.*]] = schedule.wait %[[H2]]
// CHECK-NEXT:    schedule.kernel @update2(%{{.*}} = %[[R2]])
// CHECK:         %[[R1:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    schedule.kernel @update1(%{{.*}} = %[[R1]])
// CHECK:         %[[R0:.*]] = schedule.wait %[[H0]]
// CHECK-NEXT:    schedule.kernel @update0(%{{.*}} = %[[R0]])
graph.mesh @mesh axes = [dp = 4]
func.func @gradients_overlap_backward(%x: tensor<16x16xf32>) -> (tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>) {
  %g2 = schedule.kernel @grad_layer2(%a = %x) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.matmul %a, %a : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %g1 = schedule.kernel @grad_layer1(%a = %g2) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.matmul %a, %a : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %g0 = schedule.kernel @grad_layer0(%a = %g1) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.matmul %a, %a : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %h2 = schedule.start all_reduce %g2 {axes = [dp], kind = sum} : tensor<16x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r2 = schedule.wait %h2 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %u2 = schedule.kernel @update2(%a = %r2) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.neg %a : tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %h1 = schedule.start all_reduce %g1 {axes = [dp], kind = sum} : tensor<16x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %u1 = schedule.kernel @update1(%a = %r1) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.neg %a : tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %h0 = schedule.start all_reduce %g0 {axes = [dp], kind = sum} : tensor<16x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %u0 = schedule.kernel @update0(%a = %r0) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.neg %a : tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  func.return %u2, %u1, %u0 : tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
}

// -----

// A function without collectives is unchanged.
// CHECK-LABEL: func.func @no_collectives
// CHECK-NEXT:    schedule.kernel @k0
// CHECK:         schedule.kernel @k1
// CHECK:         func.return
func.func @no_collectives(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %o = schedule.kernel @k1(%a = %y) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.tanh %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// A recv has no operand to follow: it stays where it is, and its wait sinks to its use
// (found by the fuzzer: the pass failed with an IndexError on it).
// CHECK-LABEL: func.func @recv_stays
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0
// CHECK:         %[[H:.*]] = schedule.start recv {axes = [pp], offset = -1}
// CHECK-NEXT:    %[[R:.*]] = schedule.wait %[[H]]
// CHECK-NEXT:    %[[O:.*]] = schedule.kernel @k1(%{{.*}} = %[[R]])
graph.mesh @mesh axes = [pp = 2]
func.func @recv_stays(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %y = schedule.kernel @k0(%a = %x) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.neg %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %h = schedule.start recv {axes = [pp], offset = -1} : !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %o = schedule.kernel @k1(%a = %r) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  func.return %y, %o : tensor<8xf32>, tensor<8xf32>
}

// -----

// A relay (a permute of a block another permute brought, as a ring passes k/v blocks on)
// starts one step ahead only: just before the kernel that computes with the block, not
// right after the block arrives, so the ring holds two blocks at a time, not all. The
// first permute (of an argument) still starts at the top.
// CHECK-LABEL: func.func @relay_one_step_ahead
// CHECK-NEXT:    %[[H0:.*]] = schedule.start collective_permute %x
// CHECK-NEXT:    %[[K0:.*]] = schedule.kernel @k0(%{{.*}} = %x)
// CHECK:         %[[B1:.*]] = schedule.wait %[[H0]]
// CHECK-NEXT:    %[[H1:.*]] = schedule.start collective_permute %[[B1]]
// CHECK-NEXT:    %[[K1:.*]] = schedule.kernel @k1(%{{.*}} = %[[B1]])
// CHECK:         %[[B2:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    %[[H2:.*]] = schedule.start collective_permute %[[B2]]
// CHECK-NEXT:    %[[K2:.*]] = schedule.kernel @k2(%{{.*}} = %[[B2]])
// CHECK:         %[[B3:.*]] = schedule.wait %[[H2]]
// CHECK-NEXT:    %[[K3:.*]] = schedule.kernel @k3(%{{.*}} = %[[B3]])
graph.mesh @mesh axes = [cp = 4]
func.func @relay_one_step_ahead(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %h0 = schedule.start collective_permute %x {axes = [cp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %b1 = schedule.wait %h0 : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %h1 = schedule.start collective_permute %b1 {axes = [cp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %b2 = schedule.wait %h1 : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %h2 = schedule.start collective_permute %b2 {axes = [cp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %b3 = schedule.wait %h2 : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %o0 = schedule.kernel @k0(%a = %x) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %o1 = schedule.kernel @k1(%a = %b1) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %o2 = schedule.kernel @k2(%a = %b2) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %o3 = schedule.kernel @k3(%a = %b3) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  func.return %o0, %o1, %o2, %o3 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// A wait marked schedule.user_wait (per-rank code called h.wait() there) stays: the
// start still hoists to its operand, but the wait does not sink past the independent
// kernel k2 to its first use.
// CHECK-LABEL: func.func @user_wait_stays
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0
// CHECK:         %[[H:.*]] = schedule.start all_reduce %[[Y]]
// CHECK-NEXT:    %[[E:.*]] = schedule.kernel @k1
// CHECK:         %[[R:.*]] = schedule.wait %[[H]] attributes {schedule.user_wait}
// CHECK-NEXT:    %[[T:.*]] = schedule.kernel @k2
// CHECK:         schedule.kernel @k3(%{{.*}} = %[[R]], %{{.*}} = %[[T]])
graph.mesh @mesh axes = [tp = 4]
func.func @user_wait_stays(%x: tensor<8x16xf32>, %w: tensor<16x32xf32>, %u: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %y = schedule.kernel @k0(%a = %x, %b = %w) : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.matmul %a, %b : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %e = schedule.kernel @k1(%a = %u) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %h = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x32xf32> -> !schedule.handle<tensor<8x32xf32>>
  %r = schedule.wait %h attributes {schedule.user_wait} : !schedule.handle<tensor<8x32xf32>> -> tensor<8x32xf32>
  %t = schedule.kernel @k2(%a = %e) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.tanh %a : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  %o = schedule.kernel @k3(%a = %r, %b = %t) : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32> {
    %0 = graph.add %a, %b : tensor<8x32xf32>
    schedule.yield %0 : tensor<8x32xf32>
  }
  func.return %o : tensor<8x32xf32>
}

// -----

// A relay's start moved past its own user wait (the block arrives before its wait, as
// lower-graph-to-schedule leaves a ring's waits) cannot keep the user's point: the wait
// follows the start, unmarked, and sinks to its first use like any other.
// CHECK-LABEL: func.func @relay_moves_past_a_user_wait
// CHECK-NEXT:    %[[H0:.*]] = schedule.start collective_permute %x
// CHECK-NEXT:    %[[K0:.*]] = schedule.kernel @k0(%{{.*}} = %x)
// CHECK:         %[[B1:.*]] = schedule.wait %[[H0]]
// CHECK-NEXT:    %[[H1:.*]] = schedule.start collective_permute %[[B1]]
// CHECK-NEXT:    %[[K1:.*]] = schedule.kernel @k1(%{{.*}} = %[[B1]])
// CHECK:         %[[B2:.*]] = schedule.wait %[[H1]] :
// CHECK-NEXT:    %[[H2:.*]] = schedule.start collective_permute %[[B2]]
graph.mesh @mesh axes = [cp = 4]
func.func @relay_moves_past_a_user_wait(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %h0 = schedule.start collective_permute %x {axes = [cp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %b1 = schedule.wait %h0 : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %h1 = schedule.start collective_permute %b1 {axes = [cp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %b2 = schedule.wait %h1 attributes {schedule.user_wait} : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %h2 = schedule.start collective_permute %b2 {axes = [cp], pairs = [[0, 1], [1, 2], [2, 3], [3, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %b3 = schedule.wait %h2 : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  %o0 = schedule.kernel @k0(%a = %x) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %o1 = schedule.kernel @k1(%a = %b1) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %o2 = schedule.kernel @k2(%a = %b2) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  %o3 = schedule.kernel @k3(%a = %b3) : (tensor<8xf32>) -> tensor<8xf32> {
    %0 = graph.exp %a : tensor<8xf32>
    schedule.yield %0 : tensor<8xf32>
  }
  func.return %o0, %o1, %o2, %o3 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// All-gathers are prefetched one ahead: each starts at the first reader of the one read
// before it, not all at the function's start (ZeRO-3's parameters, FSDP's prefetch); a
// gather only the return reads (a result) is not held back.
// CHECK-LABEL: func.func @one_gather_ahead
// CHECK-NEXT:    %[[H0:.*]] = schedule.start all_gather %w0
// CHECK-NEXT:    %[[HR:.*]] = schedule.start all_gather %w3
// CHECK-NEXT:    %[[H1:.*]] = schedule.start all_gather %w1
// CHECK-NEXT:    %[[R0:.*]] = schedule.wait %[[H0]]
// CHECK-NEXT:    %[[Y0:.*]] = schedule.kernel @k0(%{{.*}} = %x, %{{.*}} = %[[R0]])
// CHECK:         %[[H2:.*]] = schedule.start all_gather %w2
// CHECK-NEXT:    %[[R1:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    %[[Y1:.*]] = schedule.kernel @k1(%{{.*}} = %[[Y0]], %{{.*}} = %[[R1]])
// CHECK:         %[[R2:.*]] = schedule.wait %[[H2]]
// CHECK-NEXT:    %[[Y2:.*]] = schedule.kernel @k2(%{{.*}} = %[[Y1]], %{{.*}} = %[[R2]])
// CHECK:         %[[RR:.*]] = schedule.wait %[[HR]]
// CHECK-NEXT:    func.return %[[Y2]], %[[RR]]
graph.mesh @mesh axes = [dp = 4]
func.func @one_gather_ahead(%x: tensor<8x16xf32>, %w0: tensor<4x16xf32>, %w1: tensor<4x16xf32>, %w2: tensor<4x16xf32>, %w3: tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<16x16xf32>) {
  %h0 = schedule.start all_gather %w0 {axes = [dp], dim = 0} : tensor<4x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %h1 = schedule.start all_gather %w1 {axes = [dp], dim = 0} : tensor<4x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %h2 = schedule.start all_gather %w2 {axes = [dp], dim = 0} : tensor<4x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r2 = schedule.wait %h2 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %h3 = schedule.start all_gather %w3 {axes = [dp], dim = 0} : tensor<4x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r3 = schedule.wait %h3 : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  %y0 = schedule.kernel @k0(%a = %x, %b = %r0) : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32> {
    %0 = graph.matmul %a, %b : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    schedule.yield %0 : tensor<8x16xf32>
  }
  %y1 = schedule.kernel @k1(%a = %y0, %b = %r1) : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32> {
    %0 = graph.matmul %a, %b : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    schedule.yield %0 : tensor<8x16xf32>
  }
  %y2 = schedule.kernel @k2(%a = %y1, %b = %r2) : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32> {
    %0 = graph.matmul %a, %b : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    schedule.yield %0 : tensor<8x16xf32>
  }
  func.return %y2, %r3 : tensor<8x16xf32>, tensor<16x16xf32>
}

// -----

// A reduce-scatter is waited for where the next one starts (its operand, a whole
// gradient, is freed then), not where the optimizer reads the shards.
// CHECK-LABEL: func.func @one_scatter_in_flight
// CHECK:         %[[G0:.*]] = schedule.kernel @k0
// CHECK:         %[[H0:.*]] = schedule.start reduce_scatter %[[G0]]
// CHECK-NEXT:    %[[G1:.*]] = schedule.kernel @k1
// CHECK:         %[[S0:.*]] = schedule.wait %[[H0]]
// CHECK-NEXT:    %[[H1:.*]] = schedule.start reduce_scatter %[[G1]]
// CHECK-NEXT:    %[[S1:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    func.return %[[S0]], %[[S1]]
graph.mesh @mesh axes = [dp = 4]
func.func @one_scatter_in_flight(%x: tensor<16x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %g0 = schedule.kernel @k0(%a = %x) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.exp %a : tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %g1 = schedule.kernel @k1(%a = %g0) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.tanh %a : tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %h0 = schedule.start reduce_scatter %g0 {axes = [dp], kind = sum, dim = 0} : tensor<16x16xf32> -> !schedule.handle<tensor<4x16xf32>>
  %s0 = schedule.wait %h0 : !schedule.handle<tensor<4x16xf32>> -> tensor<4x16xf32>
  %h1 = schedule.start reduce_scatter %g1 {axes = [dp], kind = sum, dim = 0} : tensor<16x16xf32> -> !schedule.handle<tensor<4x16xf32>>
  %s1 = schedule.wait %h1 : !schedule.handle<tensor<4x16xf32>> -> tensor<4x16xf32>
  func.return %s0, %s1 : tensor<4x16xf32>, tensor<4x16xf32>
}

// -----

// A bucket of gathers (bucket-gradients' pack, gather, split) is prefetched while the
// previous layer computes: its first reader is looked for through the moves that unpack
// it, and the gather moves up with the move that packs it (the pack reads arguments).
// CHECK-LABEL: func.func @gather_moves_up_with_its_pack
// CHECK:         %[[P0:.*]] = schedule.kernel @pack0
// CHECK:         %[[H0:.*]] = schedule.start all_gather %[[P0]]
// CHECK-NEXT:    %[[G0:.*]] = schedule.wait %[[H0]]
// CHECK-NEXT:    schedule.kernel @unpack0
// CHECK:         %[[P1:.*]] = schedule.kernel @pack1
// CHECK:         %[[H1:.*]] = schedule.start all_gather %[[P1]]
// CHECK-NEXT:    schedule.kernel @layer0
// CHECK:         %[[G1:.*]] = schedule.wait %[[H1]]
// CHECK-NEXT:    schedule.kernel @unpack1
// CHECK:         schedule.kernel @layer1
graph.mesh @mesh axes = [dp = 2]
func.func @gather_moves_up_with_its_pack(%x: tensor<8x16xf32>, %a0: tensor<8x16xf32>, %b0: tensor<8x16xf32>, %a1: tensor<8x16xf32>, %b1: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %p0 = schedule.kernel @pack0(%a = %a0, %b = %b0) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<1x256xf32> {
    %0 = graph.reshape %a : tensor<8x16xf32> -> tensor<1x128xf32>
    %1 = graph.reshape %b : tensor<8x16xf32> -> tensor<1x128xf32>
    %2 = graph.concat %0, %1 {axis = 1} : tensor<1x128xf32>, tensor<1x128xf32> -> tensor<1x256xf32>
    schedule.yield %2 : tensor<1x256xf32>
  }
  %h0 = schedule.start all_gather %p0 {axes = [dp], dim = 0} : tensor<1x256xf32> -> !schedule.handle<tensor<2x256xf32>>
  %g0 = schedule.wait %h0 : !schedule.handle<tensor<2x256xf32>> -> tensor<2x256xf32>
  %u0, %v0 = schedule.kernel @unpack0(%g = %g0) : (tensor<2x256xf32>) -> (tensor<2x128xf32>, tensor<2x128xf32>) {
    %0, %1 = graph.split %g {axis = 1} : tensor<2x256xf32> -> (tensor<2x128xf32>, tensor<2x128xf32>)
    schedule.yield %0, %1 : tensor<2x128xf32>, tensor<2x128xf32>
  }
  %y0 = schedule.kernel @layer0(%h = %x, %u = %u0, %v = %v0) : (tensor<8x16xf32>, tensor<2x128xf32>, tensor<2x128xf32>) -> tensor<8x16xf32> {
    %0 = graph.reshape %u : tensor<2x128xf32> -> tensor<16x16xf32>
    %1 = graph.reshape %v : tensor<2x128xf32> -> tensor<16x16xf32>
    %2 = graph.matmul %h, %0 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    %3 = graph.matmul %2, %1 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    schedule.yield %3 : tensor<8x16xf32>
  }
  %p1 = schedule.kernel @pack1(%a = %a1, %b = %b1) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<1x256xf32> {
    %0 = graph.reshape %a : tensor<8x16xf32> -> tensor<1x128xf32>
    %1 = graph.reshape %b : tensor<8x16xf32> -> tensor<1x128xf32>
    %2 = graph.concat %0, %1 {axis = 1} : tensor<1x128xf32>, tensor<1x128xf32> -> tensor<1x256xf32>
    schedule.yield %2 : tensor<1x256xf32>
  }
  %h1 = schedule.start all_gather %p1 {axes = [dp], dim = 0} : tensor<1x256xf32> -> !schedule.handle<tensor<2x256xf32>>
  %g1 = schedule.wait %h1 : !schedule.handle<tensor<2x256xf32>> -> tensor<2x256xf32>
  %u1, %v1 = schedule.kernel @unpack1(%g = %g1) : (tensor<2x256xf32>) -> (tensor<2x128xf32>, tensor<2x128xf32>) {
    %0, %1 = graph.split %g {axis = 1} : tensor<2x256xf32> -> (tensor<2x128xf32>, tensor<2x128xf32>)
    schedule.yield %0, %1 : tensor<2x128xf32>, tensor<2x128xf32>
  }
  %y1 = schedule.kernel @layer1(%h = %y0, %u = %u1, %v = %v1) : (tensor<8x16xf32>, tensor<2x128xf32>, tensor<2x128xf32>) -> tensor<8x16xf32> {
    %0 = graph.reshape %u : tensor<2x128xf32> -> tensor<16x16xf32>
    %1 = graph.reshape %v : tensor<2x128xf32> -> tensor<16x16xf32>
    %2 = graph.matmul %h, %0 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    %3 = graph.matmul %2, %1 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    schedule.yield %3 : tensor<8x16xf32>
  }
  func.return %y1 : tensor<8x16xf32>
}
