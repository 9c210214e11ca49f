// Mistakes in the pass pipeline or the input file name get one clear line, no traceback.
// RUN: not tessera-opt %s -p no-such-pass 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not tessera-opt %s -p 'cse{bogus=1}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not tessera-opt %s -p 'canonicalize{max-fold-elements=many}' 2>&1 | filecheck %s --check-prefix=TYPE
// RUN: not tessera-opt %s -p 'canonicalize,,cse' 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not tessera-opt %s.missing 2>&1 | filecheck %s --check-prefix=FILE
// Option values a pass cannot use (found by the fuzzer: a ZeroDivisionError in
// plan-memory; tile kernels with 0 or 3 warps that did not verify).
// RUN: not tessera-opt %s -p 'plan-memory{alignment=0}' 2>&1 | filecheck %s --check-prefix=ALIGN
// RUN: not tessera-opt %s -p 'lower-schedule-to-tile{num_warps=3}' 2>&1 | filecheck %s --check-prefix=WARPS
// RUN: not tessera-opt %s -p 'lower-schedule-to-tile{block_k=0}' 2>&1 | filecheck %s --check-prefix=BLOCK

// UNKNOWN:     tessera-opt: error: unknown pass 'no-such-pass'; available passes: {{.*}}canonicalize{{.*}}
// UNKNOWN-NOT: Traceback
// OPTION:      tessera-opt: error: invalid options for pass 'cse': {{.*}}"bogus"
// OPTION-NOT:  Traceback
// TYPE:        tessera-opt: error: invalid options for pass 'canonicalize': option 'max-fold-elements' takes a value of type int, given 'many'
// TYPE-NOT:    Traceback
// SYNTAX:      tessera-opt: error: invalid pass pipeline 'canonicalize,,cse' at column 14: Expected pass name here
// SYNTAX-NOT:  Traceback
// FILE:        tessera-opt: error: {{.*}}No such file or directory{{.*}}opt-pass-errors.mlir.missing
// FILE-NOT:    Traceback
// ALIGN:       tessera-opt: error: invalid options for pass 'plan-memory': alignment must be a positive power of two (bytes), found 0
// ALIGN-NOT:   Traceback
// WARPS:       tessera-opt: error: invalid options for pass 'lower-schedule-to-tile': num_warps must be one of (1, 2, 4, 8, 16, 32), found 3
// WARPS-NOT:   Traceback
// BLOCK:       tessera-opt: error: invalid options for pass 'lower-schedule-to-tile': block_k must be positive, found 0
// BLOCK-NOT:   Traceback

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
