// xDSL's driver flags work with Tessera's dialects and passes.
// RUN: tessera-opt %s -p 'canonicalize,cse' --print-between-passes | filecheck %s --check-prefix=BETWEEN
// RUN: tessera-opt %s -p 'canonicalize{max-fold-elements=8},cse,dce' | filecheck %s --check-prefix=PIPELINE
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s --check-prefix=ROUNDTRIP

// BETWEEN:         IR after canonicalize:
// BETWEEN-COUNT-2:   graph.exp
// BETWEEN:           func.return
// BETWEEN-NOT:     IR after
// BETWEEN:           graph.exp
// BETWEEN-NOT:       graph.exp

// PIPELINE-LABEL: func.func @pipeline
// PIPELINE-SAME:    (%[[X:.*]]: tensor<4xf32>)
// PIPELINE-NEXT:    %[[E:.*]] = graph.exp %[[X]]
// PIPELINE-NEXT:    %[[S:.*]] = graph.add %[[E]], %[[E]]
// PIPELINE-NEXT:    func.return %[[S]]

// ROUNDTRIP-LABEL: func.func @pipeline
// ROUNDTRIP-COUNT-2: graph.exp

func.func @pipeline(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = graph.reshape %x : tensor<4xf32> -> tensor<4xf32>
  %a = graph.exp %r : tensor<4xf32>
  %b = graph.exp %x : tensor<4xf32>
  %s = graph.add %a, %b : tensor<4xf32>
  func.return %s : tensor<4xf32>
}
