// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// The verifier of graph.random_bits: it says what it expected and what it found.

// Key words and counters are i32.
func.func @float_counter(%k: tensor<i32>, %c: tensor<4xf32>) {
  // CHECK: graph.random_bits: expected an i32 counter, found tensor<4xf32>{{$}}
  %b = graph.random_bits %k, %k, %c {stream = 0} : tensor<i32>, tensor<i32>, tensor<4xf32> -> tensor<4xi32>
  func.return
}

// -----

func.func @i64_key(%k: tensor<i64>, %c: tensor<4xi32>) {
  // CHECK: graph.random_bits: expected an i32 key0, found tensor<i64>{{$}}
  %b = graph.random_bits %k, %k, %c {stream = 0} : tensor<i64>, tensor<i64>, tensor<4xi32> -> tensor<4xi32>
  func.return
}

// -----

// The result has the operands' broadcast shape.
func.func @result_shape(%k: tensor<i32>, %c: tensor<4xi32>) {
  // CHECK: graph.random_bits: result 0 type mismatch: expected tensor<4xi32>, found tensor<8xi32>{{$}}
  %b = graph.random_bits %k, %k, %c {stream = 0} : tensor<i32>, tensor<i32>, tensor<4xi32> -> tensor<8xi32>
  func.return
}

// -----

// Operands that do not broadcast.
func.func @no_broadcast(%k: tensor<3xi32>, %c: tensor<4xi32>) {
  // CHECK: graph.random_bits: shapes [3] and [3] and [4] do not broadcast: dimension 0 (aligned right) has sizes [3, 4]{{$}}
  %b = graph.random_bits %k, %k, %c {stream = 0} : tensor<3xi32>, tensor<3xi32>, tensor<4xi32> -> tensor<4xi32>
  func.return
}

// -----

// The stream is a uint32 word.
func.func @stream_range(%k: tensor<i32>, %c: tensor<4xi32>) {
  // CHECK: graph.random_bits: expected a stream in [0, 2^32), found -1{{$}}
  %b = graph.random_bits %k, %k, %c {stream = -1} : tensor<i32>, tensor<i32>, tensor<4xi32> -> tensor<4xi32>
  func.return
}
