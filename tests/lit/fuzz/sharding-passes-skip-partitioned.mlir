// RUN: tessera-opt %s --split-input-file --verify-diagnostics -p shard-propagate,insert-collectives,shard-partition | filecheck %s
// RUN: not tessera-opt %s --split-input-file -p shard-propagate,insert-collectives,shard-partition 2>&1 | filecheck %s --check-prefix=MIXED

// Found by the fuzzer: shard-propagate and insert-collectives rewrote a function that
// was already partitioned (per-rank types) as if its types were global, and the IR
// they made did not verify. The sharding passes work on global functions only.
// CHECK-LABEL: func.func @gather_two_users(%x: tensor<4x16xf32>, %w: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x16xf32>) attributes {graph.partitioned} {
// CHECK-NEXT:    %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<4x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT:    %y = graph.matmul %g, %w : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
// CHECK-NEXT:    func.return %y, %g : tensor<16x8xf32>, tensor<16x16xf32>
graph.mesh @mesh axes = [dp = 2, tp = 4]
func.func @gather_two_users(%x: tensor<4x16xf32>, %w: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x16xf32>) attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<4x16xf32> -> tensor<16x16xf32>
  %y = graph.matmul %g, %w : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  func.return %y, %g : tensor<16x8xf32>, tensor<16x16xf32>
}

// -----

// Found by the fuzzer: shard-partition on a scheduled function (kernels and
// start/wait pairs, not marked partitioned) failed inside with "expected a ranked
// tensor type, found !schedule.handle<...>". The sharding passes leave a function
// without graph ops alone.
// CHECK-LABEL: func.func @scheduled(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
// CHECK-NEXT:    %g = schedule.kernel @k(%a = %x) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
// CHECK:         %h = schedule.start all_reduce %g {axes = [dp], kind = sum} : tensor<16x16xf32> -> !schedule.handle<tensor<16x16xf32>>
// CHECK-NEXT:    %r = schedule.wait %h : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
graph.mesh @mesh axes = [dp = 4]
func.func @scheduled(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %g = schedule.kernel @k(%a = %x) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.matmul %a, %a : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  %h = schedule.start all_reduce %g {axes = [dp], kind = sum} : tensor<16x16xf32> -> !schedule.handle<tensor<16x16xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<16x16xf32>> -> tensor<16x16xf32>
  func.return %r : tensor<16x16xf32>
}

// -----

// A function mixing graph ops with schedule ops is an error at the first schedule op.
// MIXED-NOT: Traceback
// MIXED:     sharding-passes-skip-partitioned.mlir:[[# @LINE + 4]]:3: error: shard-propagate: @mixed: expected only graph ops and func.return in a function to rewrite, found schedule.kernel
graph.mesh @mesh axes = [dp = 4]
func.func @mixed(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %n = graph.neg %x : tensor<16x16xf32>
  %g = schedule.kernel @k(%a = %n) : (tensor<16x16xf32>) -> tensor<16x16xf32> {
    %0 = graph.exp %a : tensor<16x16xf32>
    schedule.yield %0 : tensor<16x16xf32>
  }
  func.return %g : tensor<16x16xf32>
}
