// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block=64}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block=64}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block=64}' -t triton | filecheck %s --check-prefix=TRITON

// Pointwise kernels: a 1-D grid over the flat output, `block` (64 here, less for small
// outputs) elements per program; the output index is recovered from the flat offset by
// division and remainder, and every graph value is evaluated there. A mask appears only
// when the output's size is not a multiple of the block. The second RUN line re-parses
// (and re-verifies) the tile IR; the third prints the Triton source.

// An elementwise chain with a broadcast operand (the row vector %y is read at the column
// index, offset % 33); 7 x 33 = 231 elements need 4 programs of 64 and a mask. gelu is
// expanded to erf, the scalar 2.0 is a splat constant, exp(%x) reuses the loaded %x.
// CHECK-LABEL: tile.kernel @chain_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [4, 1, 1] warps 4 stages 1 {
// CHECK-NEXT:    %[[PID:.*]] = tile.program_id 0 : i32
// CHECK-NEXT:    %[[C64:.*]] = arith.constant 64 : i32
// CHECK-NEXT:    %[[BASE:.*]] = arith.muli %[[PID]], %[[C64]] : i32
// CHECK-NEXT:    %[[R:.*]] = tile.arange : tensor<64xi32>
// CHECK-NEXT:    %[[BASES:.*]] = tile.splat %[[BASE]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[OFF:.*]] = arith.addi %[[BASES]], %[[R]] : tensor<64xi32>
// CHECK-NEXT:    %[[N:.*]] = arith.constant 231 : i32
// CHECK-NEXT:    %[[NS:.*]] = tile.splat %[[N]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[MASK:.*]] = tile.cmp "lt" %[[OFF]], %[[NS]] : tensor<64xi32> -> tensor<64xi1>
// CHECK-NEXT:    %[[C33:.*]] = arith.constant 33 : i32
// CHECK-NEXT:    %[[C33S:.*]] = tile.splat %[[C33]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[COL:.*]] = arith.remsi %[[OFF]], %[[C33S]] : tensor<64xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[OFF]]] mask %[[MASK]] : !tile.ptr<f32>, tensor<64xi32>, tensor<64xi1> -> tensor<64xf32>
// CHECK-NEXT:    %[[TWO:.*]] = arith.constant 2.000000e+00 : f32
// CHECK-NEXT:    %[[TWOS:.*]] = tile.splat %[[TWO]] : f32 -> tensor<64xf32>
// CHECK-NEXT:    %[[X2:.*]] = arith.mulf %[[X]], %[[TWOS]] : tensor<64xf32>
// CHECK-NEXT:    %[[Y:.*]] = tile.load %in1[%[[COL]]] mask %[[MASK]] : !tile.ptr<f32>, tensor<64xi32>, tensor<64xi1> -> tensor<64xf32>
// CHECK-NEXT:    %[[SUM:.*]] = arith.addf %[[X2]], %[[Y]] : tensor<64xf32>
// CHECK:         math.erf
// CHECK:         %[[GELU:.*]] = arith.mulf
// CHECK-NEXT:    %[[EXP:.*]] = math.exp %[[X]] : tensor<64xf32>
// CHECK-NEXT:    %[[OUT:.*]] = arith.subf %[[GELU]], %[[EXP]] : tensor<64xf32>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[OUT]] mask %[[MASK]] : !tile.ptr<f32>, tensor<64xi32>, tensor<64xf32>, tensor<64xi1>
// CHECK-NEXT:    tile.return
// CHECK-NEXT:  }

