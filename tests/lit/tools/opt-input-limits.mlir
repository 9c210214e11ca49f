// RUN: not tessera-opt %s 2>&1 | filecheck %s
// RUN: printf 'func.func @f() {\n  func.return\n}\n\377\n' > %t.mlir && not tessera-opt %t.mlir 2>&1 | filecheck %s --check-prefix=UTF8
// RUN: %python -c "print('func.func @f() {\n  %%0 = graph.constant ' + '[' * 3000)" > %t.deep.mlir && not tessera-opt %t.deep.mlir 2>&1 | filecheck %s --check-prefix=DEEP

// Input the parser cannot hold is an error at its line, not a Python traceback: a
// tensor too large to build, nesting deeper than the parser's stack, and bytes that are
// not UTF-8 (at its line and column, without the line: it cannot be shown).
// CHECK-NOT: Traceback
// CHECK:     opt-input-limits.mlir:[[# @LINE + 6]]:3: error: a size or number here is too large to represent
// UTF8-NOT:  Traceback
// UTF8:      .mlir:4:1: error: the input is not UTF-8 text: byte 0xff
// DEEP-NOT:  Traceback
// DEEP:      deep.mlir:2:{{[0-9]+}}: error: the input nests too deeply to parse
func.func @huge() {
  %0 = graph.constant dense<1.0> : tensor<99999999999xf32>
  func.return
}
