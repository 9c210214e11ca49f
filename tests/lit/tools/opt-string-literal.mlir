// RUN: not tessera-opt %s 2>&1 | filecheck %s

// An unterminated string literal is an error at once (xDSL's pattern backtracked
// exponentially: 26 characters took seconds, these 80 would never finish).
// CHECK: opt-string-literal.mlir:[[# @LINE + 2]]:28: error: End of file reached before closing string literal.
func.func @f() {
  %0 = graph.constant {a = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
}