// TRITON-LABEL: # --- kernel @chain_k0
// TRITON:       import triton
// TRITON-NEXT:  import triton.language as tl
// TRITON:       @triton.jit
// TRITON-NEXT:  def chain_k0(in0, in1, out0):
// TRITON-NEXT:      [[PID:v]] = tl.program_id(0)
// TRITON-NEXT:      [[BASE:v_[0-9]+]] = [[PID]] * 64
// TRITON-NEXT:      [[R:v_[0-9]+]] = tl.arange(0, 64)
// TRITON-NEXT:      [[BASES:v_[0-9]+]] = tl.full((64,), [[BASE]], tl.int32)
// TRITON-NEXT:      [[OFF:v_[0-9]+]] = [[BASES]] + [[R]]
// TRITON-NEXT:      [[N:v_[0-9]+]] = tl.full((64,), 231, tl.int32)
// TRITON-NEXT:      [[MASK:v_[0-9]+]] = [[OFF]] < [[N]]
// TRITON-NEXT:      [[C33:v_[0-9]+]] = tl.full((64,), 33, tl.int32)
// TRITON-NEXT:      [[COL:v_[0-9]+]] = [[OFF]] % [[C33]]
// TRITON-NEXT:      [[X:v_[0-9]+]] = tl.load(in0 + [[OFF]], mask=[[MASK]], other=0)
// TRITON:           {{v_[0-9]+}} = tl.load(in1 + [[COL]], mask=[[MASK]], other=0)
// TRITON:           tl.erf(
// TRITON:           [[EXP:v_[0-9]+]] = tl.exp([[X]])
// TRITON-NEXT:      [[OUT:v_[0-9]+]] = {{v_[0-9]+}} - [[EXP]]
// TRITON-NEXT:      tl.store(out0 + [[OFF]], [[OUT]], mask=[[MASK]]){{$}}
// TRITON-NOT:       tl.

func.func @chain(%x: tensor<7x33xf32>, %y: tensor<33xf32>) -> tensor<7x33xf32> {
  %0 = schedule.kernel @chain_k0(%a = %x, %b = %y) : (tensor<7x33xf32>, tensor<33xf32>) -> tensor<7x33xf32> {
    %c = graph.constant dense<2.000000e+00> : tensor<f32>
    %1 = graph.mul %a, %c : tensor<7x33xf32>, tensor<f32> -> tensor<7x33xf32>
    %2 = graph.add %1, %b : tensor<7x33xf32>, tensor<33xf32> -> tensor<7x33xf32>
    %3 = graph.gelu %2 {approximate = none} : tensor<7x33xf32>
    %4 = graph.exp %a : tensor<7x33xf32>
    %5 = graph.sub %3, %4 : tensor<7x33xf32>
    schedule.yield %5 : tensor<7x33xf32>
  }
  func.return %0 : tensor<7x33xf32>
}

// -----

// 8 x 32 = 256 elements are 4 whole blocks: no mask anywhere. The column vector %y
// (8 x 1) is read at the row index, offset / 32.
// CHECK-LABEL: tile.kernel @even_k0
// CHECK-SAME:    grid [4, 1, 1] warps 4 stages 1 {
// CHECK-NOT:     tile.cmp
// CHECK:         %[[OFF:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<64xi32>
// CHECK-NEXT:    %[[C32:.*]] = arith.constant 32 : i32
// CHECK-NEXT:    %[[C32S:.*]] = tile.splat %[[C32]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[ROW:.*]] = arith.divsi %[[OFF]], %[[C32S]] : tensor<64xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[OFF]]] : !tile.ptr<f32>, tensor<64xi32> -> tensor<64xf32>
// CHECK-NEXT:    %[[Y:.*]] = tile.load %in1[%[[ROW]]] : !tile.ptr<f32>, tensor<64xi32> -> tensor<64xf32>
// CHECK-NEXT:    %[[P:.*]] = arith.mulf %[[X]], %[[Y]] : tensor<64xf32>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[P]] : !tile.ptr<f32>, tensor<64xi32>, tensor<64xf32>{{$}}
// CHECK-NEXT:    tile.return

