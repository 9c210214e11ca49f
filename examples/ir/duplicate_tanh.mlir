func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %a = graph.tanh %x : tensor<4x8xf32>
  %b = graph.tanh %x : tensor<4x8xf32>
  %c = graph.add %a, %b : tensor<4x8xf32>
  func.return %c : tensor<4x8xf32>
}
