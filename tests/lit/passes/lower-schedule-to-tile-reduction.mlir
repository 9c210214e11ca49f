// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{row_elements=128}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{row_elements=128}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{row_elements=128}' -t triton | filecheck %s --check-prefix=TRITON

// Row reductions: a program takes `rows` rows (row_elements / next_pow2(row width), at
// most the row count rounded up to a power of two) and a whole reduced row as one
// [rows x next_pow2(width)] block; the grid is ceil(rows / block rows). The row mask
// appears only when the row count is not a multiple of the block rows, the column mask
// only when the width is not a power of two; masked lanes hold the reduction's identity
// (0 for sums, -inf for max) before tile.reduce. Prologue and epilogue ops are evaluated
// on the same block.

// sum over the last axis: 6 rows of 40, 2 rows x 64 per program, 3 programs; 6 rows
// need no row mask, 40 columns need a column mask.
// CHECK-LABEL: tile.kernel @sum_last_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [3, 1, 1] warps 4 stages 1 {
// CHECK-NEXT:    %[[PID:.*]] = tile.program_id 0 : i32
// CHECK-NEXT:    %[[C2:.*]] = arith.constant 2 : i32
// CHECK-NEXT:    %[[FIRST:.*]] = arith.muli %[[PID]], %[[C2]] : i32
// CHECK-NEXT:    %[[RA:.*]] = tile.arange : tensor<2xi32>
// CHECK-NEXT:    %[[RE:.*]] = tile.expand_dims %[[RA]], 1 : tensor<2xi32> -> tensor<2x1xi32>
// CHECK-NEXT:    %[[FS:.*]] = tile.splat %[[FIRST]] : i32 -> tensor<2x1xi32>
// CHECK-NEXT:    %[[ROW:.*]] = arith.addi %[[FS]], %[[RE]] : tensor<2x1xi32>
// CHECK-NEXT:    %[[CA:.*]] = tile.arange : tensor<64xi32>
// CHECK-NEXT:    %[[COL:.*]] = tile.expand_dims %[[CA]], 0 : tensor<64xi32> -> tensor<1x64xi32>
// CHECK-NEXT:    %[[C40:.*]] = arith.constant 40 : i32
// CHECK-NEXT:    %[[C40S:.*]] = tile.splat %[[C40]] : i32 -> tensor<1x64xi32>
// CHECK-NEXT:    %[[CMASK:.*]] = tile.cmp "lt" %[[COL]], %[[C40S]] : tensor<1x64xi32> -> tensor<1x64xi1>
// CHECK-NOT:     tile.cmp
// CHECK:         %[[X:.*]] = tile.load %in0[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<2x64xi32>, tensor<2x64xi1> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    %[[CM:.*]] = tile.broadcast %[[CMASK]] : tensor<1x64xi1> -> tensor<2x64xi1>
// CHECK-NEXT:    %[[ZEROS:.*]] = tile.splat %[[ZERO]] : f32 -> tensor<2x64xf32>
// CHECK-NEXT:    %[[XM:.*]] = tile.select %[[CM]], %[[X]], %[[ZEROS]] : tensor<2x64xi1>, tensor<2x64xf32>
// CHECK-NEXT:    %[[S:.*]] = tile.reduce "sum" %[[XM]], 1 : tensor<2x64xf32> -> tensor<2xf32>
// CHECK-NEXT:    %[[SE:.*]] = tile.expand_dims %[[S]], 1 : tensor<2xf32> -> tensor<2x1xf32>
// CHECK-NEXT:    tile.store %out0[%[[ROW]]], %[[SE]] : !tile.ptr<f32>, tensor<2x1xi32>, tensor<2x1xf32>{{$}}
// CHECK-NEXT:    tile.return

// TRITON-LABEL: # --- kernel @sum_last_k0
// TRITON:       def sum_last_k0(in0, out0):
// TRITON:           [[ROW:v_[0-9]+]] = {{v_[0-9]+}} + {{v_[0-9]+}}
// TRITON-NEXT:      {{v_[0-9]+}} = tl.arange(0, 64)
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON:           [[ZEROS:v_[0-9]+]] = tl.full((2, 64), 0.0, tl.float32)
// TRITON-NEXT:      [[XM:v_[0-9]+]] = tl.where({{v_[0-9]+}}, [[X]], [[ZEROS]])
// TRITON-NEXT:      [[S:v_[0-9]+]] = tl.sum([[XM]], axis=1)
// TRITON-NEXT:      [[SE:v_[0-9]+]] = tl.expand_dims([[S]], 1)
// TRITON-NEXT:      tl.store(out0 + [[ROW]], [[SE]]){{$}}

