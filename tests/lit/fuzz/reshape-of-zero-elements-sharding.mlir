// RUN: tessera-opt %s -p shard-propagate,insert-collectives 2>&1 | filecheck %s

// Found by the fuzzer (5,000 inputs, seed 25): reshape's sharding rule grouped dims into
// runs of equal product, which never closes when a dim is 0 (tensor<0x3> to tensor<3x0>),
// and indexed past the shape (IndexError in insert-collectives). A reshape of no elements
// keeps every dim whole; the mesh's other values still partition.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK-LABEL: func.func @reshape_of_nothing
// CHECK:       graph.reshape %{{.*}} : tensor<0x3xf16> -> tensor<3x0xf16>
graph.mesh @mesh axes = [tp = 2]
func.func @reshape_of_nothing(%e: tensor<0x3xf16>, %x: tensor<4x8xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> (tensor<3x0xf16>, tensor<32xf32>) {
  %0 = graph.reshape %e : tensor<0x3xf16> -> tensor<3x0xf16>
  %1 = graph.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  func.return %0, %1 : tensor<3x0xf16>, tensor<32xf32>
}
