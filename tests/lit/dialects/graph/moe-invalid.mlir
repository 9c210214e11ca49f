// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// The verifiers of graph.top_k and the mixture-of-experts ops: each says what it
// expected and what it found.

// k is at most the searched dim.
func.func @top_k_too_large(%x: tensor<4x3xf32>) {
  // CHECK: graph.top_k: k must be in [1, 3] (the last dim of tensor<4x3xf32>), found 4{{$}}
  %v, %i = graph.top_k %x {k = 4} : tensor<4x3xf32> -> (tensor<4x4xf32>, tensor<4x4xi32>)
  func.return
}

// -----

// The indices are i32.
func.func @top_k_index_type(%x: tensor<4x3xf32>) {
  // CHECK: graph.top_k: result 1 type mismatch: expected tensor<4x2xi32>, found tensor<4x2xi64>{{$}}
  %v, %i = graph.top_k %x {k = 2} : tensor<4x3xf32> -> (tensor<4x2xf32>, tensor<4x2xi64>)
  func.return
}

// -----

// Choices are integers [G, T, K].
func.func @route_float_choices(%c: tensor<2x6x2xf32>) {
  // CHECK: graph.moe_route: expected integer choices [G, T, K], found tensor<2x6x2xf32>{{$}}
  %s, %src = graph.moe_route %c {experts = 4, capacity = 3} : tensor<2x6x2xf32> -> (tensor<2x6x2xi32>, tensor<2x4x3xi32>)
  func.return
}

// -----

// The sources are [G, experts, capacity].
func.func @route_sources_shape(%c: tensor<2x6x2xi32>) {
  // CHECK: graph.moe_route: result 1 type mismatch: expected tensor<2x4x3xi32>, found tensor<2x4x4xi32>{{$}}
  %s, %src = graph.moe_route %c {experts = 4, capacity = 3} : tensor<2x6x2xi32> -> (tensor<2x6x2xi32>, tensor<2x4x4xi32>)
  func.return
}

// -----

// A capacity of at least one slot.
func.func @route_zero_capacity(%c: tensor<2x6x2xi32>) {
  // CHECK: graph.moe_route: experts and capacity must be >= 1, found 4 and 0{{$}}
  %s, %src = graph.moe_route %c {experts = 4, capacity = 0} : tensor<2x6x2xi32> -> (tensor<2x6x2xi32>, tensor<2x4x0xi32>)
  func.return
}

// -----

// Dispatched tokens match the slots' groups and tokens.
func.func @dispatch_token_count(%x: tensor<2x5x8xf32>, %s: tensor<2x6x2xi32>, %src: tensor<2x4x3xi32>) {
  // CHECK: graph.moe_dispatch: expected tokens [2, 6, H] or [2, 6, 2, H] like the slots tensor<2x6x2xi32>, found tensor<2x5x8xf32>{{$}}
  %d = graph.moe_dispatch %x, %s, %src : tensor<2x5x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x4x3x8xf32>
  func.return
}

// -----

// Slots are i32.
func.func @dispatch_slot_type(%x: tensor<2x6x8xf32>, %s: tensor<2x6x2xi64>, %src: tensor<2x4x3xi32>) {
  // CHECK: graph.moe_dispatch: expected i32 slots [G, T, K], found tensor<2x6x2xi64>{{$}}
  %d = graph.moe_dispatch %x, %s, %src : tensor<2x6x8xf32>, tensor<2x6x2xi64>, tensor<2x4x3xi32> -> tensor<2x4x3x8xf32>
  func.return
}

// -----

// Sources and slots share the groups.
func.func @combine_groups_differ(%y: tensor<2x4x3x8xf32>, %s: tensor<2x6x2xi32>, %src: tensor<3x4x3xi32>) {
  // CHECK: graph.moe_combine: expected i32 sources [G, E, C] with the slots' G, found tensor<3x4x3xi32> and tensor<2x6x2xi32>{{$}}
  %c = graph.moe_combine %y, %s, %src : tensor<2x4x3x8xf32>, tensor<2x6x2xi32>, tensor<3x4x3xi32> -> tensor<2x6x2x8xf32>
  func.return
}

// -----

// The experts' outputs are [G, E, C, H] like the sources.
func.func @combine_outputs_shape(%y: tensor<2x4x2x8xf32>, %s: tensor<2x6x2xi32>, %src: tensor<2x4x3xi32>) {
  // CHECK: graph.moe_combine: expected expert outputs [G, E, C, H] like the sources tensor<2x4x3xi32>, found tensor<2x4x2x8xf32>{{$}}
  %c = graph.moe_combine %y, %s, %src : tensor<2x4x2x8xf32>, tensor<2x6x2xi32>, tensor<2x4x3xi32> -> tensor<2x6x2x8xf32>
  func.return
}
