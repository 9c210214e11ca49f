// RUN: not tessera-opt %s -p lower-graph-to-schedule 2>&1 | filecheck %s

// Found by the fuzzer: a function holding schedule ops besides graph ops made
// lower-graph-to-schedule erase graph ops whose results the schedule ops still used
// (ValueError). The pass lowers functions of graph ops only and says so at the op.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     lower-graph-to-schedule-mixed-function.mlir:[[# @LINE + 4]]:3: error: lower-graph-to-schedule: @mixed: expected only graph ops and func.return in a function to rewrite, found schedule.microbatch
graph.mesh @mesh axes = [dp = 2]
func.func @mixed(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.neg %x : tensor<4xf32>
  %r = schedule.microbatch {index = 0, count = 1} -> tensor<4xf32> {
    %z = graph.add %x, %y : tensor<4xf32>
    schedule.yield %z : tensor<4xf32>
  }
  func.return %r : tensor<4xf32>
}
