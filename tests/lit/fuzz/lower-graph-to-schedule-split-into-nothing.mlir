// RUN: tessera-opt %s -p lower-graph-to-schedule | filecheck %s

// Found by the fuzzer: a graph.split into no pieces (valid: a dim of size 0 split into
// nothing) became a schedule.kernel without results, which does not verify. The op
// computes nothing, so it is dropped.
// CHECK-LABEL: func.func @split_into_nothing(%e: tensor<4x0xf32>, %x: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NEXT:    %{{.*}} = schedule.kernel @split_into_nothing_k0_neg(
// CHECK-NOT:     graph.split
// CHECK-NOT:     schedule.kernel
// CHECK:         func.return
func.func @split_into_nothing(%e: tensor<4x0xf32>, %x: tensor<4xf32>) -> tensor<4xf32> {
  graph.split %e {axis = 1} : tensor<4x0xf32> -> ()
  %y = graph.neg %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
