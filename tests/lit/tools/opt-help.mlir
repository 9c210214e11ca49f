// `tessera-opt --help` lists Tessera's passes, each with its summary.
// RUN: tessera-opt --help | filecheck %s

// CHECK:      Tessera passes
// CHECK-DAG:    canonicalize {{.+}}
// CHECK-DAG:    cse {{.+}}
// CHECK-DAG:    dce {{.+}}

// Only the targets that work on Tessera's modules are offered; --version names Tessera.
// RUN: tessera-opt --help | filecheck %s --check-prefix=TARGETS
// TARGETS: Available targets are:
// TARGETS-NEXT: mlir,triton
// RUN: echo 'func.func @f() { func.return }' | not tessera-opt -t llvm 2>&1 | filecheck %s --check-prefix=LLVM
// LLVM-NOT: Traceback
// LLVM: tessera-opt: error: argument -t/--target: invalid choice: 'llvm' (choose from mlir, triton)
// RUN: tessera-opt --version | filecheck %s --check-prefix=VERSION
// VERSION: tessera-opt from Tessera {{[0-9]+\.[0-9]+\.[0-9]+}} (xDSL {{.+}})