func.func @sum_last(%x: tensor<6x40xf32>) -> tensor<6xf32> {
  %0 = schedule.kernel @sum_last_k0(%a = %x) : (tensor<6x40xf32>) -> tensor<6xf32> {
    %1 = graph.sum %a {axes = [1], keepdims = false} : tensor<6x40xf32> -> tensor<6xf32>
    schedule.yield %1 : tensor<6xf32>
  }
  func.return %0 : tensor<6xf32>
}

// -----

// mean over the first axis: the 40 columns are the rows (16 per program, masked), the 6
// rows are the reduced row (8 lanes, masked); the block reads x[r, row] at r * 40 + row.
// CHECK-LABEL: tile.kernel @mean_first_k0
// CHECK-SAME:    grid [3, 1, 1]
// CHECK:         %[[ROW:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<16x1xi32>
// CHECK-NEXT:    %[[C40:.*]] = arith.constant 40 : i32
// CHECK-NEXT:    %[[C40S:.*]] = tile.splat %[[C40]] : i32 -> tensor<16x1xi32>
// CHECK-NEXT:    %[[RMASK:.*]] = tile.cmp "lt" %[[ROW]], %[[C40S]] : tensor<16x1xi32> -> tensor<16x1xi1>
// CHECK-NEXT:    %[[CA:.*]] = tile.arange : tensor<8xi32>
// CHECK-NEXT:    %[[R:.*]] = tile.expand_dims %[[CA]], 0 : tensor<8xi32> -> tensor<1x8xi32>
// CHECK-NEXT:    %[[C6:.*]] = arith.constant 6 : i32
// CHECK-NEXT:    %[[C6S:.*]] = tile.splat %[[C6]] : i32 -> tensor<1x8xi32>
// CHECK-NEXT:    %[[CMASK:.*]] = tile.cmp "lt" %[[R]], %[[C6S]] : tensor<1x8xi32> -> tensor<1x8xi1>
// CHECK-NEXT:    %[[C40B:.*]] = arith.constant 40 : i32
// CHECK-NEXT:    %[[C40BS:.*]] = tile.splat %[[C40B]] : i32 -> tensor<1x8xi32>
// CHECK-NEXT:    %[[RS:.*]] = arith.muli %[[R]], %[[C40BS]] : tensor<1x8xi32>
// CHECK-NEXT:    %[[RSB:.*]] = tile.broadcast %[[RS]] : tensor<1x8xi32> -> tensor<16x8xi32>
// CHECK-NEXT:    %[[ROWB:.*]] = tile.broadcast %[[ROW]] : tensor<16x1xi32> -> tensor<16x8xi32>
// CHECK-NEXT:    %[[OFF:.*]] = arith.addi %[[RSB]], %[[ROWB]] : tensor<16x8xi32>
// CHECK-NEXT:    %[[RM:.*]] = tile.broadcast %[[RMASK]] : tensor<16x1xi1> -> tensor<16x8xi1>
// CHECK-NEXT:    %[[CM:.*]] = tile.broadcast %[[CMASK]] : tensor<1x8xi1> -> tensor<16x8xi1>
// CHECK-NEXT:    %[[M:.*]] = arith.andi %[[RM]], %[[CM]] : tensor<16x8xi1>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[OFF]]] mask %[[M]] : !tile.ptr<f32>, tensor<16x8xi32>, tensor<16x8xi1> -> tensor<16x8xf32>
// CHECK:         %[[XM:.*]] = tile.select %{{.*}}, %[[X]], %{{.*}} : tensor<16x8xi1>, tensor<16x8xf32>
// CHECK-NEXT:    %[[S:.*]] = tile.reduce "sum" %[[XM]], 1 : tensor<16x8xf32> -> tensor<16xf32>
// CHECK-NEXT:    %[[SE:.*]] = tile.expand_dims %[[S]], 1 : tensor<16xf32> -> tensor<16x1xf32>
// CHECK-NEXT:    %[[N:.*]] = arith.constant 6.000000e+00 : f32
// CHECK-NEXT:    %[[NS:.*]] = tile.splat %[[N]] : f32 -> tensor<16x1xf32>
// CHECK-NEXT:    %[[MEAN:.*]] = arith.divf %[[SE]], %[[NS]] : tensor<16x1xf32>
// CHECK-NEXT:    tile.store %out0[%[[ROW]]], %[[MEAN]] mask %[[RMASK]] : !tile.ptr<f32>, tensor<16x1xi32>, tensor<16x1xf32>, tensor<16x1xi1>

// TRITON-LABEL: # --- kernel @mean_first_k0
// TRITON:           [[S:v_[0-9]+]] = tl.sum({{v_[0-9]+}}, axis=1)
// TRITON-NEXT:      [[SE:v_[0-9]+]] = tl.expand_dims([[S]], 1)
// TRITON-NEXT:      [[N:v_[0-9]+]] = tl.full((16, 1), 6.0, tl.float32)
// TRITON-NEXT:      [[MEAN:v_[0-9]+]] = [[SE]] / [[N]]
// TRITON-NEXT:      tl.store(out0 + {{v_[0-9]+}}, [[MEAN]], mask={{v_[0-9]+}})

