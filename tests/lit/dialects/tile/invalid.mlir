// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// One case per verifier message of the tile dialect (tessera/ir/tile.py), and the
// structural checks xDSL makes for it (terminator, parent, type constraints).

// --- kernel --------------------------------------------------------------------------

// A grid has three program counts...
// CHECK: tile.kernel @k: expected a grid of three non-negative counts, found [4, 1]{{$}}
"tile.kernel"() <{sym_name = "k", function_type = () -> (), grid = array<i64: 4, 1>, num_warps = 4 : i64, num_stages = 1 : i64}> ({
  "tile.return"() : () -> ()
}) : () -> ()

// -----

// ...none of them negative (0 programs: the kernel of an empty tensor launches nothing).
// CHECK: tile.kernel @k: expected a grid of three non-negative counts, found [4, -1, 1]{{$}}
tile.kernel @k() grid [4, -1, 1] warps 4 stages 1 {
  tile.return
}

// -----

// Warps are a power of two.
// CHECK: tile.kernel @k: warps must be one of (1, 2, 4, 8, 16, 32), found 3{{$}}
tile.kernel @k() grid [1, 1, 1] warps 3 stages 1 {
  tile.return
}

// -----

// At least one warp.
// CHECK: tile.kernel @k: warps must be one of (1, 2, 4, 8, 16, 32), found 0{{$}}
tile.kernel @k() grid [1, 1, 1] warps 0 stages 1 {
  tile.return
}

// -----

// At least one pipeline stage (any count, not only powers of two).
// CHECK: tile.kernel @k: stages must be positive, found 0{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 0 {
  tile.return
}

// -----

// The body's arguments are the signature's (only the generic form can disagree).
// CHECK: tile.kernel @k: block arguments do not match the signature{{$}}
"tile.kernel"() <{sym_name = "k", function_type = (i32) -> (), grid = array<i64: 1, 1, 1>, num_warps = 4 : i64, num_stages = 1 : i64}> ({
^bb0(%a: f32):
  "tile.return"() : () -> ()
}) : () -> ()

// -----

// Arguments are pointers or scalars, never tensors.
// CHECK: tile.kernel @k: arguments must be pointers or scalars, found tensor<4xf32>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>, %t: tensor<4xf32>) grid [1, 1, 1] warps 4 stages 1 {
  tile.return
}

// -----

// Nor index values.
// CHECK: tile.kernel @k: arguments must be pointers or scalars, found index{{$}}
tile.kernel @k(%i: index) grid [1, 1, 1] warps 4 stages 1 {
  tile.return
}

// -----

// The body ends in a terminator (xDSL's single-block check sees a missing one first).
// CHECK: Operation tile.program_id terminates block in single-block region but is not a terminator{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %pid = tile.program_id 0 : i32
}

// -----

// An empty body has no terminator either.
// CHECK: Operation tile.kernel contains empty block in single-block region that expects at least a terminator{{$}}
"tile.kernel"() <{sym_name = "k", function_type = () -> (), grid = array<i64: 1, 1, 1>, num_warps = 4 : i64, num_stages = 1 : i64}> ({
^bb0:
}) : () -> ()

// -----

// Another dialect's terminator cannot end a kernel (its parent check fails first).
// CHECK: 'func.return' expects parent op 'func.func'{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  func.return
}

// -----

// A kernel holds tile, arith, math and scf ops only.
// CHECK: tile.kernel @k: graph.neg cannot appear in a tile kernel{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %c = arith.constant dense<1.000000e+00> : tensor<4xf32>
  %n = graph.neg %c : tensor<4xf32>
  tile.return
}

// -----

// Also inside a loop body.
// CHECK: tile.kernel @k: func.call cannot appear in a tile kernel{{$}}
func.func private @g()
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %c0 = arith.constant 0 : i32
  %c4 = arith.constant 4 : i32
  %c1 = arith.constant 1 : i32
  scf.for %i = %c0 to %c4 step %c1 : i32 {
    func.call @g() : () -> ()
    scf.yield
  }
  tile.return
}

// -----

// tile.return ends a tile kernel only.
// CHECK: 'tile.return' expects parent op 'tile.kernel'{{$}}
func.func @f() {
  tile.return
}

// --- indices and shapes ----------------------------------------------------------------

// -----

// Grids have three axes.
// CHECK: tile.program_id: axis must be 0, 1 or 2, found 3{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %p = tile.program_id 3 : i32
  tile.return
}

// -----

// arange gives a 1-D block...
// CHECK: tile.arange: expected a 1-D i32 block, found tensor<4x4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4x4xi32>
  tile.return
}

// -----