// TRITON-LABEL: # --- kernel @even_k0
// TRITON:       def even_k0(in0, in1, out0):
// TRITON-NOT:       mask
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + [[OFF:v_[0-9]+]]){{$}}
// TRITON-NEXT:      [[Y:v_[0-9]+]] = tl.load(in1 + {{v_[0-9]+}}){{$}}
// TRITON-NEXT:      [[P:v_[0-9]+]] = [[X]] * [[Y]]
// TRITON-NEXT:      tl.store(out0 + [[OFF]], [[P]]){{$}}

func.func @even(%x: tensor<8x32xf32>, %y: tensor<8x1xf32>) -> tensor<8x32xf32> {
  %0 = schedule.kernel @even_k0(%a = %x, %b = %y) : (tensor<8x32xf32>, tensor<8x1xf32>) -> tensor<8x32xf32> {
    %1 = graph.mul %a, %b : tensor<8x32xf32>, tensor<8x1xf32> -> tensor<8x32xf32>
    schedule.yield %1 : tensor<8x32xf32>
  }
  func.return %0 : tensor<8x32xf32>
}

// -----

// bf16 in and out: loads convert to f32, the result converts back before the store; a
// non-splat constant is passed by pointer (%const0, after the outputs). The block shrinks
// to 16, the next power of two of the 15 elements.
// CHECK-LABEL: tile.kernel @bf16_const_k0
// CHECK-SAME:    (%in0: !tile.ptr<bf16>, %out0: !tile.ptr<bf16>, %const0: !tile.ptr<bf16>) grid [1, 1, 1] warps 4 stages 1 {
// CHECK:         %[[MASK:.*]] = tile.cmp "lt" %[[OFF:.*]], %{{.*}} : tensor<16xi32> -> tensor<16xi1>
// CHECK:         %[[COL:.*]] = arith.remsi %[[OFF]], %{{.*}} : tensor<16xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[OFF]]] mask %[[MASK]] : !tile.ptr<bf16>, tensor<16xi32>, tensor<16xi1> -> tensor<16xbf16>
// CHECK-NEXT:    %[[XF:.*]] = tile.convert %[[X]] : tensor<16xbf16> -> tensor<16xf32>
// CHECK-NEXT:    %[[C:.*]] = tile.load %const0[%[[COL]]] mask %[[MASK]] : !tile.ptr<bf16>, tensor<16xi32>, tensor<16xi1> -> tensor<16xbf16>
// CHECK-NEXT:    %[[CF:.*]] = tile.convert %[[C]] : tensor<16xbf16> -> tensor<16xf32>
// CHECK-NEXT:    %[[S:.*]] = arith.addf %[[XF]], %[[CF]] : tensor<16xf32>
// CHECK-NEXT:    %[[T:.*]] = math.tanh %[[S]] : tensor<16xf32>
// CHECK-NEXT:    %[[TB:.*]] = tile.convert %[[T]] : tensor<16xf32> -> tensor<16xbf16>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[TB]] mask %[[MASK]] : !tile.ptr<bf16>, tensor<16xi32>, tensor<16xbf16>, tensor<16xi1>

// TRITON-LABEL: # --- kernel @bf16_const_k0
// TRITON:       def bf16_const_k0(in0, out0, const0):
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + [[OFF:v_[0-9]+]], mask=[[MASK:v_[0-9]+]], other=0)
// TRITON-NEXT:      [[XF:v_[0-9]+]] = [[X]].to(tl.float32)
// TRITON-NEXT:      [[C:v_[0-9]+]] = tl.load(const0 + {{v_[0-9]+}}, mask=[[MASK]], other=0)
// TRITON-NEXT:      [[CF:v_[0-9]+]] = [[C]].to(tl.float32)
// TRITON-NEXT:      [[S:v_[0-9]+]] = [[XF]] + [[CF]]
// TRITON-NEXT:      [[T:v_[0-9]+]] = 2 * tl.sigmoid(2 * [[S]]) - 1
// TRITON-NEXT:      [[TB:v_[0-9]+]] = [[T]].to(tl.bfloat16)
// TRITON-NEXT:      tl.store(out0 + [[OFF]], [[TB]], mask=[[MASK]]){{$}}

