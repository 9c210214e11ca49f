// RUN: not tessera-opt %s 2>&1 | filecheck %s

// Found by the fuzzer: a function's header moved into a kernel's body left %x, used by
// the kernel at the module's top level, an unresolved forward reference of xDSL's parser
// (the function's %x is defined in a region inside), on which the dominance check's
// message failed (AttributeError).
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     dominance-undefined-value.mlir:[[# @LINE + 1]]:1: error: schedule.kernel: operand #0 is never defined
%0 = schedule.kernel @view_k0_reshape(%a = %x) : (tensor<6x10xf32>) -> tensor<3x4x5xf32> {
  %1 = graph.reshape %a : tensor<6x10xf32> -> tensor<3x4x5xf32>
func.func @view(%x: tensor<6x10xf32>) -> tensor<3x4x5xf32> {
  schedule.yield %1 : tensor<3x4x5xf32>
}
%2 = schedule.kernel @view_k1_exp(%b = %0) : (tensor<3x4x5xf32>) -> tensor<3x4x5xf32> {
  %3 = graph.exp %b : tensor<3x4x5xf32> -> tensor<3x4x5xf32>
  schedule.yield %3 : tensor<3x4x5xf32>
}
func.return %2 : tensor<3x4x5xf32>
}