func.func @mean_first(%x: tensor<6x40xf32>) -> tensor<40xf32> {
  %0 = schedule.kernel @mean_first_k0(%a = %x) : (tensor<6x40xf32>) -> tensor<40xf32> {
    %1 = graph.mean %a {axes = [0], keepdims = false} : tensor<6x40xf32> -> tensor<40xf32>
    schedule.yield %1 : tensor<40xf32>
  }
  func.return %0 : tensor<40xf32>
}

// -----

// max over the middle axis with keepdims: the 3 x 7 kept positions are the rows (the
// row index unflattens to (row / 7, row % 7)); masked lanes hold -inf; a row holding a
// NaN gives NaN (counted apart: tl.max skips NaN); the [3, 1, 7] output is stored at
// (row / 7) * 7 + row % 7.
// CHECK-LABEL: tile.kernel @max_middle_k0
// CHECK-SAME:    grid [2, 1, 1]
// CHECK:         %[[RMASK:.*]] = tile.cmp "lt" %[[ROW:.*]], %{{.*}} : tensor<16x1xi32> -> tensor<16x1xi1>
// CHECK:         %[[CMASK:.*]] = tile.cmp "lt" %{{.*}}, %{{.*}} : tensor<1x8xi32> -> tensor<1x8xi1>
// CHECK:         %[[OUTER:.*]] = arith.divsi %[[ROW]], %{{.*}} : tensor<16x1xi32>
// CHECK:         %[[INNER:.*]] = arith.remsi %[[ROW]], %{{.*}} : tensor<16x1xi32>
// CHECK:         %[[X:.*]] = tile.load %in0[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<16x8xi32>, tensor<16x8xi1> -> tensor<16x8xf32>
// CHECK-NEXT:    %[[NEGINF:.*]] = arith.constant 0xff800000 : f32
// CHECK-NEXT:    %[[CM:.*]] = tile.broadcast %[[CMASK]] : tensor<1x8xi1> -> tensor<16x8xi1>
// CHECK-NEXT:    %[[NEGINFS:.*]] = tile.splat %[[NEGINF]] : f32 -> tensor<16x8xf32>
// CHECK-NEXT:    %[[XM:.*]] = tile.select %[[CM]], %[[X]], %[[NEGINFS]] : tensor<16x8xi1>, tensor<16x8xf32>
// CHECK-NEXT:    %[[MX:.*]] = tile.reduce "max" %[[XM]], 1 : tensor<16x8xf32> -> tensor<16xf32>
// CHECK-NEXT:    %[[MXE:.*]] = tile.expand_dims %[[MX]], 1 : tensor<16xf32> -> tensor<16x1xf32>
// CHECK-NEXT:    %[[ISNAN:.*]] = tile.cmp "ne" %[[X]], %[[X]] : tensor<16x8xf32> -> tensor<16x8xi1>
// CHECK:         %[[NANS:.*]] = tile.select %[[ISNAN]], %{{.*}}, %{{.*}} : tensor<16x8xi1>, tensor<16x8xf32>
// CHECK-NEXT:    %[[NANSUM:.*]] = tile.reduce "sum" %[[NANS]], 1 : tensor<16x8xf32> -> tensor<16xf32>
// CHECK-NEXT:    %[[NANSUME:.*]] = tile.expand_dims %[[NANSUM]], 1 : tensor<16xf32> -> tensor<16x1xf32>
// CHECK:         %[[ANYNAN:.*]] = tile.cmp "gt" %[[NANSUME]], %{{.*}} : tensor<16x1xf32> -> tensor<16x1xi1>
// CHECK-NEXT:    %[[NAN:.*]] = arith.constant 0x7fc00000 : f32
// CHECK-NEXT:    %[[NANB:.*]] = tile.splat %[[NAN]] : f32 -> tensor<16x1xf32>
// CHECK-NEXT:    %[[RES:.*]] = tile.select %[[ANYNAN]], %[[NANB]], %[[MXE]] : tensor<16x1xi1>, tensor<16x1xf32>
// CHECK-NEXT:    %[[C7:.*]] = arith.constant 7 : i32
// CHECK-NEXT:    %[[C7S:.*]] = tile.splat %[[C7]] : i32 -> tensor<16x1xi32>
// CHECK-NEXT:    %[[O7:.*]] = arith.muli %[[OUTER]], %[[C7S]] : tensor<16x1xi32>
// CHECK-NEXT:    %[[OUT:.*]] = arith.addi %[[O7]], %[[INNER]] : tensor<16x1xi32>
// CHECK-NEXT:    tile.store %out0[%[[OUT]]], %[[RES]] mask %[[RMASK]] : !tile.ptr<f32>, tensor<16x1xi32>, tensor<16x1xf32>, tensor<16x1xi1>

