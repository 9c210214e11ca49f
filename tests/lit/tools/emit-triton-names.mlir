// RUN: not tessera-opt %s -t triton 2>&1 | filecheck %s

// A kernel's name becomes the Triton function's name: a name that is not a plain
// identifier (here one carrying Python code) is refused, never written into the source.
// CHECK-NOT: {{^}}import os
// CHECK:     emit-triton-names.mlir:[[# @LINE + 1]]:1: error: emit-triton: kernel name 'k(): pass\nimport os; os.system("true")\ndef x' is not a valid function name
tile.kernel @"k(): pass\nimport os; os.system(\"true\")\ndef x"() grid [1, 1, 1] warps 4 stages 1 {
  tile.return
}