func.func @bf16_const(%x: tensor<5x3xbf16>) -> tensor<5x3xbf16> {
  %0 = schedule.kernel @bf16_const_k0(%a = %x) : (tensor<5x3xbf16>) -> tensor<5x3xbf16> {
    %c = graph.constant dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]> : tensor<3xbf16>
    %1 = graph.add %a, %c : tensor<5x3xbf16>, tensor<3xbf16> -> tensor<5x3xbf16>
    %2 = graph.tanh %1 : tensor<5x3xbf16>
    schedule.yield %2 : tensor<5x3xbf16>
  }
  func.return %0 : tensor<5x3xbf16>
}

// -----

// transpose (fused with an add): output [33, 7] at (i, j) = (offset / 7, offset % 7)
// reads the input [7, 33] at j * 33 + i.
// CHECK-LABEL: tile.kernel @transpose_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [4, 1, 1]
// CHECK:         %[[MASK:.*]] = tile.cmp "lt" %[[OFF:.*]], %{{.*}} : tensor<64xi32> -> tensor<64xi1>
// CHECK-NEXT:    %[[C7:.*]] = arith.constant 7 : i32
// CHECK-NEXT:    %[[C7S:.*]] = tile.splat %[[C7]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[I:.*]] = arith.divsi %[[OFF]], %[[C7S]] : tensor<64xi32>
// CHECK-NEXT:    %[[C7B:.*]] = arith.constant 7 : i32
// CHECK-NEXT:    %[[C7BS:.*]] = tile.splat %[[C7B]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[J:.*]] = arith.remsi %[[OFF]], %[[C7BS]] : tensor<64xi32>
// CHECK-NEXT:    %[[C33:.*]] = arith.constant 33 : i32
// CHECK-NEXT:    %[[C33S:.*]] = tile.splat %[[C33]] : i32 -> tensor<64xi32>
// CHECK-NEXT:    %[[JS:.*]] = arith.muli %[[J]], %[[C33S]] : tensor<64xi32>
// CHECK-NEXT:    %[[IN:.*]] = arith.addi %[[JS]], %[[I]] : tensor<64xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[IN]]] mask %[[MASK]]
// CHECK-NEXT:    arith.constant 1.000000e+00 : f32
// CHECK-NEXT:    tile.splat
// CHECK-NEXT:    %[[Y:.*]] = arith.addf %[[X]], %{{.*}} : tensor<64xf32>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[Y]] mask %[[MASK]]

// TRITON-LABEL: # --- kernel @transpose_k0
// TRITON:           [[I:v_[0-9]+]] = [[OFF:v_[0-9]+]] // {{v_[0-9]+}}
// TRITON:           [[J:v_[0-9]+]] = [[OFF]] % {{v_[0-9]+}}
// TRITON-NEXT:      [[C33:v_[0-9]+]] = tl.full((64,), 33, tl.int32)
// TRITON-NEXT:      [[JS:v_[0-9]+]] = [[J]] * [[C33]]
// TRITON-NEXT:      [[IN:v_[0-9]+]] = [[JS]] + [[I]]
// TRITON-NEXT:      {{v_[0-9]+}} = tl.load(in0 + [[IN]], mask={{v_[0-9]+}}, other=0)

func.func @transpose(%x: tensor<7x33xf32>) -> tensor<33x7xf32> {
  %0 = schedule.kernel @transpose_k0(%a = %x) : (tensor<7x33xf32>) -> tensor<33x7xf32> {
    %1 = graph.transpose %a {perm = [1, 0]} : tensor<7x33xf32> -> tensor<33x7xf32>
    %c = graph.constant dense<1.000000e+00> : tensor<f32>
    %2 = graph.add %1, %c : tensor<33x7xf32>, tensor<f32> -> tensor<33x7xf32>
    schedule.yield %2 : tensor<33x7xf32>
  }
  func.return %0 : tensor<33x7xf32>
}

// -----

