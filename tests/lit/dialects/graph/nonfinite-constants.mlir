// RUN: tessera-opt %s | filecheck %s
// RUN: tessera-opt %s | tessera-opt | filecheck %s

// inf and nan constants print as hex blobs: xDSL's own spelling of non-finite floats
// (`dense<0xff800000>`) re-parses as an integer, so a round trip would change the value.

// CHECK-LABEL: func.func @masks
func.func @masks() -> (tensor<f32>, tensor<2xf32>, tensor<3xbf16>, tensor<2xf16>) {
  // CHECK: graph.constant dense<"0x000080FF"> : tensor<f32>
  %neg_inf = graph.constant dense<"0x000080FF"> : tensor<f32>
  // CHECK: graph.constant dense<"0x0000803F0000807F"> : tensor<2xf32>
  %mixed = graph.constant dense<"0x0000803F0000807F"> : tensor<2xf32>
  // CHECK: graph.constant dense<"0xC07FC07FC07F"> : tensor<3xbf16>
  %nan = graph.constant dense<"0xC07FC07FC07F"> : tensor<3xbf16>
  // CHECK: graph.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf16>
  %finite = graph.constant dense<[1.0, 2.0]> : tensor<2xf16>
  func.return %neg_inf, %mixed, %nan, %finite : tensor<f32>, tensor<2xf32>, tensor<3xbf16>, tensor<2xf16>
}
