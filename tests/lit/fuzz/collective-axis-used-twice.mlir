// RUN: not tessera-opt %s -p shard-propagate,insert-collectives,shard-partition 2>&1 | filecheck %s

// Found by the fuzzer (20,000 inputs, seed 2611): a reduce_scatter over tp of a value
// already split over tp gave a layout using tp on two dims, and insert-collectives made
// IR that did not verify (an internal error). It is an error at the collective.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     collective-axis-used-twice.mlir:[[# @LINE + 4]]:3: error: graph.reduce_scatter: its operand's layout [[], [tp, dp]] already uses mesh axes ['tp']
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @scatter_over_a_used_axis(%x: tensor<16x64xf32>) -> tensor<16x64xf32> {
  %c = graph.all_slice %x {axes = [tp, dp], dim = 1} : tensor<16x64xf32>
  %d = graph.reduce_scatter %c {axes = [tp], dim = 0, kind = mean} : tensor<16x64xf32>
  func.return %d : tensor<16x64xf32>
}