// TRITON-LABEL: # --- kernel @max_middle_k0
// TRITON:           [[NEGINF:v_[0-9]+]] = tl.full((16, 8), float("-inf"), tl.float32)
// TRITON-NEXT:      [[XM:v_[0-9]+]] = tl.where({{v_[0-9]+}}, {{v_[0-9]+}}, [[NEGINF]])
// TRITON-NEXT:      {{v_[0-9]+}} = tl.max([[XM]], axis=1)
// TRITON:           [[NAN:v_[0-9]+]] = tl.full((16, 1), float("nan"), tl.float32)
// TRITON-NEXT:      {{v_[0-9]+}} = tl.where({{v_[0-9]+}}, [[NAN]], {{v_[0-9]+}})

func.func @max_middle(%x: tensor<3x5x7xf32>) -> tensor<3x1x7xf32> {
  %0 = schedule.kernel @max_middle_k0(%a = %x) : (tensor<3x5x7xf32>) -> tensor<3x1x7xf32> {
    %1 = graph.max %a {axes = [1], keepdims = true} : tensor<3x5x7xf32> -> tensor<3x1x7xf32>
    schedule.yield %1 : tensor<3x1x7xf32>
  }
  func.return %0 : tensor<3x1x7xf32>
}

// -----

// softmax with its scale prologue: rows of 32 are whole blocks (no column mask, no
// identity select); 4 rows per program, 6 rows: 2 programs and a row mask.
// CHECK-LABEL: tile.kernel @softmax_k0
// CHECK-SAME:    grid [2, 1, 1]
// CHECK:         %[[RMASK:.*]] = tile.cmp "lt" %{{.*}}, %{{.*}} : tensor<4x1xi32> -> tensor<4x1xi1>
// CHECK-NOT:     tile.cmp
// CHECK:         %[[OFF:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<4x32xi32>
// CHECK-NEXT:    %[[RM:.*]] = tile.broadcast %[[RMASK]] : tensor<4x1xi1> -> tensor<4x32xi1>
// CHECK-NEXT:    %[[X:.*]] = tile.load %in0[%[[OFF]]] mask %[[RM]] : !tile.ptr<f32>, tensor<4x32xi32>, tensor<4x32xi1> -> tensor<4x32xf32>
// CHECK-NEXT:    arith.constant 5.000000e-01 : f32
// CHECK-NEXT:    tile.splat
// CHECK-NEXT:    %[[XS:.*]] = arith.mulf %[[X]], %{{.*}} : tensor<4x32xf32>
// CHECK-NOT:     tile.select
// CHECK-NEXT:    %[[MX:.*]] = tile.reduce "max" %[[XS]], 1 : tensor<4x32xf32> -> tensor<4xf32>
// CHECK-NEXT:    %[[MXE:.*]] = tile.expand_dims %[[MX]], 1 : tensor<4xf32> -> tensor<4x1xf32>
// CHECK-NEXT:    %[[MXB:.*]] = tile.broadcast %[[MXE]] : tensor<4x1xf32> -> tensor<4x32xf32>
// CHECK-NEXT:    %[[SH:.*]] = arith.subf %[[XS]], %[[MXB]] : tensor<4x32xf32>
// CHECK-NEXT:    %[[E:.*]] = math.exp %[[SH]] : tensor<4x32xf32>
// CHECK-NEXT:    %[[S:.*]] = tile.reduce "sum" %[[E]], 1 : tensor<4x32xf32> -> tensor<4xf32>
// CHECK-NEXT:    %[[SE:.*]] = tile.expand_dims %[[S]], 1 : tensor<4xf32> -> tensor<4x1xf32>
// CHECK-NEXT:    %[[E2:.*]] = math.exp %[[SH]] : tensor<4x32xf32>
// CHECK-NEXT:    %[[SB:.*]] = tile.broadcast %[[SE]] : tensor<4x1xf32> -> tensor<4x32xf32>
// CHECK-NEXT:    %[[P:.*]] = arith.divf %[[E2]], %[[SB]] : tensor<4x32xf32>
// CHECK-NEXT:    %[[RM2:.*]] = tile.broadcast %[[RMASK]] : tensor<4x1xi1> -> tensor<4x32xi1>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[P]] mask %[[RM2]] : !tile.ptr<f32>, tensor<4x32xi32>, tensor<4x32xf32>, tensor<4x32xi1>

