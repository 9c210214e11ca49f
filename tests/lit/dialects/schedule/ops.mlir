// RUN: tessera-opt %s | filecheck %s --enable-var-scope
// RUN: tessera-opt %s | tessera-opt | filecheck %s --enable-var-scope
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s --enable-var-scope

// Every op and type of the schedule dialect in its custom form; the second and third RUN
// lines re-parse the custom and the generic form. Op lines end in {{$}} so that a printer
// adding anything fails.

graph.mesh @mesh axes = [dp = 2, tp = 4]

// A kernel binds its block arguments to its inputs; stream is optional.
// CHECK-LABEL: func.func @kernels
// CHECK-SAME:  (%[[X:.*]]: tensor<8x64xf32>, %[[W:.*]]: tensor<64x64xf32>)
// CHECK-NEXT:    %[[Y:.*]] = schedule.kernel @k0_matmul(%[[A:.*]] = %[[X]], %[[B:.*]] = %[[W]]) : (tensor<8x64xf32>, tensor<64x64xf32>) -> tensor<8x64xf32> {{{$}}
// CHECK-NEXT:      %[[M:.*]] = graph.matmul %[[A]], %[[B]] : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>{{$}}
// CHECK-NEXT:      %[[G:.*]] = graph.gelu %[[M]] {approximate = tanh} : tensor<8x64xf32>{{$}}
// CHECK-NEXT:      schedule.yield %[[G]] : tensor<8x64xf32>{{$}}
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[Z0:.*]], %[[Z1:.*]] = schedule.kernel @k1_split(%[[C:.*]] = %[[Y]]) {stream = compute} : (tensor<8x64xf32>) -> (tensor<4x64xf32>, tensor<4x64xf32>) {{{$}}
// CHECK-NEXT:      %[[S0:.*]], %[[S1:.*]] = graph.split %[[C]] {axis = 0} : tensor<8x64xf32> -> (tensor<4x64xf32>, tensor<4x64xf32>){{$}}
// CHECK-NEXT:      schedule.yield %[[S0]], %[[S1]] : tensor<4x64xf32>, tensor<4x64xf32>{{$}}
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[Y]], %[[Z1]] : tensor<8x64xf32>, tensor<4x64xf32>
func.func @kernels(%x: tensor<8x64xf32>, %w: tensor<64x64xf32>) -> (tensor<8x64xf32>, tensor<4x64xf32>) {
  %y = schedule.kernel @k0_matmul(%a = %x, %b = %w) : (tensor<8x64xf32>, tensor<64x64xf32>) -> tensor<8x64xf32> {
    %0 = graph.matmul %a, %b : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
    %1 = graph.gelu %0 {approximate = tanh} : tensor<8x64xf32>
    schedule.yield %1 : tensor<8x64xf32>
  }
  %z:2 = schedule.kernel @k1_split(%c = %y) {stream = compute} : (tensor<8x64xf32>) -> (tensor<4x64xf32>, tensor<4x64xf32>) {
    %0:2 = graph.split %c {axis = 0} : tensor<8x64xf32> -> (tensor<4x64xf32>, tensor<4x64xf32>)
    schedule.yield %0#0, %0#1 : tensor<4x64xf32>, tensor<4x64xf32>
  }
  func.return %y, %z#1 : tensor<8x64xf32>, tensor<4x64xf32>
}

