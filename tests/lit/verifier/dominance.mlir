// RUN: not tessera-opt %s 2>&1 | filecheck %s --check-prefix=LOCATED
// RUN: not tessera-opt %s -p autodiff 2>&1 | filecheck %s --check-prefix=LOCATED
// RUN: not tessera-opt %s -p lower-graph-to-schedule 2>&1 | filecheck %s --check-prefix=LOCATED
// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Every operand is defined before its use, in a region that encloses the use. xDSL's
// parser accepts forward references, so this is checked once per module, before any
// op verifier or pass. (Before the check, a use before its definition verified;
// lower-graph-to-schedule then crashed, and autodiff exited 0 with a zero gradient.)

// LOCATED-NOT: Traceback
// LOCATED-NOT: internal error
// LOCATED:     dominance.mlir:[[# @LINE + 4]]:3: error: graph.sum: operand #0 (%t) is used before its definition (defined at line [[# @LINE + 5]])
// LOCATED-NOT: error
// CHECK:       graph.sum: operand #0 (%t) is used before its definition (defined at line [[# @LINE + 3]]){{$}}
func.func @use_before_definition(%x: tensor<4xf32>) -> tensor<f32> {
  %s = graph.sum %t {axes = [0], keepdims = false} : tensor<4xf32> -> tensor<f32>
  %t = graph.exp %x : tensor<4xf32>
  func.return %s : tensor<f32>
}

// -----

// CHECK: graph.add: operand #0 (%y) is the op's own result{{$}}
func.func @uses_its_own_result(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.add %y, %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}

// -----

// CHECK: graph.neg: operand #0 (%inner) is defined in a region that does not enclose this use (defined at line [[# @LINE + 4]]){{$}}
func.func @uses_a_value_of_another_region(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.neg %inner : tensor<4xf32>
  %r = schedule.microbatch {index = 0, count = 1} -> tensor<4xf32> {
    %inner = graph.exp %x : tensor<4xf32>
    schedule.yield %inner : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}

// -----

// CHECK: graph.neg: operand #0 (%r) is a result of schedule.microbatch, which encloses this use{{$}}
func.func @uses_the_result_of_its_region_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = schedule.microbatch {index = 0, count = 1} -> tensor<4xf32> {
    %inner = graph.neg %r : tensor<4xf32>
    schedule.yield %inner : tensor<4xf32>
  }
  func.return %r : tensor<4xf32>
}

// -----

// Inside a kernel's body, too.
// CHECK: graph.exp: operand #0 (%b) is used before its definition (defined at line [[# @LINE + 4]]){{$}}
func.func @kernel_body(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = schedule.kernel @k(%a = %x) : (tensor<4xf32>) -> tensor<4xf32> {
    %c = graph.exp %b : tensor<4xf32>
    %b = graph.neg %a : tensor<4xf32>
    schedule.yield %c : tensor<4xf32>
  }
  func.return %r : tensor<4xf32>
}

// -----

// A tile kernel is isolated from above: module-level values are not visible inside.
// CHECK: arith.addi: operand #1 (%outside) is defined outside tile.kernel, which is isolated from above (defined at line [[# @LINE + 1]]); pass it in as an argument{{$}}
%outside = arith.constant 1 : i32
tile.kernel @k(%n: i32) grid [1, 1, 1] warps 4 stages 1 {
  %s = arith.addi %n, %outside : i32
  tile.return
}

// -----

// A loop's body sees the values defined before the loop, not those after it.
// CHECK: arith.addi: operand #1 (%later) is used before its definition (defined at line [[# @LINE + 9]]){{$}}
tile.kernel @loop(%n: i32) grid [1, 1, 1] warps 4 stages 1 {
  %lb = arith.constant 0 : index
  %ub = arith.constant 4 : index
  %step = arith.constant 1 : index
  %sum = scf.for %i = %lb to %ub step %step iter_args(%acc = %n) -> (i32) {
    %next = arith.addi %acc, %later : i32
    scf.yield %next : i32
  }
  %later = arith.constant 2 : i32
  tile.return
}

// -----

// In a region of several blocks, a block sees the values of the blocks that dominate it
// (none here: nothing branches to ^bb1).
// CHECK: graph.neg: operand #0 (%y) is defined in a block that does not dominate this use (defined at line [[# @LINE + 2]]){{$}}
func.func @other_block(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.exp %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
^bb1:
  %z = graph.neg %y : tensor<4xf32>
  func.return %z : tensor<4xf32>
}

// -----

// Values in scope: arguments, earlier results and the enclosing regions' values.
// CHECK: builtin.module
// CHECK: func.func @fine
func.func @fine(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = graph.neg %x : tensor<4xf32>
  %r = schedule.microbatch {index = 0, count = 1} -> tensor<4xf32> {
    %z = graph.add %x, %y : tensor<4xf32>
    schedule.yield %z : tensor<4xf32>
  }
  func.return %r : tensor<4xf32>
}