// TRITON-LABEL: # --- kernel @softmax_k0
// TRITON-NOT:       tl.where
// TRITON:           [[MX:v_[0-9]+]] = tl.max({{v_[0-9]+}}, axis=1)
// TRITON:           [[E:v_[0-9]+]] = tl.exp({{v_[0-9]+}})
// TRITON-NEXT:      {{v_[0-9]+}} = tl.sum([[E]], axis=1)

func.func @softmax(%x: tensor<6x32xf32>) -> tensor<6x32xf32> {
  %0 = schedule.kernel @softmax_k0(%a = %x) : (tensor<6x32xf32>) -> tensor<6x32xf32> {
    %c = graph.constant dense<5.000000e-01> : tensor<f32>
    %1 = graph.mul %a, %c : tensor<6x32xf32>, tensor<f32> -> tensor<6x32xf32>
    %2 = graph.softmax %1 {axis = 1} : tensor<6x32xf32>
    schedule.yield %2 : tensor<6x32xf32>
  }
  func.return %0 : tensor<6x32xf32>
}

// -----

// log_softmax over the first axis: max, exp, sum, log; the result keeps the input's
// shape and is stored transposed back (r * 40 + row) under both masks.
// CHECK-LABEL: tile.kernel @log_softmax_k0
// CHECK-SAME:    grid [3, 1, 1]
// CHECK:         %[[X:.*]] = tile.load %in0[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<16x8xi32>, tensor<16x8xi1> -> tensor<16x8xf32>
// CHECK:         tile.reduce "max" %{{.*}}, 1 : tensor<16x8xf32> -> tensor<16xf32>
// CHECK:         %[[SH:.*]] = arith.subf %[[X]], %{{.*}} : tensor<16x8xf32>
// CHECK-NEXT:    %[[E:.*]] = math.exp %[[SH]] : tensor<16x8xf32>
// CHECK:         %[[EM:.*]] = tile.select %{{.*}}, %[[E]], %{{.*}} : tensor<16x8xi1>, tensor<16x8xf32>
// CHECK-NEXT:    %[[S:.*]] = tile.reduce "sum" %[[EM]], 1 : tensor<16x8xf32> -> tensor<16xf32>
// CHECK-NEXT:    %[[SE:.*]] = tile.expand_dims %[[S]], 1 : tensor<16xf32> -> tensor<16x1xf32>
// CHECK-NEXT:    %[[L:.*]] = math.log %[[SE]] : tensor<16x1xf32>
// CHECK-NEXT:    %[[LB:.*]] = tile.broadcast %[[L]] : tensor<16x1xf32> -> tensor<16x8xf32>
// CHECK-NEXT:    %[[OUT:.*]] = arith.subf %[[SH]], %[[LB]] : tensor<16x8xf32>
// CHECK:         %[[M:.*]] = arith.andi %{{.*}}, %{{.*}} : tensor<16x8xi1>
// CHECK-NEXT:    tile.store %out0[%{{.*}}], %[[OUT]] mask %[[M]] : !tile.ptr<f32>, tensor<16x8xi32>, tensor<16x8xf32>, tensor<16x8xi1>

// TRITON-LABEL: # --- kernel @log_softmax_k0
// TRITON:           [[L:v_[0-9]+]] = tl.log({{v_[0-9]+}})
// TRITON-NEXT:      [[LB:v_[0-9]+]] = tl.broadcast_to([[L]], (16, 8))
// TRITON-NEXT:      {{v_[0-9]+}} = {{v_[0-9]+}} - [[LB]]

func.func @log_softmax(%x: tensor<6x40xf32>) -> tensor<6x40xf32> {
  %0 = schedule.kernel @log_softmax_k0(%a = %x) : (tensor<6x40xf32>) -> tensor<6x40xf32> {
    %1 = graph.log_softmax %a {axis = 0} : tensor<6x40xf32>
    schedule.yield %1 : tensor<6x40xf32>
  }
  func.return %0 : tensor<6x40xf32>
}

// -----