// ...of i32...
// CHECK: tile.arange: expected a 1-D i32 block, found tensor<16xi64>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<16xi64>
  tile.return
}

// -----

// ...whose size is a power of two.
// CHECK: tile.arange: block sizes must be powers of two, found tensor<12xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<12xi32>
  tile.return
}

// -----

// splat takes a scalar...
// CHECK: tile.splat: expected a scalar of the result's element type, found tensor<4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %s = tile.splat %r : tensor<4xi32> -> tensor<4xi32>
  tile.return
}

// -----

// ...of the result's element type...
// CHECK: tile.splat: expected a scalar of the result's element type, found i32{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %p = tile.program_id 0 : i32
  %s = tile.splat %p : i32 -> tensor<4xf32>
  tile.return
}

// -----

// ...to a power-of-two block.
// CHECK: tile.splat: block sizes must be powers of two, found tensor<4x6xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %p = tile.program_id 0 : i32
  %s = tile.splat %p : i32 -> tensor<4x6xi32>
  tile.return
}

// -----

// broadcast keeps the rank...
// CHECK: tile.broadcast: cannot broadcast tensor<4xi32> to tensor<4x4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %b = tile.broadcast %r : tensor<4xi32> -> tensor<4x4xi32>
  tile.return
}

// -----

// ...repeats size-1 dims only...
// CHECK: tile.broadcast: cannot broadcast tensor<2x1xi32> to tensor<4x4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<2xi32>
  %e = tile.expand_dims %r, 1 : tensor<2xi32> -> tensor<2x1xi32>
  %b = tile.broadcast %e : tensor<2x1xi32> -> tensor<4x4xi32>
  tile.return
}

// -----

// ...and keeps the element type.
// CHECK: tile.broadcast: cannot broadcast tensor<4x1xi32> to tensor<4x4xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %e = tile.expand_dims %r, 1 : tensor<4xi32> -> tensor<4x1xi32>
  %b = tile.broadcast %e : tensor<4x1xi32> -> tensor<4x4xf32>
  tile.return
}

// -----

// expand_dims inserts at 0..rank.
// CHECK: tile.expand_dims: axis 2 out of range for tensor<4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %e = tile.expand_dims %r, 2 : tensor<4xi32> -> tensor<4x1xi32>
  tile.return
}

// -----

// Its result has the size-1 dim where the axis says.
// CHECK: tile.expand_dims: expected result tensor<1x4xi32>, found tensor<4x1xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %e = tile.expand_dims %r, 0 : tensor<4xi32> -> tensor<4x1xi32>
  tile.return
}

// -----

// trans swaps the two dims of a 2-D block.
// CHECK: tile.trans: expected result tensor<1x4xi32>, found tensor<4x1xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %e = tile.expand_dims %r, 1 : tensor<4xi32> -> tensor<4x1xi32>
  %t = tile.trans %e : tensor<4x1xi32> -> tensor<4x1xi32>
  tile.return
}

// -----

// ...and only a 2-D block.
// CHECK: tile.trans: expected a 2-D block, found tensor<4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %t = tile.trans %r : tensor<4xi32> -> tensor<4xi32>
  tile.return
}

// --- memory ----------------------------------------------------------------------------

// -----

// Offsets are integers.
// CHECK: tile.load: expected integer offsets, found tensor<4xf32>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %o = arith.constant dense<0.000000e+00> : tensor<4xf32>
  %v = tile.load %x[%o] : !tile.ptr<f32>, tensor<4xf32> -> tensor<4xf32>
  tile.return
}

// -----

// A mask is i1...
// CHECK: tile.load: expected an i1 mask shaped like the offsets tensor<4xi32>, found tensor<4xi32>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %v = tile.load %x[%r] mask %r : !tile.ptr<f32>, tensor<4xi32>, tensor<4xi32> -> tensor<4xf32>
  tile.return
}

// -----

// ...shaped like the offsets.
// CHECK: tile.load: expected an i1 mask shaped like the offsets tensor<4xi32>, found tensor<8xi1>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %r8 = tile.arange : tensor<8xi32>
  %c = arith.constant 2 : i32
  %cs = tile.splat %c : i32 -> tensor<8xi32>
  %m = tile.cmp "lt" %r8, %cs : tensor<8xi32> -> tensor<8xi1>
  %v = tile.load %x[%r] mask %m : !tile.ptr<f32>, tensor<4xi32>, tensor<8xi1> -> tensor<4xf32>
  tile.return
}

// -----

// A load gives the pointer's element type in the offsets' shape.
// CHECK: tile.load: expected result tensor<4xf32>, found tensor<4xbf16>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %v = tile.load %x[%r] : !tile.ptr<f32>, tensor<4xi32> -> tensor<4xbf16>
  tile.return
}

