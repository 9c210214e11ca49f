// RUN: not tessera-opt %s -t triton 2>&1 | filecheck %s

// Found by the fuzzer (benchmarks/fuzz_opt.py): a tile kernel using a value before its
// definition reached the Triton emitter, which failed with a KeyError. The module's
// verification now rejects it first.
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// CHECK:     emit-triton-use-before-def.mlir:[[# @LINE + 4]]:3: error: arith.addf: operand #0 (%late) is used before its definition (defined at line [[# @LINE + 5]])
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<16xi32>
  %v = tile.load %x[%r] : !tile.ptr<f32>, tensor<16xi32> -> tensor<16xf32>
  %s = arith.addf %late, %v : tensor<16xf32>
  %late = arith.mulf %v, %v : tensor<16xf32>
  tile.store %x[%r], %s : !tile.ptr<f32>, tensor<16xi32>, tensor<16xf32>
  tile.return
}