// layer_norm with its affine epilogue: mean and biased variance as two masked sums,
// rsqrt(var + eps), then gamma and beta loaded once per column (a [1 x 64] block).
// CHECK-LABEL: tile.kernel @layer_norm_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<f32>, %in2: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [3, 1, 1]
// CHECK:         %[[CMASK:.*]] = tile.cmp "lt" %[[COL:.*]], %{{.*}} : tensor<1x64xi32> -> tensor<1x64xi1>
// CHECK:         %[[X:.*]] = tile.load %in0[%[[OFF:.*]]] mask %{{.*}} : !tile.ptr<f32>, tensor<2x64xi32>, tensor<2x64xi1> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[EPS:.*]] = arith.constant 1.000000e-05 : f32
// CHECK:         tile.reduce "sum" %{{.*}}, 1 : tensor<2x64xf32> -> tensor<2xf32>
// CHECK:         arith.constant 4.000000e+01 : f32
// CHECK:         %[[MEAN:.*]] = arith.divf
// CHECK-NEXT:    %[[MEANB:.*]] = tile.broadcast %[[MEAN]] : tensor<2x1xf32> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[C:.*]] = arith.subf %[[X]], %[[MEANB]] : tensor<2x64xf32>
// CHECK-NEXT:    %[[SQ:.*]] = arith.mulf %[[C]], %[[C]] : tensor<2x64xf32>
// CHECK:         %[[SQM:.*]] = tile.select %{{.*}}, %[[SQ]], %{{.*}} : tensor<2x64xi1>, tensor<2x64xf32>
// CHECK-NEXT:    tile.reduce "sum" %[[SQM]], 1 : tensor<2x64xf32> -> tensor<2xf32>
// CHECK:         %[[VAR:.*]] = arith.divf
// CHECK-NEXT:    %[[EPSS:.*]] = tile.splat %[[EPS]] : f32 -> tensor<2x1xf32>
// CHECK-NEXT:    %[[VE:.*]] = arith.addf %[[VAR]], %[[EPSS]] : tensor<2x1xf32>
// CHECK-NEXT:    %[[RS:.*]] = math.rsqrt %[[VE]] : tensor<2x1xf32>
// CHECK-NEXT:    %[[RSB:.*]] = tile.broadcast %[[RS]] : tensor<2x1xf32> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[N:.*]] = arith.mulf %[[C]], %[[RSB]] : tensor<2x64xf32>
// CHECK-NEXT:    %[[G:.*]] = tile.load %in1[%[[COL]]] mask %[[CMASK]] : !tile.ptr<f32>, tensor<1x64xi32>, tensor<1x64xi1> -> tensor<1x64xf32>
// CHECK-NEXT:    %[[GB:.*]] = tile.broadcast %[[G]] : tensor<1x64xf32> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[NG:.*]] = arith.mulf %[[N]], %[[GB]] : tensor<2x64xf32>
// CHECK-NEXT:    %[[B:.*]] = tile.load %in2[%[[COL]]] mask %[[CMASK]] : !tile.ptr<f32>, tensor<1x64xi32>, tensor<1x64xi1> -> tensor<1x64xf32>
// CHECK-NEXT:    %[[BB:.*]] = tile.broadcast %[[B]] : tensor<1x64xf32> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[Y:.*]] = arith.addf %[[NG]], %[[BB]] : tensor<2x64xf32>
// CHECK-NEXT:    %[[CM:.*]] = tile.broadcast %[[CMASK]] : tensor<1x64xi1> -> tensor<2x64xi1>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[Y]] mask %[[CM]] : !tile.ptr<f32>, tensor<2x64xi32>, tensor<2x64xf32>, tensor<2x64xi1>

// TRITON-LABEL: # --- kernel @layer_norm_k0
// TRITON:       def layer_norm_k0(in0, in1, in2, out0):
// TRITON:           tl.rsqrt(
// TRITON:           tl.load(in1 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON:           tl.load(in2 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)

func.func @layer_norm(%x: tensor<6x40xf32>, %w: tensor<40xf32>, %b: tensor<40xf32>) -> tensor<6x40xf32> {
  %0 = schedule.kernel @layer_norm_k0(%a = %x, %g = %w, %h = %b) : (tensor<6x40xf32>, tensor<40xf32>, tensor<40xf32>) -> tensor<6x40xf32> {
    %1 = graph.layer_norm %a {axes = [1], eps = 1.0e-05} : tensor<6x40xf32>
    %2 = graph.mul %1, %g : tensor<6x40xf32>, tensor<40xf32> -> tensor<6x40xf32>
    %3 = graph.add %2, %h : tensor<6x40xf32>, tensor<40xf32> -> tensor<6x40xf32>
    schedule.yield %3 : tensor<6x40xf32>
  }
  func.return %0 : tensor<6x40xf32>
}

// -----