// -----

// Scalar offsets load a scalar.
// CHECK: tile.load: expected result f32, found tensor<1xf32>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %p = tile.program_id 0 : i32
  %v = tile.load %x[%p] : !tile.ptr<f32>, i32 -> tensor<1xf32>
  tile.return
}

// -----

// Loads read through a pointer (an xDSL base-type constraint).
// CHECK: operand 'ptr' at position 0 does not verify:{{$}}
// CHECK-NEXT: i32 should be of base attribute tile.ptr{{$}}
tile.kernel @k(%x: i32) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %v = "tile.load"(%x, %r) : (i32, tensor<4xi32>) -> tensor<4xf32>
  tile.return
}

// -----

// Stores check their offsets...
// CHECK: tile.store: expected integer offsets, found f32{{$}}
tile.kernel @k(%x: !tile.ptr<f32>, %s: f32) grid [1, 1, 1] warps 4 stages 1 {
  tile.store %x[%s], %s : !tile.ptr<f32>, f32, f32
  tile.return
}

// -----

// ...their mask...
// CHECK: tile.store: expected an i1 mask shaped like the offsets tensor<4xi32>, found i1{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %v = tile.load %x[%r] : !tile.ptr<f32>, tensor<4xi32> -> tensor<4xf32>
  %t = arith.constant true
  tile.store %x[%r], %v mask %t : !tile.ptr<f32>, tensor<4xi32>, tensor<4xf32>, i1
  tile.return
}

// -----

// ...and store the pointer's element type in the offsets' shape.
// CHECK: tile.store: expected a value of type tensor<4xf32>, found tensor<4xi32>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  tile.store %x[%r], %r : !tile.ptr<f32>, tensor<4xi32>, tensor<4xi32>
  tile.return
}

// -----

// A block stored to scalar offsets.
// CHECK: tile.store: expected a value of type f32, found tensor<4xf32>{{$}}
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %p = tile.program_id 0 : i32
  %r = tile.arange : tensor<4xi32>
  %v = tile.load %x[%r] : !tile.ptr<f32>, tensor<4xi32> -> tensor<4xf32>
  tile.store %x[%p], %v : !tile.ptr<f32>, i32, tensor<4xf32>
  tile.return
}

// --- compute ---------------------------------------------------------------------------

// -----

// dot contracts a's columns with b's rows.
// CHECK: tile.dot: expected MxK, KxN and MxN blocks, found tensor<16x32xf32>, tensor<16x16xf32>, tensor<16x16xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x32xf32>
  %b = arith.constant dense<1.000000e+00> : tensor<16x16xf32>
  %d = tile.dot %a, %b, %b : tensor<16x32xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  tile.return
}

// -----

// The accumulator is MxN.
// CHECK: tile.dot: expected MxK, KxN and MxN blocks, found tensor<16x16xf32>, tensor<16x32xf32>, tensor<16x16xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x16xf32>
  %b = arith.constant dense<1.000000e+00> : tensor<16x32xf32>
  %d = tile.dot %a, %b, %a : tensor<16x16xf32>, tensor<16x32xf32> -> tensor<16x16xf32>
  tile.return
}

// -----

// Operands are 2-D.
// CHECK: tile.dot: expected MxK, KxN and MxN blocks, found tensor<16xf32>, tensor<16x16xf32>, tensor<16x16xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16xf32>
  %b = arith.constant dense<1.000000e+00> : tensor<16x16xf32>
  %d = tile.dot %a, %b, %b : tensor<16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  tile.return
}

// -----

// a and b have one element type.
// CHECK: tile.dot: operand element types differ: tensor<16x16xf16>, tensor<16x16xbf16>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x16xf16>
  %b = arith.constant dense<1.000000e+00> : tensor<16x16xbf16>
  %c = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
  %d = tile.dot %a, %b, %c : tensor<16x16xf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
  tile.return
}

// -----

// Every block dim is at least 16 (Triton's tl.dot minimum).
// CHECK: tile.dot: every block dim must be at least 16, found (16, 8) and (8, 16){{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x8xf32>
  %b = arith.constant dense<1.000000e+00> : tensor<8x16xf32>
  %c = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
  %d = tile.dot %a, %b, %c : tensor<16x8xf32>, tensor<8x16xf32> -> tensor<16x16xf32>
  tile.return
}

// -----

// The accumulator is a float block, or for integer operands a block of their type.
// CHECK: tile.dot: expected a float accumulator (for integer operands, one of their type), found tensor<16x16xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1> : tensor<16x16xi8>
  %c = arith.constant dense<0> : tensor<16x16xi32>
  %d = tile.dot %a, %a, %c : tensor<16x16xi8>, tensor<16x16xi8> -> tensor<16x16xi32>
  tile.return
}