// A strided slice: output (i, j) reads the input at (2 i + 1, j + 3), i.e. offset
// (2 i + 1) * 33 + (j + 3); 90 elements, 2 programs.
// CHECK-LABEL: tile.kernel @slice_k0
// CHECK-SAME:    grid [2, 1, 1]
// CHECK:         %[[MASK:.*]] = tile.cmp "lt" %[[OFF:.*]], %{{.*}} : tensor<64xi32> -> tensor<64xi1>
// CHECK:         %[[I:.*]] = arith.divsi %[[OFF]], %{{.*}} : tensor<64xi32>
// CHECK:         %[[J:.*]] = arith.remsi %[[OFF]], %{{.*}} : tensor<64xi32>
// CHECK-NEXT:    %[[C2:.*]] = arith.constant 2 : i32
// CHECK-NEXT:    %[[C2S:.*]] = tile.splat %[[C2]]
// CHECK-NEXT:    %[[I2:.*]] = arith.muli %[[I]], %[[C2S]] : tensor<64xi32>
// CHECK-NEXT:    %[[C1:.*]] = arith.constant 1 : i32
// CHECK-NEXT:    %[[C1S:.*]] = tile.splat %[[C1]]
// CHECK-NEXT:    %[[ROW:.*]] = arith.addi %[[I2]], %[[C1S]] : tensor<64xi32>
// CHECK-NEXT:    %[[C3:.*]] = arith.constant 3 : i32
// CHECK-NEXT:    %[[C3S:.*]] = tile.splat %[[C3]]
// CHECK-NEXT:    %[[COL:.*]] = arith.addi %[[J]], %[[C3S]] : tensor<64xi32>
// CHECK-NEXT:    %[[C33:.*]] = arith.constant 33 : i32
// CHECK-NEXT:    %[[C33S:.*]] = tile.splat %[[C33]]
// CHECK-NEXT:    %[[ROWS:.*]] = arith.muli %[[ROW]], %[[C33S]] : tensor<64xi32>
// CHECK-NEXT:    %[[IN:.*]] = arith.addi %[[ROWS]], %[[COL]] : tensor<64xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[IN]]] mask %[[MASK]]
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[X]] mask %[[MASK]]

// TRITON-LABEL: # --- kernel @slice_k0
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}, mask=[[MASK:v_[0-9]+]], other=0)
// TRITON-NEXT:      tl.store(out0 + {{v_[0-9]+}}, [[X]], mask=[[MASK]])

func.func @slice(%x: tensor<7x33xf32>) -> tensor<3x30xf32> {
  %0 = schedule.kernel @slice_k0(%a = %x) : (tensor<7x33xf32>) -> tensor<3x30xf32> {
    %1 = graph.slice %a {starts = [1, 3], limits = [6, 33], strides = [2, 1]} : tensor<7x33xf32> -> tensor<3x30xf32>
    schedule.yield %1 : tensor<3x30xf32>
  }
  func.return %0 : tensor<3x30xf32>
}

// -----

// reshape goes through the flat offset: the output [3, 4, 5] at flat offset f reads the
// input [6, 10] at (f / 10, f % 10). (A reshape alone is a torch view with no tile
// kernel, see the end of this file; here an exp consumes it.)
// CHECK-LABEL: tile.kernel @reshape_k0
// CHECK-SAME:    grid [1, 1, 1]
// CHECK:         %[[MASK:.*]] = tile.cmp "lt" %[[OFF:.*]], %{{.*}} : tensor<64xi32> -> tensor<64xi1>
// CHECK-NEXT:    %[[C10:.*]] = arith.constant 10 : i32
// CHECK-NEXT:    %[[C10S:.*]] = tile.splat %[[C10]]
// CHECK-NEXT:    %[[ROW:.*]] = arith.divsi %[[OFF]], %[[C10S]] : tensor<64xi32>
// CHECK:         %[[COL:.*]] = arith.remsi %[[OFF]], %{{.*}} : tensor<64xi32>
// CHECK:         %[[ROWS:.*]] = arith.muli %[[ROW]], %{{.*}} : tensor<64xi32>
// CHECK-NEXT:    %[[IN:.*]] = arith.addi %[[ROWS]], %[[COL]] : tensor<64xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[IN]]] mask %[[MASK]]
// CHECK-NEXT:    %[[E:.*]] = math.exp %[[X]]
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[E]] mask %[[MASK]]