// rms_norm in bf16 with a weight epilogue: computed in f32 (the loads convert), one
// masked sum of squares, converted back to bf16 for the store.
// CHECK-LABEL: tile.kernel @rms_norm_k0
// CHECK-SAME:    (%in0: !tile.ptr<bf16>, %in1: !tile.ptr<bf16>, %out0: !tile.ptr<bf16>) grid [3, 1, 1]
// CHECK:         %[[X:.*]] = tile.load %in0[%{{.*}}] mask %{{.*}} : !tile.ptr<bf16>, tensor<2x64xi32>, tensor<2x64xi1> -> tensor<2x64xbf16>
// CHECK-NEXT:    %[[XF:.*]] = tile.convert %[[X]] : tensor<2x64xbf16> -> tensor<2x64xf32>
// CHECK-NEXT:    arith.constant 1.000000e-06 : f32
// CHECK-NEXT:    %[[SQ:.*]] = arith.mulf %[[XF]], %[[XF]] : tensor<2x64xf32>
// CHECK:         %[[SQM:.*]] = tile.select %{{.*}}, %[[SQ]], %{{.*}} : tensor<2x64xi1>, tensor<2x64xf32>
// CHECK-NEXT:    tile.reduce "sum" %[[SQM]], 1 : tensor<2x64xf32> -> tensor<2xf32>
// CHECK:         %[[RS:.*]] = math.rsqrt %{{.*}} : tensor<2x1xf32>
// CHECK-NEXT:    %[[RSB:.*]] = tile.broadcast %[[RS]] : tensor<2x1xf32> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[N:.*]] = arith.mulf %[[XF]], %[[RSB]] : tensor<2x64xf32>
// CHECK-NEXT:    %[[W:.*]] = tile.load %in1[%{{.*}}] mask %{{.*}} : !tile.ptr<bf16>, tensor<1x64xi32>, tensor<1x64xi1> -> tensor<1x64xbf16>
// CHECK-NEXT:    %[[WF:.*]] = tile.convert %[[W]] : tensor<1x64xbf16> -> tensor<1x64xf32>
// CHECK-NEXT:    %[[WB:.*]] = tile.broadcast %[[WF]] : tensor<1x64xf32> -> tensor<2x64xf32>
// CHECK-NEXT:    %[[Y:.*]] = arith.mulf %[[N]], %[[WB]] : tensor<2x64xf32>
// CHECK-NEXT:    %[[YB:.*]] = tile.convert %[[Y]] : tensor<2x64xf32> -> tensor<2x64xbf16>
// CHECK-NEXT:    %[[CM:.*]] = tile.broadcast %{{.*}} : tensor<1x64xi1> -> tensor<2x64xi1>
// CHECK-NEXT:    tile.store %out0[%{{.*}}], %[[YB]] mask %[[CM]] : !tile.ptr<bf16>, tensor<2x64xi32>, tensor<2x64xbf16>, tensor<2x64xi1>

// TRITON-LABEL: # --- kernel @rms_norm_k0
// TRITON:           [[X:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON-NEXT:      {{v_[0-9]+}} = [[X]].to(tl.float32)
// TRITON:           [[YB:v_[0-9]+]] = {{v_[0-9]+}}.to(tl.bfloat16)
// TRITON-NEXT:      [[CM:v_[0-9]+]] = tl.broadcast_to({{v_[0-9]+}}, (2, 64))
// TRITON-NEXT:      tl.store(out0 + {{v_[0-9]+}}, [[YB]], mask=[[CM]])

func.func @rms_norm(%x: tensor<6x40xbf16>, %w: tensor<40xbf16>) -> tensor<6x40xbf16> {
  %0 = schedule.kernel @rms_norm_k0(%a = %x, %g = %w) : (tensor<6x40xbf16>, tensor<40xbf16>) -> tensor<6x40xbf16> {
    %1 = graph.rms_norm %a {axes = [1], eps = 1.0e-06} : tensor<6x40xbf16>
    %2 = graph.mul %1, %g : tensor<6x40xbf16>, tensor<40xbf16> -> tensor<6x40xbf16>
    schedule.yield %2 : tensor<6x40xbf16>
  }
  func.return %0 : tensor<6x40xbf16>
}

// -----

