// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block=64}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block=64},lower-schedule-to-tile{block=64}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block=64}' -t triton | filecheck %s --check-prefix=TRITON

// Structurally identical kernels (same ops, wiring, shapes and attributes; names and
// positions differ, as the same kernel in two layers does) share one tile kernel: the
// first is lowered, the second names it in schedule.tile_kernel. A kernel with another
// shape gets its own. Running the pass twice adds nothing.
// CHECK-LABEL: func.func @layers
// CHECK:         schedule.kernel @layers_k0_exp(%{{.*}} = %x) : (tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK:         schedule.kernel @layers_k1_exp(%{{.*}} = %{{.*}}) attributes {schedule.tile_kernel = @layers_k0_exp} : (tensor<8x16xf32>) -> tensor<8x16xf32> {
// CHECK:         schedule.kernel @layers_k2_exp(%{{.*}} = %y) : (tensor<4x16xf32>) -> tensor<4x16xf32> {
// CHECK:       tile.kernel @layers_k0_exp(
// CHECK-NOT:   tile.kernel @layers_k1_exp(
// CHECK:       tile.kernel @layers_k2_exp(
// CHECK-NOT:   tile.kernel

// TRITON:     def layers_k0_exp(
// TRITON-NOT: def layers_k1_exp(
// TRITON:     def layers_k2_exp(

func.func @layers(%x: tensor<8x16xf32>, %y: tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<4x16xf32>) {
  %0 = schedule.kernel @layers_k0_exp(%a = %x) : (tensor<8x16xf32>) -> tensor<8x16xf32> {
    %1 = graph.exp %a : tensor<8x16xf32> -> tensor<8x16xf32>
    schedule.yield %1 : tensor<8x16xf32>
  }
  %2 = schedule.kernel @layers_k1_exp(%b = %0) : (tensor<8x16xf32>) -> tensor<8x16xf32> {
    %3 = graph.exp %b : tensor<8x16xf32> -> tensor<8x16xf32>
    schedule.yield %3 : tensor<8x16xf32>
  }
  %4 = schedule.kernel @layers_k2_exp(%c = %y) : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    %5 = graph.exp %c : tensor<4x16xf32> -> tensor<4x16xf32>
    schedule.yield %5 : tensor<4x16xf32>
  }
  func.return %2, %4 : tensor<8x16xf32>, tensor<4x16xf32>
}

// -----

// A kernel that only reshapes or slices a contiguous block runs as a torch view of its
// input: it gets no tile kernel (and no Triton source).
// CHECK-LABEL: func.func @view
// CHECK:         schedule.kernel @view_k0_reshape
// CHECK-NOT:   tile.kernel @view_k0_reshape
// CHECK:       tile.kernel @view_k1_exp

// TRITON-NOT: def view_k0_reshape(
// TRITON:     def view_k1_exp(

func.func @view(%x: tensor<6x10xf32>) -> tensor<3x4x5xf32> {
  %0 = schedule.kernel @view_k0_reshape(%a = %x) : (tensor<6x10xf32>) -> tensor<3x4x5xf32> {
    %1 = graph.reshape %a : tensor<6x10xf32> -> tensor<3x4x5xf32>
    schedule.yield %1 : tensor<3x4x5xf32>
  }
  %2 = schedule.kernel @view_k1_exp(%b = %0) : (tensor<3x4x5xf32>) -> tensor<3x4x5xf32> {
    %3 = graph.exp %b : tensor<3x4x5xf32> -> tensor<3x4x5xf32>
    schedule.yield %3 : tensor<3x4x5xf32>
  }
  func.return %2 : tensor<3x4x5xf32>
}
