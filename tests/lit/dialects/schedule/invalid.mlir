// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// One case per verifier message of the schedule dialect.

// --- kernels --------------------------------------------------------------------------

// Block arguments must have the inputs' types.
func.func @kernel_arg_types(%x: tensor<4xf32>) {
  // CHECK: schedule.kernel @k: block argument types mismatch: expected (tensor<4xf32>) (the inputs), found (tensor<4xf16>){{$}}
  "schedule.kernel"(%x) <{sym_name = "k"}> ({
  ^bb0(%a: tensor<4xf16>):
    "schedule.yield"() : () -> ()
  }) : (tensor<4xf32>) -> ()
  func.return
}

// -----

// A kernel is isolated from above: every value comes in as an input.
func.func @kernel_uses_outside_value(%x: tensor<4xf32>) {
  // CHECK: schedule.kernel @k: graph.neg uses a value defined outside the kernel; pass it in as a kernel input{{$}}
  schedule.kernel @k() : () -> () {
    %0 = graph.neg %x : tensor<4xf32>
    schedule.yield
  }
  func.return
}

// -----

// The yield gives the kernel's result types.
func.func @kernel_yield_types(%x: tensor<4xf32>) {
  // CHECK: schedule.kernel @k: yield types mismatch: expected (tensor<4xf32>), found (){{$}}
  %0 = schedule.kernel @k(%a = %x) : (tensor<4xf32>) -> tensor<4xf32> {
    schedule.yield
  }
  func.return
}

// -----

// The body ends in schedule.yield (xDSL's single-block check sees it first).
func.func @kernel_without_yield(%x: tensor<4xf32>) {
  // CHECK: Operation graph.neg terminates block in single-block region but is not a terminator{{$}}
  schedule.kernel @k(%a = %x) : (tensor<4xf32>) -> () {
    %0 = graph.neg %a : tensor<4xf32>
  }
  func.return
}

// -----

// Kernel names are unique within a function.
func.func @kernel_names_clash(%x: tensor<4xf32>) {
  // CHECK: schedule.kernel @k: expected a unique kernel name, found 2 kernels named so{{$}}
  schedule.kernel @k() : () -> () {
    schedule.yield
  }
  schedule.kernel @k() : () -> () {
    schedule.yield
  }
  func.return
}

// -----

// A kernel has results: its ops are pure, so without results it computes nothing (an
// empty kernel crashed lower-schedule-to-tile).
func.func @kernel_without_results(%x: tensor<4xf32>) {
  // CHECK: schedule.kernel @k: expected at least one result (a kernel without results computes nothing){{$}}
  schedule.kernel @k(%a = %x) : (tensor<4xf32>) -> () {
    %0 = graph.neg %a : tensor<4xf32>
    schedule.yield
  }
  func.return
}

// -----

// Streams are compute or comm.
func.func @kernel_bad_stream() {
  // CHECK: schedule.kernel: stream must be one of ('compute', 'comm'), found 'copy'{{$}}
  schedule.kernel @k() {stream = copy} : () -> () {
    schedule.yield
  }
  func.return
}

// -----

// schedule.yield only ends a kernel, microbatch or stage.
func.func @yield_outside() {
  // CHECK: 'schedule.yield' expects parent op to be one of 'schedule.kernel', 'schedule.microbatch', 'schedule.stage'{{$}}
  schedule.yield
}

// --- collectives ------------------------------------------------------------------------

// -----