// cross_entropy as lower-graph-to-schedule leaves it: a per-row kernel (reduction none)
// and a mean kernel. Per row: max + log(sum(exp(x - max))) - x[label], the label loaded
// once per row, converted to i32 and compared with the column index. The mean of the 6
// losses is a single row of 8 lanes (one program, scalar output at offset 0).
// CHECK-LABEL: tile.kernel @cross_entropy_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<i64>, %out0: !tile.ptr<f32>) grid [1, 1, 1]
// CHECK:         %[[RMASK:.*]] = tile.cmp "lt" %[[ROW:.*]], %{{.*}} : tensor<8x1xi32> -> tensor<8x1xi1>
// CHECK:         %[[COL:.*]] = tile.expand_dims %{{.*}}, 0 : tensor<16xi32> -> tensor<1x16xi32>
// CHECK:         %[[X:.*]] = tile.load %in0[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<8x16xi32>, tensor<8x16xi1> -> tensor<8x16xf32>
// CHECK:         %[[MX:.*]] = tile.reduce "max" %{{.*}}, 1 : tensor<8x16xf32> -> tensor<8xf32>
// CHECK-NEXT:    %[[MXE:.*]] = tile.expand_dims %[[MX]], 1 : tensor<8xf32> -> tensor<8x1xf32>
// CHECK:         %[[E:.*]] = math.exp
// CHECK:         %[[S:.*]] = tile.reduce "sum" %{{.*}}, 1 : tensor<8x16xf32> -> tensor<8xf32>
// CHECK-NEXT:    %[[SE:.*]] = tile.expand_dims %[[S]], 1 : tensor<8xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[L:.*]] = tile.load %in1[%[[ROW]]] mask %[[RMASK]] : !tile.ptr<i64>, tensor<8x1xi32>, tensor<8x1xi1> -> tensor<8x1xi64>
// CHECK-NEXT:    %[[L32:.*]] = tile.convert %[[L]] : tensor<8x1xi64> -> tensor<8x1xi32>
// CHECK-NEXT:    %[[COLB:.*]] = tile.broadcast %[[COL]] : tensor<1x16xi32> -> tensor<8x16xi32>
// CHECK-NEXT:    %[[LB:.*]] = tile.broadcast %[[L32]] : tensor<8x1xi32> -> tensor<8x16xi32>
// CHECK-NEXT:    %[[HIT:.*]] = tile.cmp "eq" %[[COLB]], %[[LB]] : tensor<8x16xi32> -> tensor<8x16xi1>
// CHECK:         %[[PICK:.*]] = tile.select %[[HIT]], %[[X]], %{{.*}} : tensor<8x16xi1>, tensor<8x16xf32>
// CHECK-NEXT:    %[[PS:.*]] = tile.reduce "sum" %[[PICK]], 1 : tensor<8x16xf32> -> tensor<8xf32>
// CHECK-NEXT:    %[[PSE:.*]] = tile.expand_dims %[[PS]], 1 : tensor<8xf32> -> tensor<8x1xf32>
// CHECK-NEXT:    %[[LOG:.*]] = math.log %[[SE]] : tensor<8x1xf32>
// CHECK-NEXT:    %[[LSE:.*]] = arith.addf %[[MXE]], %[[LOG]] : tensor<8x1xf32>
// CHECK-NEXT:    %[[LOSS:.*]] = arith.subf %[[LSE]], %[[PSE]] : tensor<8x1xf32>
// CHECK-NEXT:    tile.store %out0[%[[ROW]]], %[[LOSS]] mask %[[RMASK]] : !tile.ptr<f32>, tensor<8x1xi32>, tensor<8x1xf32>, tensor<8x1xi1>
// CHECK-NEXT:    tile.return
// CHECK-LABEL: tile.kernel @cross_entropy_k1
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [1, 1, 1]
// CHECK:         %[[S:.*]] = tile.reduce "sum" %{{.*}}, 1 : tensor<1x8xf32> -> tensor<1xf32>
// CHECK-NEXT:    %[[SE:.*]] = tile.expand_dims %[[S]], 1 : tensor<1xf32> -> tensor<1x1xf32>
// CHECK-NEXT:    arith.constant 6.000000e+00 : f32
// CHECK-NEXT:    tile.splat
// CHECK-NEXT:    %[[MEAN:.*]] = arith.divf %[[SE]], %{{.*}} : tensor<1x1xf32>
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK-NEXT:    %[[ZEROS:.*]] = tile.splat %[[ZERO]] : i32 -> tensor<1x1xi32>
// CHECK-NEXT:    tile.store %out0[%[[ZEROS]]], %[[MEAN]] : !tile.ptr<f32>, tensor<1x1xi32>, tensor<1x1xf32>{{$}}

// TRITON-LABEL: # --- kernel @cross_entropy_k0
// TRITON:           [[L:v_[0-9]+]] = tl.load(in1 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON-NEXT:      [[L32:v_[0-9]+]] = [[L]].to(tl.int32)
// TRITON:           [[HIT:v_[0-9]+]] = {{v_[0-9]+}} == {{v_[0-9]+}}
// TRITON:           {{v_[0-9]+}} = tl.where([[HIT]], {{v_[0-9]+}}, {{v_[0-9]+}})
// TRITON-LABEL: # --- kernel @cross_entropy_k1
// TRITON:           tl.store(out0 + {{v_[0-9]+}}, {{v_[0-9]+}}){{$}}

func.func @cross_entropy(%x: tensor<6x11xf32>, %l: tensor<6xi64>) -> tensor<f32> {
  %0 = schedule.kernel @cross_entropy_k0(%a = %x, %b = %l) : (tensor<6x11xf32>, tensor<6xi64>) -> tensor<6xf32> {
    %1 = graph.cross_entropy %a, %b {reduction = none} : tensor<6x11xf32>, tensor<6xi64> -> tensor<6xf32>
    schedule.yield %1 : tensor<6xf32>
  }
  %2 = schedule.kernel @cross_entropy_k1(%c = %0) : (tensor<6xf32>) -> tensor<f32> {
    %3 = graph.mean %c {axes = [0], keepdims = false} : tensor<6xf32> -> tensor<f32>
    schedule.yield %3 : tensor<f32>
  }
  func.return %2 : tensor<f32>
}
