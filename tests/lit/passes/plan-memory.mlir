// RUN: tessera-opt %s --split-input-file -p lower-graph-to-schedule,overlap-comm,plan-memory | filecheck %s
// RUN: tessera-opt %s --split-input-file -p lower-graph-to-schedule,overlap-comm,plan-memory | tessera-opt --split-input-file | filecheck %s

// Buffer offsets (aligned to 256 bytes) and the per-rank peak. Every tensor here is
// 8x64xf32 = 2048 bytes, unless the comment says otherwise.

// Arguments stay resident; %d and %e reuse the slots of %a and %b once they are dead,
// so the peak is four buffers (x, a, b, c), not six. Every tensor here is 8x8xf32 = 256
// bytes (matmuls: one kernel each).
// CHECK-LABEL: func.func @reuse
// CHECK-SAME:    attributes {schedule.arg_offsets = array<i64: 0>, schedule.peak_bytes = 1024 : i64}
// CHECK:         schedule.kernel @reuse_k0_matmul({{.*}}) attributes {schedule.offsets = array<i64: 256>}
// CHECK:         schedule.kernel @reuse_k1_matmul({{.*}}) attributes {schedule.offsets = array<i64: 512>}
// CHECK:         schedule.kernel @reuse_k2_matmul({{.*}}) attributes {schedule.offsets = array<i64: 768>}
// CHECK:         schedule.kernel @reuse_k3_matmul({{.*}}) attributes {schedule.offsets = array<i64: 256>}
// CHECK:         schedule.kernel @reuse_k4_matmul({{.*}}) attributes {schedule.offsets = array<i64: 512>}
func.func @reuse(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %a = graph.matmul %x, %x : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %b = graph.matmul %a, %x : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %c = graph.matmul %a, %a : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %d = graph.matmul %b, %c : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %e = graph.matmul %d, %d : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  func.return %e : tensor<8x8xf32>
}

// -----

// A collective's operand stays live until its wait, even though no kernel reads it after
// the start, nor by the wait's own result: x (512 B) at 0, w (4096 B) at 512, %y at
// 4608, %z (512 B) at 6656, and the all-reduced value at 7168, not over %y.
// CHECK-LABEL: func.func @in_flight
// CHECK-SAME:    schedule.arg_offsets = array<i64: 0, 512>, schedule.peak_bytes = 9216 : i64
// CHECK:         schedule.kernel @in_flight_k0_matmul({{.*}}) attributes {schedule.offsets = array<i64: 4608>}
// CHECK:         schedule.start all_reduce
// CHECK:         schedule.kernel @in_flight_k1_exp({{.*}}) attributes {schedule.offsets = array<i64: 6656>}
// CHECK:         schedule.wait {{.*}} attributes {schedule.offsets = array<i64: 7168>}
graph.mesh @mesh axes = [tp = 4]
func.func @in_flight(%x: tensor<8x16xf32>, %w: tensor<16x64xf32>) -> (tensor<8x64xf32>, tensor<8x16xf32>) attributes {graph.partitioned} {
  %y = graph.matmul %x, %w : tensor<8x16xf32>, tensor<16x64xf32> -> tensor<8x64xf32>
  %r = graph.all_reduce %y {axes = [tp], kind = sum} : tensor<8x64xf32>
  %z = graph.exp %x : tensor<8x16xf32>
  func.return %r, %z : tensor<8x64xf32>, tensor<8x16xf32>
}

// -----

// A returned value lives to the end: %a keeps its slot although no kernel reads it after
// %c's, while %d reuses the slot of the dead %b. Peak: x, a, b, c (8x8xf32, 256 bytes).
// CHECK-LABEL: func.func @returned
// CHECK-SAME:    schedule.peak_bytes = 1024 : i64
// CHECK:         schedule.kernel @returned_k0_matmul({{.*}}) attributes {schedule.offsets = array<i64: 256>}
// CHECK:         schedule.kernel @returned_k1_matmul({{.*}}) attributes {schedule.offsets = array<i64: 512>}
// CHECK:         schedule.kernel @returned_k2_matmul({{.*}}) attributes {schedule.offsets = array<i64: 768>}
// CHECK:         schedule.kernel @returned_k3_matmul({{.*}}) attributes {schedule.offsets = array<i64: 512>}
func.func @returned(%x: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>) {
  %a = graph.matmul %x, %x : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %b = graph.matmul %a, %x : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %c = graph.matmul %b, %a : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %d = graph.matmul %c, %x : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  func.return %a, %d : tensor<8x8xf32>, tensor<8x8xf32>
}

// -----

// Small buffers (16 bytes) are padded to the default 256-byte alignment.
// CHECK-LABEL: func.func @small
// CHECK-SAME:    schedule.arg_offsets = array<i64: 0>, schedule.peak_bytes = 768 : i64
// CHECK:         schedule.kernel @small_k0_exp({{.*}}) attributes {schedule.offsets = array<i64: 256>}
// CHECK:         schedule.kernel @small_k1_transpose({{.*}}) attributes {schedule.offsets = array<i64: 512>}
func.func @small(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = graph.exp %x : tensor<4xf32>
  %b = graph.transpose %a {perm = [0]} : tensor<4xf32> -> tensor<4xf32>
  func.return %b : tensor<4xf32>
}
