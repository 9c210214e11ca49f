// Mistakes in the pass pipeline or the input file name get one clear line, no traceback.
// RUN: not tessera-opt %s -p no-such-pass 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not tessera-opt %s -p 'cse{bogus=1}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not tessera-opt %s -p 'canonicalize{max-fold-elements=many}' 2>&1 | filecheck %s --check-prefix=TYPE
// RUN: not tessera-opt %s -p 'canonicalize,,cse' 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not tessera-opt %s.missing 2>&1 | filecheck %s --check-prefix=FILE

// UNKNOWN:     tessera-opt: error: unknown pass 'no-such-pass'; available passes: {{.*}}canonicalize{{.*}}
// UNKNOWN-NOT: Traceback
// OPTION:      tessera-opt: error: invalid options for pass 'cse': {{.*}}"bogus"
// OPTION-NOT:  Traceback
// TYPE:        tessera-opt: error: invalid options for pass 'canonicalize': {{.*}}many
// TYPE-NOT:    Traceback
// SYNTAX:      tessera-opt: error: invalid pass pipeline 'canonicalize,,cse' at column 14: Expected pass name here
// SYNTAX-NOT:  Traceback
// FILE:        tessera-opt: error: {{.*}}No such file or directory{{.*}}opt-pass-errors.mlir.missing
// FILE-NOT:    Traceback

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
