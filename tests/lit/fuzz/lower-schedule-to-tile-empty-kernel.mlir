// RUN: not tessera-opt %s -p lower-schedule-to-tile 2>&1 | filecheck %s

// Issue 18's example: a schedule.kernel with an empty body (no results) made
// lower-schedule-to-tile fail with an IndexError. The kernel's verifier rejects it.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     lower-schedule-to-tile-empty-kernel.mlir:[[# @LINE + 3]]:3: error: schedule.kernel @k: expected at least one result (a kernel without results computes nothing)
graph.mesh @mesh axes = [dp = 2]
func.func @f(%x: tensor<4xf32>) {
  schedule.kernel @k() : () -> () {
    schedule.yield
  }
  func.return
}
