// `tessera-opt --help` lists Tessera's passes, each with its summary and its options
// (name, type and default), as `-p 'flag{option=value}'` takes them.
// RUN: tessera-opt --help | filecheck %s

// CHECK:      Tessera passes
// CHECK-DAG:    canonicalize {{.+}}
// CHECK-DAG:    cse {{.+}}
// CHECK-DAG:    dce {{.+}}
// CHECK:        bucket-gradients {{.+}}
// CHECK-NEXT:     bucket_bytes: int = 26214400
// CHECK:        lower-schedule-to-tile {{.+}}
// CHECK-NEXT:     block: int = 1024
// CHECK-NEXT:     row_elements: int = 4096
// CHECK-NEXT:     block_m: int = 32
// CHECK-NEXT:     block_n: int = 32
// CHECK-NEXT:     block_k: int = 32
// CHECK-NEXT:     num_warps: int = 4
// CHECK-NEXT:   pipeline-schedule {{.+}}
// CHECK-NEXT:     kind: str = '1f1b'
// CHECK-NEXT:     microbatches: int = 1
// CHECK-NEXT:     virtual: int = 1

// Only the targets that work on Tessera's modules are offered; --version names Tessera.
// RUN: tessera-opt --help | filecheck %s --check-prefix=TARGETS
// TARGETS: Available targets are:
// TARGETS-NEXT: mlir,triton
// RUN: echo 'func.func @f() { func.return }' | not tessera-opt -t llvm 2>&1 | filecheck %s --check-prefix=LLVM
// LLVM-NOT: Traceback
// LLVM: tessera-opt: error: argument -t/--target: invalid choice: 'llvm' (choose from mlir, triton)
// RUN: tessera-opt --version | filecheck %s --check-prefix=VERSION
// VERSION: tessera-opt from Tessera {{[0-9]+\.[0-9]+\.[0-9]+}} (xDSL {{.+}})