// TRITON-LABEL: # --- kernel @reshape_k0
// TRITON:           tl.store(out0 + {{v_[0-9]+}}, {{v_[0-9]+}}, mask={{v_[0-9]+}})

func.func @reshape(%x: tensor<6x10xf32>) -> tensor<3x4x5xf32> {
  %0 = schedule.kernel @reshape_k0(%a = %x) : (tensor<6x10xf32>) -> tensor<3x4x5xf32> {
    %1 = graph.reshape %a : tensor<6x10xf32> -> tensor<3x4x5xf32>
    %2 = graph.exp %1 : tensor<3x4x5xf32> -> tensor<3x4x5xf32>
    schedule.yield %2 : tensor<3x4x5xf32>
  }
  func.return %0 : tensor<3x4x5xf32>
}

// -----

// concat along columns: each operand is read at its clamped column (j - start), and the
// later operand wins from its start column on (j >= 3 selects %y). 32 elements: no mask.
// CHECK-LABEL: tile.kernel @concat_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [1, 1, 1]
// CHECK-NOT:     tile.cmp "lt"
// CHECK:         %[[J:.*]] = arith.remsi %[[OFF:.*]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[LO0:.*]] = arith.maxsi
// CHECK:         %[[J0:.*]] = arith.minsi %[[LO0]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[X:.*]] = tile.load %in0[%{{.*}}] : !tile.ptr<f32>, tensor<32xi32> -> tensor<32xf32>
// CHECK:         arith.subi %[[J]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[LO1:.*]] = arith.maxsi
// CHECK:         %[[J1:.*]] = arith.minsi %[[LO1]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[Y:.*]] = tile.load %in1[%{{.*}}] : !tile.ptr<f32>, tensor<32xi32> -> tensor<32xf32>
// CHECK-NEXT:    %[[C3:.*]] = arith.constant 3 : i32
// CHECK-NEXT:    %[[C3S:.*]] = tile.splat %[[C3]]
// CHECK-NEXT:    %[[LATER:.*]] = tile.cmp "ge" %[[J]], %[[C3S]] : tensor<32xi32> -> tensor<32xi1>
// CHECK-NEXT:    %[[OUT:.*]] = tile.select %[[LATER]], %[[Y]], %[[X]] : tensor<32xi1>, tensor<32xf32>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[OUT]] : !tile.ptr<f32>, tensor<32xi32>, tensor<32xf32>{{$}}

// TRITON-LABEL: # --- kernel @concat_k0
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}){{$}}
// TRITON:           [[Y:v_[0-9]+]] = tl.load(in1 + {{v_[0-9]+}}){{$}}
// TRITON-NEXT:      [[C3:v_[0-9]+]] = tl.full((32,), 3, tl.int32)
// TRITON-NEXT:      [[LATER:v_[0-9]+]] = {{v_[0-9]+}} >= [[C3]]
// TRITON-NEXT:      [[OUT:v_[0-9]+]] = tl.where([[LATER]], [[Y]], [[X]])
// TRITON-NEXT:      tl.store(out0 + {{v_[0-9]+}}, [[OUT]]){{$}}

func.func @concat(%x: tensor<4x3xf32>, %y: tensor<4x5xf32>) -> tensor<4x8xf32> {
  %0 = schedule.kernel @concat_k0(%a = %x, %b = %y) : (tensor<4x3xf32>, tensor<4x5xf32>) -> tensor<4x8xf32> {
    %1 = graph.concat %a, %b {axis = 1} : tensor<4x3xf32>, tensor<4x5xf32> -> tensor<4x8xf32>
    schedule.yield %1 : tensor<4x8xf32>
  }
  func.return %0 : tensor<4x8xf32>
}

