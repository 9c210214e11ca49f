// RUN: tessera-opt %s --split-input-file --verify-diagnostics -p lower-graph-to-schedule,plan-memory,lower-schedule-to-tile | filecheck %s
// RUN: not tessera-opt %s --split-input-file -p lower-graph-to-schedule,lower-schedule-to-tile 2>&1 | filecheck %s --check-prefix=LOCATED

// What a pass makes stays within what can be addressed (tessera/ir/limits.py): a kernel
// needing more programs than CUDA's grid allows, or an arena of more than 2**48 bytes,
// is the pass's error at the function, not IR that fails to verify after it ("internal
// error in pass ...").

// LOCATED-NOT: Traceback
// LOCATED-NOT: internal error
// LOCATED:     limits.mlir:[[# @LINE + 2]]:1: error: lower-schedule-to-tile: @many_programs_k0_exp needs a grid of [34359738368, 1, 1] programs, more than CUDA's limits [2147483647, 65535, 65535]; larger blocks need fewer programs
// CHECK:       lower-schedule-to-tile: @many_programs_k0_exp needs a grid of [34359738368, 1, 1] programs, more than CUDA's limits [2147483647, 65535, 65535]; larger blocks need fewer programs{{$}}
func.func @many_programs(%x: tensor<35184372088832xf32>) -> tensor<35184372088832xf32> {
  %y = graph.exp %x : tensor<35184372088832xf32>
  func.return %y : tensor<35184372088832xf32>
}

// -----

// CHECK: lower-schedule-to-tile: @large_batch_k0_matmul needs a grid of [1, 70000, 1] programs, more than CUDA's limits [2147483647, 65535, 65535]{{$}}
func.func @large_batch(%x: tensor<70000x16x16xf32>, %w: tensor<70000x16x16xf32>) -> tensor<70000x16x16xf32> {
  %y = graph.matmul %x, %w : tensor<70000x16x16xf32>, tensor<70000x16x16xf32> -> tensor<70000x16x16xf32>
  func.return %y : tensor<70000x16x16xf32>
}

// -----

// Each tensor holds 2**48 bytes: addressable alone, not together.
// CHECK: plan-memory: @large_arena needs an arena of 562949953421312 bytes, more than the 281474976710656 (2**48) that can be addressed{{$}}
func.func @large_arena(%x: tensor<70368744177664xf32>) -> tensor<70368744177664xf32> {
  %y = graph.exp %x : tensor<70368744177664xf32>
  %w = graph.neg %y : tensor<70368744177664xf32>
  %v = graph.add %w, %y : tensor<70368744177664xf32>
  func.return %v : tensor<70368744177664xf32>
}
