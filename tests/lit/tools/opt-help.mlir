// `tessera-opt --help` lists Tessera's passes, each with its summary.
// RUN: tessera-opt --help | filecheck %s

// CHECK:      Tessera passes
// CHECK-DAG:    canonicalize {{.+}}
// CHECK-DAG:    cse {{.+}}
// CHECK-DAG:    dce {{.+}}
