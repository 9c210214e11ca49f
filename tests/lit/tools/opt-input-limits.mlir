// RUN: not tessera-opt %s 2>&1 | filecheck %s
// RUN: printf 'func.func @f() {\n  func.return\n}\n\377\n' > %t.mlir && not tessera-opt %t.mlir 2>&1 | filecheck %s --check-prefix=UTF8

// Input the parser cannot hold is a one-line error, not a Python traceback: a tensor
// too large to build, and bytes that are not UTF-8.
// CHECK-NOT: Traceback
// CHECK:     tessera-opt: error: a size or number in the input is too large to handle
// UTF8-NOT:  Traceback
// UTF8:      tessera-opt: error: the input is not UTF-8 text: byte 0xff at offset 33
func.func @huge() {
  %0 = graph.constant dense<1.0> : tensor<99999999999xf32>
  func.return
}