// Every collective as a start/wait pair, with per-rank types: all_gather grows dim 0 by
// tp = 4, reduce_scatter shrinks it; send's wait gives nothing, recv has no operand;
// collective_permute keeps the type.
// CHECK-LABEL: func.func @collectives
// CHECK-SAME:  (%[[X:.*]]: tensor<8x64xf32>)
// CHECK-NEXT:    %[[H0:.*]] = schedule.start all_reduce %[[X]] {axes = [tp], kind = sum} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %[[H1:.*]] = schedule.start all_gather %[[X]] {axes = [tp], dim = 0, stream = comm} : tensor<8x64xf32> -> !schedule.handle<tensor<32x64xf32>>{{$}}
// CHECK-NEXT:    %[[H2:.*]] = schedule.start reduce_scatter %[[X]] {axes = [tp], kind = sum, dim = 0} : tensor<8x64xf32> -> !schedule.handle<tensor<2x64xf32>>{{$}}
// CHECK-NEXT:    %[[H3:.*]] = schedule.start all_to_all %[[X]] {axes = [tp], split_dim = 1, concat_dim = 0} : tensor<8x64xf32> -> !schedule.handle<tensor<32x16xf32>>{{$}}
// CHECK-NEXT:    %[[H4:.*]] = schedule.start broadcast %[[X]] {axes = [dp, tp], src = 0} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %[[H5:.*]] = schedule.start send %[[X]] {axes = [dp], offset = 1} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %[[H6:.*]] = schedule.start recv {axes = [dp], offset = -1} : !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %[[H7:.*]] = schedule.start collective_permute %[[X]] {axes = [tp], pairs = {{\[\[}}0, 1], [1, 0], [2, 2]]} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H0]] : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H1]] : !schedule.handle<tensor<32x64xf32>> -> tensor<32x64xf32>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H2]] : !schedule.handle<tensor<2x64xf32>> -> tensor<2x64xf32>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H3]] : !schedule.handle<tensor<32x16xf32>> -> tensor<32x16xf32>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H4]] : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>{{$}}
// CHECK-NEXT:    schedule.wait %[[H5]] : !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H6]] : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>{{$}}
// CHECK-NEXT:    %{{.*}} = schedule.wait %[[H7]] : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>{{$}}
func.func @collectives(%x: tensor<8x64xf32>) attributes {graph.partitioned} {
  %h0 = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
  %h1 = schedule.start all_gather %x {axes = [tp], dim = 0, stream = comm} : tensor<8x64xf32> -> !schedule.handle<tensor<32x64xf32>>
  %h2 = schedule.start reduce_scatter %x {axes = [tp], dim = 0, kind = sum} : tensor<8x64xf32> -> !schedule.handle<tensor<2x64xf32>>
  %h3 = schedule.start all_to_all %x {axes = [tp], split_dim = 1, concat_dim = 0} : tensor<8x64xf32> -> !schedule.handle<tensor<32x16xf32>>
  %h4 = schedule.start broadcast %x {axes = [dp, tp], src = 0} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
  %h5 = schedule.start send %x {axes = [dp], offset = 1} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
  %h6 = schedule.start recv {axes = [dp], offset = -1} : !schedule.handle<tensor<8x64xf32>>
  %h7 = schedule.start collective_permute %x {axes = [tp], pairs = [[0, 1], [1, 0], [2, 2]]} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<32x64xf32>> -> tensor<32x64xf32>
  %r2 = schedule.wait %h2 : !schedule.handle<tensor<2x64xf32>> -> tensor<2x64xf32>
  %r3 = schedule.wait %h3 : !schedule.handle<tensor<32x16xf32>> -> tensor<32x16xf32>
  %r4 = schedule.wait %h4 : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
  schedule.wait %h5 : !schedule.handle<tensor<8x64xf32>>
  %r6 = schedule.wait %h6 : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
  %r7 = schedule.wait %h7 : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
  func.return
}

// Buffers: an offset once planned, none before.
// CHECK-LABEL: func.func @buffers
// CHECK-NEXT:    %[[B0:.*]] = schedule.alloc {offset = 256} : !schedule.buffer<2048>{{$}}
// CHECK-NEXT:    %[[B1:.*]] = schedule.alloc : !schedule.buffer<16>{{$}}
// CHECK-NEXT:    schedule.free %[[B0]] : !schedule.buffer<2048>{{$}}
// CHECK-NEXT:    schedule.free %[[B1]] : !schedule.buffer<16>{{$}}
func.func @buffers() {
  %b0 = schedule.alloc {offset = 256} : !schedule.buffer<2048>
  %b1 = schedule.alloc : !schedule.buffer<16>
  schedule.free %b0 : !schedule.buffer<2048>
  schedule.free %b1 : !schedule.buffer<16>
  func.return
}

