// RUN: not tessera-opt %s --split-input-file 2>&1 | filecheck %s
// RUN: not tessera-opt %s --split-input-file -p canonicalize 2>&1 | filecheck %s

// Found by the fuzzer: an integer property that does not fit in 64 bits raised a
// ValueError while building the attribute ("internal error while reading the IR"). It
// is an error at the op's line.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     property-out-of-range.mlir:[[# @LINE + 2]]:3: error: invalid value: Integer value 99999999999999999999 is out of range for type i64
func.func @f(%x: tensor<4x8xf32>) -> tensor<4xf32> {
  %0 = graph.sum %x {axes = [99999999999999999999], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  func.return %0 : tensor<4xf32>
}