graph.mesh @mesh axes = [tp = 4]
// The collective must be one the schedule knows.
func.func @unknown_collective(%x: tensor<8xf32>) {
  // CHECK: schedule.start: collective must be one of ('all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all', 'broadcast', 'collective_permute', 'send', 'recv'), found 'all_slice'{{$}}
  %h = schedule.start all_slice %x {axes = [tp], dim = 0} : tensor<8xf32> -> !schedule.handle<tensor<2xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<2xf32>> -> tensor<2xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// A collective's properties are those of its graph op.
func.func @missing_property(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: expected properties ['axes', 'kind'], found ['axes']{{$}}
  %h = schedule.start all_reduce %x {axes = [tp]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// recv takes no operand.
func.func @recv_with_operand(%x: tensor<8xf32>) {
  // CHECK: schedule.start recv: expected 0 operands, found 1{{$}}
  %h = schedule.start recv %x {axes = [tp], offset = 1} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// Mesh axes must be the mesh's.
func.func @unknown_axis(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: unknown mesh axes ['dp']; the mesh has ['tp']{{$}}
  %h = schedule.start all_reduce %x {axes = [dp], kind = sum} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

// A start needs the module's mesh.
func.func @no_mesh(%x: tensor<8xf32>) {
  // CHECK: schedule.start: expected exactly one graph.mesh in the module, found 0{{$}}
  %h = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// The handle type is the graph op's per-rank result: all_gather over 4 ranks grows dim 0.
func.func @handle_type_mismatch(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_gather: handle type mismatch: expected !schedule.handle<tensor<32xf32>>, found !schedule.handle<tensor<8xf32>>{{$}}
  %h = schedule.start all_gather %x {axes = [tp], dim = 0} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// The graph op's shape rule reports bad properties.
func.func @bad_reduce_kind(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: reduction kind must be one of ('sum', 'mean', 'max', 'min', 'prod'), found 'xor'{{$}}
  %h = schedule.start all_reduce %x {axes = [tp], kind = xor} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
// A peer lies along one mesh axis.
func.func @send_two_axes(%x: tensor<8xf32>) {
  // CHECK: schedule.start send: expected one mesh axis for the peer, found ['dp', 'tp']{{$}}
  %h = schedule.start send %x {axes = [dp, tp], offset = 1} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  schedule.wait %h : !schedule.handle<tensor<8xf32>>
  func.return
}

// -----

graph.mesh @mesh axes = [pp = 2]
// A peer offset is nonzero and within the axis.
func.func @send_bad_offset(%x: tensor<8xf32>) {
  // CHECK: schedule.start send: expected a peer offset with 0 < |offset| < 2 (the axis size), found 2{{$}}
  %h = schedule.start send %x {axes = [pp], offset = 2} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  schedule.wait %h : !schedule.handle<tensor<8xf32>>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// Every handle is waited for exactly once.
func.func @never_waited(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: expected exactly one schedule.wait of the handle, found 0{{$}}
  %h = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// A wait gives the handle's type.
func.func @wait_type_mismatch(%x: tensor<8xf32>) {
  // CHECK: schedule.wait: result types mismatch: expected (tensor<8xf32>), found (tensor<8xf16>){{$}}
  %h = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf16>
  func.return
}

// -----

graph.mesh @mesh axes = [pp = 2]
// The wait of a send gives nothing.
func.func @send_wait_with_result(%x: tensor<8xf32>) {
  // CHECK: schedule.wait: result types mismatch: expected (), found (tensor<8xf32>){{$}}
  %h = schedule.start send %x {axes = [pp], offset = 1} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [tp = 4]
// A start's stream is compute or comm.
func.func @start_bad_stream(%x: tensor<8xf32>) {
  // CHECK: schedule.start: stream must be one of ('compute', 'comm'), found 'nccl'{{$}}
  %h = schedule.start all_reduce %x {axes = [tp], kind = sum, stream = nccl} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
// An algorithm is one the cost model knows.
func.func @start_unknown_algorithm(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: algorithm must be one of ('ring', 'tree', 'hierarchical', 'nvls'), found 'butterfly'{{$}}
  %h = schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = butterfly} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
// A hierarchical domain divides the group and is neither 1 nor the whole group.
func.func @start_domain_not_dividing(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: expected a domain that divides the group size 8 with 2 <= domain < 8, found 3{{$}}
  %h = schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = hierarchical, domain = 3} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @start_domain_whole_group(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: expected a domain that divides the group size 4 with 2 <= domain < 4, found 4{{$}}
  %h = schedule.start all_reduce %x {axes = [tp], kind = sum, algorithm = hierarchical, domain = 4} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
// hierarchical needs a domain; a domain needs hierarchical.
func.func @start_hierarchical_without_domain(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: algorithm hierarchical needs a domain{{$}}
  %h = schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = hierarchical} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @start_domain_without_hierarchical(%x: tensor<8xf32>) {
  // CHECK: schedule.start all_reduce: a domain needs algorithm = hierarchical, found ring{{$}}
  %h = schedule.start all_reduce %x {axes = [dp, tp], kind = sum, algorithm = ring, domain = 2} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
// Only all_reduce, all_gather and reduce_scatter run hierarchically.
func.func @start_hierarchical_broadcast(%x: tensor<8xf32>) {
  // CHECK: schedule.start broadcast: algorithm hierarchical applies only to ('all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all'){{$}}
  %h = schedule.start broadcast %x {axes = [dp, tp], src = 0, algorithm = hierarchical, domain = 2} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// --- buffers ------------------------------------------------------------------------------

// -----

// Buffer sizes are positive.
func.func @empty_buffer() {
// CHECK: !schedule.buffer: expected a positive size in bytes of at most 281474976710656 (2**48, what can be addressed), found 0{{$}}
  %b = schedule.alloc : !schedule.buffer<0>
  func.return
}

// -----

// Offsets are non-negative.
func.func @negative_offset() {
  // CHECK: schedule.alloc: expected a non-negative offset, found -256{{$}}
  %b = schedule.alloc {offset = -256} : !schedule.buffer<64>
  func.return
}

// -----

// A buffer is freed at most once.
func.func @double_free() {
  // CHECK: schedule.alloc: expected the buffer to be freed at most once, found 2 frees{{$}}
  %b = schedule.alloc : !schedule.buffer<64>
  schedule.free %b : !schedule.buffer<64>
  schedule.free %b : !schedule.buffer<64>
  func.return
}

// -----

// Only allocated buffers are freed.
func.func @free_argument(%b: !schedule.buffer<64>) {
  // CHECK: schedule.free: expected a buffer made by schedule.alloc, found a block argument{{$}}
  schedule.free %b : !schedule.buffer<64>
  func.return
}

// --- regions -------------------------------------------------------------------------------

// -----

// index lies in [0, count).
func.func @microbatch_index() {
  // CHECK: schedule.microbatch: expected 0 <= index < count, found index 4 and count 4{{$}}
  schedule.microbatch {index = 4, count = 4} {
    schedule.yield
  }
  func.return
}

// -----

// A stage's yield gives its results.
func.func @stage_yield(%x: tensor<4xf32>) {
  // CHECK: schedule.stage: yield types mismatch: expected (tensor<4xf32>), found (){{$}}
  %0 = schedule.stage {index = 0, count = 2} -> tensor<4xf32> {
    schedule.yield
  }
  func.return
}

// -----

// Region bodies take no arguments.
func.func @stage_with_arguments() {
  // CHECK: schedule.stage: expected a body without arguments, found 1{{$}}
  "schedule.stage"() <{index = 0 : i64, count = 2 : i64}> ({
  ^bb0(%a: tensor<4xf32>):
    "schedule.yield"() : () -> ()
  }) : () -> ()
  func.return
}

// --- pipeline schedules ----------------------------------------------------------------------

// -----

// An action's kind is one of tessera.pipeline.actions.ACTION_KINDS.
func.func @action_unknown_kind() {
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      // CHECK: schedule.action: kind must be one of ('forward', 'backward', 'backward_input', 'backward_weight', 'send_activation', 'recv_activation', 'send_grad', 'recv_grad'), found 'fwd'{{$}}
      schedule.action fwd {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// A computation names no peer; a transfer does.
func.func @action_computation_with_peer() {
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      // CHECK: schedule.action forward: expected no peer (a computation has none), found 1{{$}}
      schedule.action forward {microbatch = 0, stage = 0, peer = 1}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

func.func @action_transfer_without_peer() {
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      // CHECK: schedule.action send_activation: expected a peer stage (a transfer names its peer){{$}}
      schedule.action send_activation {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// Microbatches and stages are non-negative.
func.func @action_negative_microbatch() {
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      // CHECK: schedule.action forward: expected a non-negative microbatch, found -1{{$}}
      schedule.action forward {microbatch = -1, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// Actions live in a pipeline_rank, pipeline_ranks in a pipeline.
func.func @action_outside_rank() {
  // CHECK: 'schedule.action' expects parent op 'schedule.pipeline_rank'{{$}}
  schedule.action forward {microbatch = 0, stage = 0}
  func.return
}

// -----

func.func @rank_outside_pipeline() {
  // CHECK: 'schedule.pipeline_rank' expects parent op 'schedule.pipeline'{{$}}
  schedule.pipeline_rank {index = 0} {
    schedule.action forward {microbatch = 0, stage = 0}
  }
  func.return
}

// -----

// A pipeline_rank holds only actions.
func.func @rank_holds_other_op() {
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    // CHECK: schedule.pipeline_rank 0: expected only schedule.action ops, found schedule.microbatch{{$}}
    schedule.pipeline_rank {index = 0} {
      schedule.microbatch {index = 0, count = 1} {
        schedule.yield
      }
    }
  }
  func.return
}

// -----

// ranks, microbatches and virtual are at least 1.
func.func @pipeline_no_ranks() {
  // CHECK: schedule.pipeline: expected ranks >= 1, found 0{{$}}
  schedule.pipeline {kind = gpipe, ranks = 0, microbatches = 1, virtual = 1} {
  }
  func.return
}

// -----

// One pipeline_rank per rank, in rank order.
func.func @pipeline_missing_rank() {
  // CHECK: schedule.pipeline: expected 2 schedule.pipeline_rank ops (one per rank), found 1{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

func.func @pipeline_ranks_out_of_order() {
  // CHECK: schedule.pipeline: expected the ranks in order, found index 1 at position 0{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 1} {
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
    }
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// Microbatches and stages lie within the pipeline's counts.
func.func @pipeline_microbatch_out_of_range() {
  // CHECK: schedule.pipeline: rank 0: forward(mb=1, stage=0): expected 0 <= microbatch < 1, found 1{{$}}
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 1, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

func.func @pipeline_stage_out_of_range() {
  // CHECK: schedule.pipeline: rank 0: backward(mb=0, stage=2): expected 0 <= stage < 2 (ranks * virtual), found 2{{$}}
  schedule.pipeline {kind = interleaved, ranks = 1, microbatches = 1, virtual = 2} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 2}
    }
  }
  func.return
}

// -----

// Stage s runs on rank s % ranks.
func.func @pipeline_wrong_rank() {
  // CHECK: schedule.pipeline: rank 1: forward(mb=0, stage=0): stage 0 runs on rank 0{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action forward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// Transfers go between adjacent stages, within the pipeline.
func.func @pipeline_peer_not_adjacent() {
  // CHECK: schedule.pipeline: rank 1: send_grad(mb=0, stage=1->2): expected peer 0 (stage - 1), found 2{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
      schedule.action send_grad {microbatch = 0, stage = 1, peer = 2}
    }
  }
  func.return
}

// -----

func.func @pipeline_peer_past_the_end() {
  // CHECK: schedule.pipeline: rank 1: send_activation(mb=0, stage=1->2): expected 0 <= peer < 2, found 2{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action send_activation {microbatch = 0, stage = 1, peer = 2}
      schedule.action backward {microbatch = 0, stage = 1}
    }
  }
  func.return
}

// -----

// Each action happens once.
func.func @pipeline_duplicated_forward() {
  // CHECK: schedule.pipeline: rank 0: forward(mb=0, stage=0): duplicated (also at position 0 of this rank){{$}}
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// Every send has its receive on the peer stage's rank, and every receive its send.
func.func @pipeline_send_without_recv() {
  // CHECK: schedule.pipeline: rank 0: send_activation(mb=0, stage=0->1): no matching recv_activation(mb=0, stage=1->0) on rank 1{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
      schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
      schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
    }
  }
  func.return
}

// -----

func.func @pipeline_recv_without_send() {
  // CHECK: schedule.pipeline: rank 0: recv_grad(mb=0, stage=0->1): no matching send_grad(mb=0, stage=1->0) on rank 1{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
      schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
    }
  }
  func.return
}

// -----

// Every (microbatch, stage) runs one forward and one backward, whole or split in two.
func.func @pipeline_missing_forward() {
  // CHECK: schedule.pipeline: rank 0: microbatch 1, stage 0: expected a forward, found none{{$}}
  schedule.pipeline {kind = gpipe, ranks = 1, microbatches = 2, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 1, stage = 0}
    }
  }
  func.return
}

// -----

func.func @pipeline_half_a_backward() {
  // CHECK: schedule.pipeline: rank 0: microbatch 0, stage 0: expected a backward or a backward_input and a backward_weight, found backward_input{{$}}
  schedule.pipeline {kind = "zb-h1", ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward_input {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

func.func @pipeline_two_backwards() {
  // CHECK: schedule.pipeline: rank 0: microbatch 0, stage 0: expected a backward or a backward_input and a backward_weight, found backward and backward_input and backward_weight{{$}}
  schedule.pipeline {kind = "zb-h1", ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
      schedule.action backward_input {microbatch = 0, stage = 0}
      schedule.action backward_weight {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

// A stage receives from its neighbours on other ranks what it needs.
func.func @pipeline_no_transfers() {
  // CHECK: schedule.pipeline: rank 0: microbatch 0, stage 0: expected a recv_grad from stage 1 (rank 1), found none{{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
    }
  }
  func.return
}

// -----

// On its rank, a receive comes before the computation that needs it, a send after the
// one that makes it, a backward after its forward.
func.func @pipeline_send_before_forward() {
  // CHECK: schedule.pipeline: rank 0: send_activation(mb=0, stage=0->1): expected after forward(mb=0, stage=0){{$}}
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
      schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
    }
  }
  func.return
}

// -----

func.func @pipeline_weight_before_input_gradient() {
  // CHECK: schedule.pipeline: rank 0: backward_weight(mb=0, stage=0): expected after backward_input(mb=0, stage=0){{$}}
  schedule.pipeline {kind = "zb-h1", ranks = 1, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action backward_weight {microbatch = 0, stage = 0}
      schedule.action backward_input {microbatch = 0, stage = 0}
    }
  }
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
// A collective_permute's pairs are checked as the graph op's are.
func.func @start_permute_two_targets(%x: tensor<8xf32>) {
  // CHECK: schedule.start collective_permute: rank position 1 is the target of more than one pair{{$}}
  %h = schedule.start collective_permute %x {axes = [tp], pairs = [[0, 1], [3, 1]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @start_permute_out_of_group(%x: tensor<8xf32>) {
  // CHECK: schedule.start collective_permute: source position 8 of pair [8, 0] is out of range (the group over ['dp', 'tp'] has 8 ranks){{$}}
  %h = schedule.start collective_permute %x {axes = [dp, tp], pairs = [[8, 0]]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}

// -----

graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @start_permute_without_pairs(%x: tensor<8xf32>) {
  // CHECK: schedule.start collective_permute: expected properties ['axes', 'pairs'], found ['axes']{{$}}
  %h = schedule.start collective_permute %x {axes = [tp]} : tensor<8xf32> -> !schedule.handle<tensor<8xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<8xf32>> -> tensor<8xf32>
  func.return
}