// -----

// The result has the accumulator's type (an xDSL type-variable constraint).
// CHECK: result 'result' at position 0 does not verify:{{$}}
// CHECK-NEXT: attribute tensor<16x16xf32> expected from variable 'T', but got tensor<16x16xf16>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x16xf16>
  %c = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
  %d = "tile.dot"(%a, %a, %c) : (tensor<16x16xf16>, tensor<16x16xf16>, tensor<16x16xf32>) -> tensor<16x16xf16>
  tile.return
}

// -----

// Reductions are the kinds of reduction_kinds.TILE_KINDS (a mean is a sum, then a division).
// CHECK: tile.reduce: unknown kind 'mean'; expected one of ('sum', 'max', 'min', 'prod'){{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x16xf32>
  %r = tile.reduce "mean" %a, 1 : tensor<16x16xf32> -> tensor<16xf32>
  tile.return
}

// -----

// The axis is one of the input's.
// CHECK: tile.reduce: axis 2 out of range for tensor<16x16xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x16xf32>
  %r = tile.reduce "sum" %a, 2 : tensor<16x16xf32> -> tensor<16xf32>
  tile.return
}

// -----

// The reduced axis is dropped from the result.
// CHECK: tile.reduce: expected result tensor<8xf32>, found tensor<16xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16x8xf32>
  %r = tile.reduce "max" %a, 0 : tensor<16x8xf32> -> tensor<16xf32>
  tile.return
}

// -----

// A 1-D block reduces to a scalar.
// CHECK: tile.reduce: expected result f32, found tensor<1xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant dense<1.000000e+00> : tensor<16xf32>
  %r = tile.reduce "min" %a, 0 : tensor<16xf32> -> tensor<1xf32>
  tile.return
}

// --- comparisons, selection and conversion ----------------------------------------------

// -----

// Predicates are eq, ne, lt, le, gt, ge.
// CHECK: tile.cmp: unknown predicate 'olt'; expected one of eq, ne, lt, le, gt, ge{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %m = tile.cmp "olt" %r, %r : tensor<4xi32> -> tensor<4xi1>
  tile.return
}

// -----

// Both operands have one type (an xDSL type-variable constraint, checked before the
// op's own "operand types differ").
// CHECK: operand 'rhs' at position 1 does not verify:{{$}}
// CHECK-NEXT: attribute i32 expected from variable 'T', but got f32{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant 1 : i32
  %b = arith.constant 1.000000e+00 : f32
  %c = "tile.cmp"(%a, %b) <{predicate = "lt"}> : (i32, f32) -> i1
  tile.return
}

// -----

// The result is i1 in the operands' shape.
// CHECK: tile.cmp: expected result tensor<4xi1>, found tensor<4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %m = tile.cmp "lt" %r, %r : tensor<4xi32> -> tensor<4xi32>
  tile.return
}

// -----

// select's condition is i1 in the result's shape...
// CHECK: tile.select: expected a condition of type tensor<4xi1>, found i1{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %t = arith.constant true
  %a = arith.constant dense<1.000000e+00> : tensor<4xf32>
  %s = tile.select %t, %a, %a : i1, tensor<4xf32>
  tile.return
}

// -----

// ...not an integer of another width.
// CHECK: tile.select: expected a condition of type tensor<4xi1>, found tensor<4xi32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %a = arith.constant dense<1.000000e+00> : tensor<4xf32>
  %s = "tile.select"(%r, %a, %a) : (tensor<4xi32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  tile.return
}

// -----

// Both choices have the result's type (an xDSL type-variable constraint).
// CHECK: operand 'on_false' at position 2 does not verify:{{$}}
// CHECK-NEXT: attribute f32 expected from variable 'T', but got i32{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %a = arith.constant 1.000000e+00 : f32
  %b = arith.constant 1 : i32
  %c = arith.constant true
  %d = "tile.select"(%c, %a, %b) : (i1, f32, i32) -> f32
  tile.return
}

// -----

// convert changes the element type only.
// CHECK: tile.convert: shapes differ: tensor<4xi32> and tensor<8xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %r = tile.arange : tensor<4xi32>
  %c = tile.convert %r : tensor<4xi32> -> tensor<8xf32>
  tile.return
}

// -----

// A scalar stays a scalar.
// CHECK: tile.convert: shapes differ: i32 and tensor<1xf32>{{$}}
tile.kernel @k() grid [1, 1, 1] warps 4 stages 1 {
  %p = tile.program_id 0 : i32
  %c = tile.convert %p : i32 -> tensor<1xf32>
  tile.return
}
