// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Segment ids are i32 [batch, T] (batch: q's dims before the heads).
func.func @attention_segment_ids_shape(%q: tensor<2x4x16x8xf32>, %qs: tensor<2x16xi32>, %ks: tensor<2x15xi32>) {
  // CHECK: graph.attention: expected the key segment ids to be tensor<2x16xi32>, found tensor<2x15xi32>{{$}}
  %o, %l = graph.attention %q, %q, %q, %qs, %ks {causal = false, scale = 1.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x16xi32>, tensor<2x15xi32> -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>)
  func.return
}

// -----

func.func @attention_segment_ids_dtype(%q: tensor<2x4x16x8xf32>, %qs: tensor<2x16xi1>) {
  // CHECK: graph.attention: expected the query segment ids to be tensor<2x16xi32>, found tensor<2x16xi1>{{$}}
  %o, %l = graph.attention %q, %q, %q, %qs, %qs {causal = false, scale = 1.0, segments = true} : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x16xi1>, tensor<2x16xi1> -> (tensor<2x4x16x8xf32>, tensor<2x4x16xf32>)
  func.return
}

// -----

func.func @attention_window_negative(%q: tensor<16x8xf32>) {
  // CHECK: graph.attention: expected a positive window, found -1{{$}}
  %o, %l = graph.attention %q, %q, %q {causal = true, scale = 1.0, window = -1} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32> -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return
}
