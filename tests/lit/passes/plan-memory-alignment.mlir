// RUN: tessera-opt %s -p 'lower-graph-to-schedule,plan-memory{alignment=16}' | filecheck %s

// The alignment option: with 16-byte alignment the three 16-byte buffers pack tightly.
// CHECK-LABEL: func.func @small
// CHECK-SAME:    schedule.arg_offsets = array<i64: 0>, schedule.peak_bytes = 48 : i64
// CHECK:         schedule.kernel @small_k0_exp({{.*}}) attributes {schedule.offsets = array<i64: 16>}
// CHECK:         schedule.kernel @small_k1_transpose({{.*}}) attributes {schedule.offsets = array<i64: 32>}
func.func @small(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.exp %x : tensor<4xf32>
  %b = graph.transpose %a {perm = [0]} : tensor<4xf32> -> tensor<4xf32>
  func.return %b : tensor<4xf32>
}