// -----

// split: one pass over the input; each output is stored where the column lies in its
// range [start, start + size), at column j - start of its own row length.
// CHECK-LABEL: tile.kernel @split_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %out0: !tile.ptr<f32>, %out1: !tile.ptr<f32>) grid [1, 1, 1]
// CHECK:         %[[I:.*]] = arith.divsi %[[OFF:.*]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[J:.*]] = arith.remsi %[[OFF]], %{{.*}} : tensor<32xi32>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[OFF]]] : !tile.ptr<f32>, tensor<32xi32> -> tensor<32xf32>
// CHECK:         %[[GE0:.*]] = tile.cmp "ge" %[[J]], %{{.*}}
// CHECK:         %[[LT3:.*]] = tile.cmp "lt" %[[J]], %{{.*}}
// CHECK-NEXT:    %[[IN0:.*]] = arith.andi %[[GE0]], %[[LT3]] : tensor<32xi1>
// CHECK:         tile.store %out0[%{{.*}}], %[[X]] mask %[[IN0]]
// CHECK:         %[[GE3:.*]] = tile.cmp "ge" %[[J]], %{{.*}}
// CHECK:         %[[LT8:.*]] = tile.cmp "lt" %[[J]], %{{.*}}
// CHECK-NEXT:    %[[IN1:.*]] = arith.andi %[[GE3]], %[[LT8]] : tensor<32xi1>
// CHECK:         tile.store %out1[%{{.*}}], %[[X]] mask %[[IN1]]
// CHECK-NEXT:    tile.return

// TRITON-LABEL: # --- kernel @split_k0
// TRITON:       def split_k0(in0, out0, out1):
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}){{$}}
// TRITON:           tl.store(out0 + {{v_[0-9]+}}, [[X]], mask={{v_[0-9]+}})
// TRITON:           tl.store(out1 + {{v_[0-9]+}}, [[X]], mask={{v_[0-9]+}})

func.func @split(%x: tensor<4x8xf32>) -> (tensor<4x3xf32>, tensor<4x5xf32>) {
  %0, %1 = schedule.kernel @split_k0(%a = %x) : (tensor<4x8xf32>) -> (tensor<4x3xf32>, tensor<4x5xf32>) {
    %2, %3 = graph.split %a {axis = 1} : tensor<4x8xf32> -> (tensor<4x3xf32>, tensor<4x5xf32>)
    schedule.yield %2, %3 : tensor<4x3xf32>, tensor<4x5xf32>
  }
  func.return %0, %1 : tensor<4x3xf32>, tensor<4x5xf32>
}

// -----

// gather: the i64 index of the output row is loaded, converted to i32, wrapped when
// negative (+10) and clamped to [0, 9], then the table row is read.
// CHECK-LABEL: tile.kernel @gather_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<i64>, %out0: !tile.ptr<f32>) grid [1, 1, 1]
// CHECK:         %[[MASK:.*]] = tile.cmp "lt" %[[OFF:.*]], %{{.*}} : tensor<32xi32> -> tensor<32xi1>
// CHECK:         %[[I:.*]] = arith.divsi %[[OFF]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[J:.*]] = arith.remsi %[[OFF]], %{{.*}} : tensor<32xi32>
// CHECK-NEXT:    %[[IDX:.*]] = tile.load %in1[%[[I]]] mask %[[MASK]] : !tile.ptr<i64>, tensor<32xi32>, tensor<32xi1> -> tensor<32xi64>
// CHECK-NEXT:    %[[IDX32:.*]] = tile.convert %[[IDX]] : tensor<32xi64> -> tensor<32xi32>
// CHECK:         %[[NEG:.*]] = tile.cmp "lt" %[[IDX32]], %{{.*}}
// CHECK:         %[[WRAPPED:.*]] = arith.addi %[[IDX32]], %{{.*}}
// CHECK-NEXT:    %[[SEL:.*]] = tile.select %[[NEG]], %[[WRAPPED]], %[[IDX32]] : tensor<32xi1>, tensor<32xi32>
// CHECK:         %[[LO:.*]] = arith.maxsi %[[SEL]], %{{.*}}
// CHECK:         %[[ROW:.*]] = arith.minsi %[[LO]], %{{.*}}
// CHECK:         %[[ROWS:.*]] = arith.muli %[[ROW]], %{{.*}}
// CHECK-NEXT:    %[[IN:.*]] = arith.addi %[[ROWS]], %[[J]]
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[IN]]] mask %[[MASK]]
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[X]] mask %[[MASK]]