// Microbatch and pipeline-stage regions, with and without results.
// CHECK-LABEL: func.func @regions
// CHECK-NEXT:    schedule.microbatch {index = 0, count = 4} {{{$}}
// CHECK-NEXT:      schedule.yield{{$}}
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[O:.*]] = schedule.stage {index = 1, count = 2} -> tensor<8xf32> {{{$}}
// CHECK-NEXT:      %[[M:.*]] = schedule.microbatch {index = 3, count = 4} -> tensor<8xf32> {{{$}}
// CHECK-NEXT:        %[[K:.*]] = schedule.kernel @k_neg(%[[A:.*]] = %{{.*}}) : (tensor<8xf32>) -> tensor<8xf32> {{{$}}
// CHECK-NEXT:          %[[N:.*]] = graph.neg %[[A]] : tensor<8xf32>{{$}}
// CHECK-NEXT:          schedule.yield %[[N]] : tensor<8xf32>{{$}}
// CHECK-NEXT:        }
// CHECK-NEXT:        schedule.yield %[[K]] : tensor<8xf32>{{$}}
// CHECK-NEXT:      }
// CHECK-NEXT:      schedule.yield %[[M]] : tensor<8xf32>{{$}}
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[O]] : tensor<8xf32>
func.func @regions(%x: tensor<8xf32>) -> tensor<8xf32> {
  schedule.microbatch {index = 0, count = 4} {
    schedule.yield
  }
  %o = schedule.stage {index = 1, count = 2} -> tensor<8xf32> {
    %m = schedule.microbatch {index = 3, count = 4} -> tensor<8xf32> {
      %k = schedule.kernel @k_neg(%a = %x) : (tensor<8xf32>) -> tensor<8xf32> {
        %n = graph.neg %a : tensor<8xf32>
        schedule.yield %n : tensor<8xf32>
      }
      schedule.yield %k : tensor<8xf32>
    }
    schedule.yield %m : tensor<8xf32>
  }
  func.return %o : tensor<8xf32>
}

// A start's algorithm (choose-collective-algorithms) and, for hierarchical, its domain
// print after the collective's properties and the stream.
// CHECK-LABEL: func.func @algorithms
// CHECK-NEXT:    %[[H0:.*]] = schedule.start all_reduce %[[X:.*]] {axes = [dp, tp], kind = mean, stream = comm, algorithm = hierarchical, domain = 4} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>{{$}}
// CHECK-NEXT:    %[[H1:.*]] = schedule.start all_gather %[[X]] {axes = [tp], dim = 0, algorithm = ring} : tensor<8x64xf32> -> !schedule.handle<tensor<32x64xf32>>{{$}}
func.func @algorithms(%x: tensor<8x64xf32>) -> (tensor<8x64xf32>, tensor<32x64xf32>) {
  %h0 = schedule.start all_reduce %x {axes = [dp, tp], domain = 4, algorithm = hierarchical, kind = mean, stream = comm} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
  %h1 = schedule.start all_gather %x {axes = [tp], dim = 0, algorithm = ring} : tensor<8x64xf32> -> !schedule.handle<tensor<32x64xf32>>
  %r0 = schedule.wait %h0 : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
  %r1 = schedule.wait %h1 : !schedule.handle<tensor<32x64xf32>> -> tensor<32x64xf32>
  func.return %r0, %r1 : tensor<8x64xf32>, tensor<32x64xf32>
}

// A pipeline schedule: one pipeline_rank per rank, each rank's actions in order.
// Transfers name their peer stage; kinds that are not identifiers print quoted. A
// (microbatch, stage) has either one backward or a backward_input and a backward_weight.
// CHECK-LABEL: func.func @pipeline
// CHECK-NEXT:    schedule.pipeline {kind = "1f1b", ranks = 2, microbatches = 1, virtual = 1} {{{$}}
// CHECK-NEXT:      schedule.pipeline_rank {index = 0} {{{$}}
// CHECK-NEXT:        schedule.action forward {microbatch = 0, stage = 0}{{$}}
// CHECK-NEXT:        schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}{{$}}
// CHECK-NEXT:        schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}{{$}}
// CHECK-NEXT:        schedule.action backward {microbatch = 0, stage = 0}{{$}}
// CHECK-NEXT:      }
// CHECK-NEXT:      schedule.pipeline_rank {index = 1} {{{$}}
// CHECK-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}{{$}}
// CHECK-NEXT:        schedule.action forward {microbatch = 0, stage = 1}{{$}}
// CHECK-NEXT:        schedule.action backward_input {microbatch = 0, stage = 1}{{$}}
// CHECK-NEXT:        schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}{{$}}
// CHECK-NEXT:        schedule.action backward_weight {microbatch = 0, stage = 1}{{$}}
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
func.func @pipeline() {
  schedule.pipeline {ranks = 2, kind = "1f1b", microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action send_activation {stage = 0, microbatch = 0, peer = 1}
      schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward_input {microbatch = 0, stage = 1}
      schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
      schedule.action backward_weight {microbatch = 0, stage = 1}
    }
  }
  func.return
}
