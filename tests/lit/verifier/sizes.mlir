// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s
// RUN: not tessera-opt %s --split-input-file 2>&1 | filecheck %s --check-prefix=LOCATED

// Sizes are bounded by what can be addressed (tessera/ir/limits.py): a tensor or buffer
// holds at most 2**48 bytes, a mesh at most 2**20 devices, a tile kernel's grid CUDA's
// limits. Beyond them the verifier says so, instead of an OverflowError or MemoryError
// later (a mesh of 99999999999 devices failed building its device list).

// LOCATED-NOT: Traceback
// LOCATED:     sizes.mlir:[[# @LINE + 3]]:1: error: func.func: block argument type: tensor<99999999999x99999999999xf32> holds 39999999999200000000004 bytes, more than the 281474976710656 (2**48) that can be addressed
// LOCATED-NOT: error
// CHECK: func.func: block argument type: tensor<99999999999x99999999999xf32> holds 39999999999200000000004 bytes, more than the 281474976710656 (2**48) that can be addressed{{$}}
func.func @huge_argument(%x: tensor<99999999999x99999999999xf32>) {
  func.return
}

// -----

// CHECK: graph.broadcast_to: result type: tensor<16777216x16777217xf32> holds 1125899973951488 bytes, more than the 281474976710656 (2**48) that can be addressed{{$}}
func.func @huge_result(%x: tensor<1x1xf32>) {
  %y = graph.broadcast_to %x : tensor<1x1xf32> -> tensor<16777216x16777217xf32>
  func.return
}

// -----

// 2**48 bytes exactly are fine.
// CHECK: func.func @largest(%x: tensor<70368744177664xf32>)
func.func @largest(%x: tensor<70368744177664xf32>) {
  func.return
}

// -----

// CHECK: !schedule.buffer: expected a positive size in bytes of at most 281474976710656 (2**48, what can be addressed), found 281474976710657{{$}}
func.func @huge_buffer() {
  %b = schedule.alloc : !schedule.buffer<281474976710657>
  func.return
}

// -----

// CHECK: schedule.alloc: the buffer ends at byte 281474976710912, beyond the 281474976710656 (2**48) that can be addressed{{$}}
func.func @offset_past_the_end() {
  %b = schedule.alloc {offset = 281474976710656} : !schedule.buffer<256>
  func.return
}

// -----

// CHECK: graph.mesh: 99999999999 devices are more than the 1048576 (2**20) a mesh may have{{$}}
graph.mesh @mesh axes = [dp = 99999999999]

// -----

// CHECK: graph.mesh: 1099511627776 devices are more than the 1048576 (2**20) a mesh may have{{$}}
graph.mesh @mesh axes = [dp = 1048576, tp = 1048576]

// -----

// CHECK: tile.kernel @k: expected at most [2147483647, 65535, 65535] programs (CUDA's grid limits), found [1, 65536, 1]{{$}}
tile.kernel @k(%n: i32) grid [1, 65536, 1] warps 4 stages 1 {
  tile.return
}
