// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// A scan's stacked operand must stack `length` of the step's slices.
// CHECK: graph.scan @step: operand types (tensor<4xf32>, tensor<2x4xf32>) do not match the body's (tensor<4xf32>, tensor<3x4xf32>)
func.func @wrong_length(%h: tensor<4xf32>, %ws: tensor<2x4xf32>) -> tensor<4xf32> {
  %0 = graph.scan @step(%h, %ws) {carries = 1, length = 3, reverse = false} : (tensor<4xf32>, tensor<2x4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @step(%h: tensor<4xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {
  func.return %h : tensor<4xf32>
}

// -----

// A call names a function of the module.
// CHECK: graph.call: no function @missing in the module
func.func @dangling(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.call @missing(%x) : (tensor<4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}

// -----

// A call's result constraints name one layout (or unit) per result.
// CHECK: graph.call @called: graph.result_shardings needs one #graph.sharding or unit per result (1), found [unit, unit]
graph.mesh @mesh axes = [tp = 2]
func.func @constraint_count(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.call @called(%x) attributes {graph.result_shardings = [unit, unit]} : (tensor<4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @called(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}

// -----

// A result constraint has the result's rank.
// CHECK: graph.call @called: graph.result_shardings entry #0 has 2 dims for a result of rank 1
graph.mesh @mesh axes = [tp = 2]
func.func @constraint_rank(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.call @called(%x) attributes {graph.result_shardings = [#graph.sharding<@mesh, [[tp], []]>]} : (tensor<4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @called(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}

// -----

// A result constraint is a #graph.sharding or unit.
// CHECK: graph.call @called: graph.result_shardings entry #0 must be a #graph.sharding or unit, found 1 : i64
func.func @constraint_kind(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.call @called(%x) attributes {graph.result_shardings = [1]} : (tensor<4xf32>) -> (tensor<4xf32>)
  func.return %0 : tensor<4xf32>
}
func.func private @called(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}

// -----

// A scan constrains only its stacked results, each with dim 0 (the steps) whole.
// CHECK: graph.scan @step: graph.result_shardings entry #1 must be unit (a carry) or keep dim 0 whole (a stacked result), found #graph.sharding<@mesh, {{\[\[}}tp], []]>
graph.mesh @mesh axes = [tp = 2]
func.func @split_steps(%x: tensor<4xf32>, %w: tensor<2x4xf32>) -> (tensor<4xf32>, tensor<2x4xf32>) {
  %h, %y = graph.scan @step(%x, %w) {carries = 1, length = 2, reverse = false} attributes {graph.result_shardings = [unit, #graph.sharding<@mesh, [[tp], []]>]} : (tensor<4xf32>, tensor<2x4xf32>) -> (tensor<4xf32>, tensor<2x4xf32>)
  func.return %h, %y : tensor<4xf32>, tensor<2x4xf32>
}
func.func private @step(%h: tensor<4xf32>, %w: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %n = graph.add %h, %w : tensor<4xf32>
  func.return %n, %n : tensor<4xf32>, tensor<4xf32>
}