// TRITON-LABEL: # --- kernel @gather_k0
// TRITON:           [[IDX:v_[0-9]+]] = tl.load(in1 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON-NEXT:      {{v_[0-9]+}} = [[IDX]].to(tl.int32)
// TRITON:           tl.where(
// TRITON:           tl.maximum(
// TRITON:           tl.minimum(

func.func @gather(%t: tensor<10x6xf32>, %i: tensor<5xi64>) -> tensor<5x6xf32> {
  %0 = schedule.kernel @gather_k0(%a = %t, %b = %i) : (tensor<10x6xf32>, tensor<5xi64>) -> tensor<5x6xf32> {
    %1 = graph.gather %a, %b {axis = 0} : tensor<10x6xf32>, tensor<5xi64> -> tensor<5x6xf32>
    schedule.yield %1 : tensor<5x6xf32>
  }
  func.return %0 : tensor<5x6xf32>
}

// -----

// all_slice: this rank's index along tp comes in as the i32 argument %rank_tp (named in
// the kernel's positions attribute); the rank's rows start at rank_tp * 4.
// CHECK-LABEL: tile.kernel @all_slice_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %out0: !tile.ptr<f32>, %rank_tp: i32) grid [1, 1, 1] warps 4 stages 1 attributes {positions = [["tp"]]} {
// CHECK:         %[[I:.*]] = arith.divsi %[[OFF:.*]], %{{.*}} : tensor<32xi32>
// CHECK:         %[[J:.*]] = arith.remsi %[[OFF]], %{{.*}} : tensor<32xi32>
// CHECK-NEXT:    %[[C4:.*]] = arith.constant 4 : i32
// CHECK-NEXT:    %[[START:.*]] = arith.muli %rank_tp, %[[C4]] : i32
// CHECK-NEXT:    %[[STARTS:.*]] = tile.splat %[[START]] : i32 -> tensor<32xi32>
// CHECK-NEXT:    %[[ROW:.*]] = arith.addi %[[I]], %[[STARTS]] : tensor<32xi32>
// CHECK:         %[[ROWS:.*]] = arith.muli %[[ROW]], %{{.*}}
// CHECK-NEXT:    %[[IN:.*]] = arith.addi %[[ROWS]], %[[J]]
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[IN]]] mask %{{.*}}
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[X]] mask %{{.*}}

// TRITON-LABEL: # --- kernel @all_slice_k0
// TRITON:       def all_slice_k0(in0, out0, rank_tp):
// TRITON:           [[START:v_[0-9]+]] = rank_tp * 4
// TRITON-NEXT:      {{v_[0-9]+}} = tl.full((32,), [[START]], tl.int32)

graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @all_slice(%x: tensor<8x6xf32>) -> tensor<4x6xf32> attributes {graph.partitioned} {
  %0 = schedule.kernel @all_slice_k0(%a = %x) : (tensor<8x6xf32>) -> tensor<4x6xf32> {
    %1 = graph.all_slice %a {axes = [tp], dim = 0} : tensor<8x6xf32> -> tensor<4x6xf32>
    schedule.yield %1 : tensor<4x6xf32>
  }
  func.return %0 : tensor<4x6xf32>
}
