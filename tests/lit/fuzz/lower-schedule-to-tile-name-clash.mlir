// RUN: tessera-opt %s -p lower-schedule-to-tile | filecheck %s
// RUN: tessera-opt %s -p lower-schedule-to-tile,lower-schedule-to-tile | filecheck %s
// RUN: tessera-opt %s -p lower-schedule-to-tile -t triton | filecheck %s --check-prefix=TRITON

// Found by the fuzzer: a tile kernel is named after its schedule.kernel, whose name is
// unique only within its function; a kernel named like a function (or like a kernel of
// another function) gave the module two symbols of one name, and the IR did not verify
// after the pass. Such a tile kernel gets a fresh name, which the schedule kernel names
// in schedule.tile_kernel (running the pass again adds nothing).
// CHECK-LABEL: func.func @k(
// CHECK:         schedule.kernel @k(%{{.*}} = %x) attributes {schedule.tile_kernel = @k_1}
// CHECK-LABEL: func.func @g(
// CHECK:         schedule.kernel @k(%{{.*}} = %x) attributes {schedule.tile_kernel = @k_2}
// CHECK:       tile.kernel @k_1(
// CHECK:       tile.kernel @k_2(
// CHECK-NOT:   tile.kernel
// TRITON:      def k_1(
// TRITON:      def k_2(
func.func @k(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %0 = schedule.kernel @k(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %1 = graph.exp %a : tensor<8x32xf32>
    schedule.yield %1 : tensor<8x32xf32>
  }
  func.return %0 : tensor<8x32xf32>
}
func.func @g(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %0 = schedule.kernel @k(%a = %x) : (tensor<8x32xf32>) -> tensor<8x32xf32> {
    %1 = graph.neg %a : tensor<8x32xf32>
    schedule.yield %1 : tensor<8x32xf32>
  }
  func.return %0 : tensor<8x32xf32>
}
