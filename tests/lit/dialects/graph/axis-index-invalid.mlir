// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// graph.axis_index exists only in a partitioned function, names known, distinct mesh
// axes, and is an i32 scalar.

graph.mesh @mesh axes = [tp = 4]
func.func @global_view() -> tensor<i32> {
  %a = graph.axis_index {axes = [tp]} : tensor<i32>
  func.return %a : tensor<i32>
}
// CHECK: graph.axis_index: a rank's position exists only in a partitioned (per-rank) function; this one has no graph.partitioned attribute

// -----

graph.mesh @mesh axes = [tp = 4]
func.func @unknown_axis() -> tensor<i32> attributes {graph.partitioned} {
  %a = graph.axis_index {axes = [pp]} : tensor<i32>
  func.return %a : tensor<i32>
}
// CHECK: graph.axis_index: unknown mesh axes ['pp']; the mesh has ['tp']

// -----

graph.mesh @mesh axes = [tp = 4]
func.func @repeated_axes() -> tensor<i32> attributes {graph.partitioned} {
  %a = graph.axis_index {axes = [tp, tp]} : tensor<i32>
  func.return %a : tensor<i32>
}
// CHECK: graph.axis_index: mesh axes must be distinct, found ['tp', 'tp']

// -----

graph.mesh @mesh axes = [tp = 4]
func.func @wrong_type() -> tensor<i64> attributes {graph.partitioned} {
  %a = graph.axis_index {axes = [tp]} : tensor<i64>
  func.return %a : tensor<i64>
}
// CHECK: graph.axis_index: result 0 type mismatch: expected tensor<i32>, found tensor<i64>

// -----

func.func @no_mesh() -> tensor<i32> attributes {graph.partitioned} {
  %a = graph.axis_index {axes = [tp]} : tensor<i32>
  func.return %a : tensor<i32>
}
// CHECK: graph.axis_index: a partitioned function needs exactly one graph.mesh
