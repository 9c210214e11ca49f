// RUN: tessera-opt %s -p shard-propagate,insert-collectives,shard-partition | filecheck %s

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
