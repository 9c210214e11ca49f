// RUN: tessera-opt %s --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file --print-op-generic | tessera-opt --split-input-file | filecheck %s

// graph.axis_index: this rank's position along mesh axes (major first), an i32 scalar of
// a partitioned function; it round-trips in the custom and the generic form.
graph.mesh @mesh axes = [dp = 2, tp = 4]
// CHECK-LABEL: func.func @offsets
// CHECK:         %[[TP:.*]] = graph.axis_index {axes = [tp]} : tensor<i32>
// CHECK:         %[[BOTH:.*]] = graph.axis_index {axes = [dp, tp]} : tensor<i32>
// CHECK:         graph.add %[[TP]], %[[BOTH]] : tensor<i32>
func.func @offsets() -> tensor<i32> attributes {graph.partitioned} {
  %a = graph.axis_index {axes = [tp]} : tensor<i32>
  %b = graph.axis_index {axes = [dp, tp]} : tensor<i32>
  %c = graph.add %a, %b : tensor<i32>
  func.return %c : tensor<i32>
}
