// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block_m=16 block_n=16 block_k=16}' | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block_m=16 block_n=16 block_k=16}' | tessera-opt --split-input-file | filecheck %s
// RUN: tessera-opt %s --split-input-file -p 'lower-schedule-to-tile{block_m=16 block_n=16 block_k=16}' -t triton | filecheck %s --check-prefix=TRITON

// Matmul kernels: one program per 16 x 16 output tile (grid axis 0, tile rows grouped
// for L2 reuse; grid axis 1 is the flattened batch), an scf.for K loop of tile.dot into
// an f32 accumulator carried by the loop, then the epilogue evaluated on the accumulator
// and a single store. Row, column and K masks appear only for sizes that are not block
// multiples.

// 64 x 32 @ 32 x 64: 16 tiles, two K steps, no mask anywhere; f32 operands use the
// IEEE dot (no TF32).
// CHECK-LABEL: tile.kernel @plain_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [16, 1, 1] warps 4 stages 1 {
// CHECK-NOT:     tile.cmp
// CHECK:         %[[ROW:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<16x1xi32>
// CHECK:         %[[COL:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<1x16xi32>
// CHECK:         %[[ACC0:.*]] = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
// CHECK-NEXT:    %[[K0:.*]] = arith.constant 0 : i32
// CHECK-NEXT:    %[[K:.*]] = arith.constant 32 : i32
// CHECK-NEXT:    %[[BK:.*]] = arith.constant 16 : i32
// CHECK-NEXT:    %[[RES:.*]] = scf.for %[[KK:.*]] = %[[K0]] to %[[K]] step %[[BK]] iter_args(%[[ACC:.*]] = %[[ACC0]]) -> (tensor<16x16xf32>) : i32 {
// CHECK-NOT:       tile.cmp
// CHECK:           %[[A:.*]] = tile.load %in0[%{{.*}}] : !tile.ptr<f32>, tensor<16x16xi32> -> tensor<16x16xf32>
// CHECK:           %[[B:.*]] = tile.load %in1[%{{.*}}] : !tile.ptr<f32>, tensor<16x16xi32> -> tensor<16x16xf32>
// CHECK-NEXT:      %[[D:.*]] = tile.dot %[[A]], %[[B]], %[[ACC]] : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT:      scf.yield %[[D]] : tensor<16x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[C64:.*]] = arith.constant 64 : i32
// CHECK-NEXT:    %[[C64S:.*]] = tile.splat %[[C64]] : i32 -> tensor<16x1xi32>
// CHECK-NEXT:    %[[RS:.*]] = arith.muli %[[ROW]], %[[C64S]] : tensor<16x1xi32>
// CHECK-NEXT:    %[[RSB:.*]] = tile.broadcast %[[RS]] : tensor<16x1xi32> -> tensor<16x16xi32>
// CHECK-NEXT:    %[[CB:.*]] = tile.broadcast %[[COL]] : tensor<1x16xi32> -> tensor<16x16xi32>
// CHECK-NEXT:    %[[OFF:.*]] = arith.addi %[[RSB]], %[[CB]] : tensor<16x16xi32>
// CHECK-NEXT:    tile.store %out0[%[[OFF]]], %[[RES]] : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xf32>{{$}}
// CHECK-NEXT:    tile.return

// TRITON-LABEL: # --- kernel @plain_k0
// TRITON:       def plain_k0(in0, in1, out0):
// TRITON-NEXT:      [[PID:v]] = tl.program_id(0)
// TRITON:           [[ACC0:v_[0-9]+]] = tl.full((16, 16), 0.0, tl.float32)
// TRITON-NEXT:      [[ACC:v_[0-9]+]] = [[ACC0]]
// TRITON-NEXT:      for [[KK:v_[0-9]+]] in range(0, 32, 16):
// TRITON-NEXT:          {{v_[0-9]+}} = tl.arange(0, 16)
// TRITON:              [[A:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}){{$}}
// TRITON:              [[B:v_[0-9]+]] = tl.load(in1 + {{v_[0-9]+}}){{$}}
// TRITON-NEXT:          [[D:v_[0-9]+]] = tl.dot([[A]], [[B]], [[ACC]], input_precision="ieee")
// TRITON-NEXT:          [[ACC]] = [[D]]
// TRITON-NEXT:      [[RES:v_[0-9]+]] = [[ACC]]
// TRITON:           tl.store(out0 + {{v_[0-9]+}}, [[RES]]){{$}}

func.func @plain(%x: tensor<64x32xf32>, %w: tensor<32x64xf32>) -> tensor<64x64xf32> {
  %0 = schedule.kernel @plain_k0(%a = %x, %b = %w) : (tensor<64x32xf32>, tensor<32x64xf32>) -> tensor<64x64xf32> {
    %1 = graph.matmul %a, %b : tensor<64x32xf32>, tensor<32x64xf32> -> tensor<64x64xf32>
    schedule.yield %1 : tensor<64x64xf32>
  }
  func.return %0 : tensor<64x64xf32>
}

// -----

// A batched bf16 matmul whose rhs broadcasts over the batch: grid [2 x 2 tiles, 3
// batches]; program_id 1 picks the batch: the lhs starts at batch * 20 * 48, the rhs at 0
// for every batch, the output at batch * 20 * 17. M = 20 and N = 17 need row and column
// masks, K = 48 none; the f32 accumulator is converted to bf16 for the store.
// CHECK-LABEL: tile.kernel @batched_k0
// CHECK-SAME:    (%in0: !tile.ptr<bf16>, %in1: !tile.ptr<bf16>, %out0: !tile.ptr<bf16>) grid [4, 3, 1] warps 4 stages 1 {
// CHECK:         %[[ROW:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<16x1xi32>
// CHECK:         %[[COL:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<1x16xi32>
// CHECK-NEXT:    %[[C20:.*]] = arith.constant 20 : i32
// CHECK-NEXT:    %[[C20S:.*]] = tile.splat %[[C20]] : i32 -> tensor<16x1xi32>
// CHECK-NEXT:    %[[RMASK:.*]] = tile.cmp "lt" %[[ROW]], %[[C20S]] : tensor<16x1xi32> -> tensor<16x1xi1>
// CHECK-NEXT:    %[[C17:.*]] = arith.constant 17 : i32
// CHECK-NEXT:    %[[C17S:.*]] = tile.splat %[[C17]] : i32 -> tensor<1x16xi32>
// CHECK-NEXT:    %[[CMASK:.*]] = tile.cmp "lt" %[[COL]], %[[C17S]] : tensor<1x16xi32> -> tensor<1x16xi1>
// CHECK-NEXT:    %[[BATCH:.*]] = tile.program_id 1 : i32
// CHECK-NEXT:    %[[LSTRIDE:.*]] = arith.constant 960 : i32
// CHECK-NEXT:    %[[LBASE:.*]] = arith.muli %[[BATCH]], %[[LSTRIDE]] : i32
// CHECK:         %[[RBASE:.*]] = arith.constant 0 : i32
// CHECK-NEXT:    %[[RBASES:.*]] = tile.splat %[[RBASE]] : i32 -> tensor<1x16xi32>
// CHECK-NEXT:    %{{.*}} = arith.addi %[[RBASES]], %[[COL]] : tensor<1x16xi32>
// CHECK:         %[[RES:.*]] = scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (tensor<16x16xf32>) : i32 {
// CHECK-NOT:       tile.cmp
// CHECK:           %[[AM:.*]] = tile.broadcast %[[RMASK]] : tensor<16x1xi1> -> tensor<16x16xi1>
// CHECK-NEXT:      %[[A:.*]] = tile.load %in0[%{{.*}}] mask %[[AM]] : !tile.ptr<bf16>, tensor<16x16xi32>, tensor<16x16xi1> -> tensor<16x16xbf16>
// CHECK:           %[[BM:.*]] = tile.broadcast %[[CMASK]] : tensor<1x16xi1> -> tensor<16x16xi1>
// CHECK-NEXT:      %[[B:.*]] = tile.load %in1[%{{.*}}] mask %[[BM]] : !tile.ptr<bf16>, tensor<16x16xi32>, tensor<16x16xi1> -> tensor<16x16xbf16>
// CHECK-NEXT:      %[[D:.*]] = tile.dot %[[A]], %[[B]], %[[ACC]] : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
// CHECK-NEXT:      scf.yield %[[D]] : tensor<16x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[OSTRIDE:.*]] = arith.constant 340 : i32
// CHECK-NEXT:    %{{.*}} = arith.muli %[[BATCH]], %[[OSTRIDE]] : i32
// CHECK:         %[[OUT:.*]] = tile.convert %[[RES]] : tensor<16x16xf32> -> tensor<16x16xbf16>
// CHECK-NEXT:    %[[RM:.*]] = tile.broadcast %[[RMASK]] : tensor<16x1xi1> -> tensor<16x16xi1>
// CHECK-NEXT:    %[[CM:.*]] = tile.broadcast %[[CMASK]] : tensor<1x16xi1> -> tensor<16x16xi1>
// CHECK-NEXT:    %[[M:.*]] = arith.andi %[[RM]], %[[CM]] : tensor<16x16xi1>
// CHECK-NEXT:    tile.store %out0[%{{.*}}], %[[OUT]] mask %[[M]] : !tile.ptr<bf16>, tensor<16x16xi32>, tensor<16x16xbf16>, tensor<16x16xi1>

// TRITON-LABEL: # --- kernel @batched_k0
// TRITON:           [[BATCH:v_[0-9]+]] = tl.program_id(1)
// TRITON-NEXT:      {{v_[0-9]+}} = [[BATCH]] * 960
// TRITON:           for {{v_[0-9]+}} in range(0, 48, 16):
// TRITON:               {{v_[0-9]+}} = tl.dot({{v_[0-9]+}}, {{v_[0-9]+}}, {{v_[0-9]+}}){{$}}
// TRITON:           {{v_[0-9]+}} = [[BATCH]] * 340
// TRITON:           {{v_[0-9]+}} = {{v_[0-9]+}}.to(tl.bfloat16)

func.func @batched(%x: tensor<3x20x48xbf16>, %w: tensor<48x17xbf16>) -> tensor<3x20x17xbf16> {
  %0 = schedule.kernel @batched_k0(%a = %x, %b = %w) : (tensor<3x20x48xbf16>, tensor<48x17xbf16>) -> tensor<3x20x17xbf16> {
    %1 = graph.matmul %a, %b : tensor<3x20x48xbf16>, tensor<48x17xbf16> -> tensor<3x20x17xbf16>
    schedule.yield %1 : tensor<3x20x17xbf16>
  }
  func.return %0 : tensor<3x20x17xbf16>
}

// -----

// bias + gelu(tanh) + residual fused as the epilogue of a 40 x 33 @ 33 x 20 matmul:
// 3 x 2 tiles; M, N and K = 33 are not block multiples, so the K loop masks its loads
// with row & k and k & column masks. After the loop, the bias is loaded once per column
// and the residual per element, and the result is stored once.
// CHECK-LABEL: tile.kernel @epilogue_k0
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<f32>, %in2: !tile.ptr<f32>, %in3: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [6, 1, 1] warps 4 stages 1 {
// CHECK:         %[[ROW:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<16x1xi32>
// CHECK:         %[[COL:.*]] = arith.addi %{{.*}}, %{{.*}} : tensor<1x16xi32>
// CHECK:         %[[RMASK:.*]] = tile.cmp "lt" %[[ROW]], %{{.*}} : tensor<16x1xi32> -> tensor<16x1xi1>
// CHECK:         %[[CMASK:.*]] = tile.cmp "lt" %[[COL]], %{{.*}} : tensor<1x16xi32> -> tensor<1x16xi1>
// CHECK:         arith.constant dense<0.000000e+00> : tensor<16x16xf32>
// CHECK-NEXT:    arith.constant 0 : i32
// CHECK-NEXT:    %[[K:.*]] = arith.constant 33 : i32
// CHECK-NEXT:    %[[BK:.*]] = arith.constant 16 : i32
// CHECK-NEXT:    %[[RES:.*]] = scf.for %[[KK:.*]] = %{{.*}} to %[[K]] step %[[BK]] iter_args(%[[ACC:.*]] = %{{.*}}) -> (tensor<16x16xf32>) : i32 {
// CHECK-NEXT:      %[[KR:.*]] = tile.arange : tensor<16xi32>
// CHECK-NEXT:      %[[KKS:.*]] = tile.splat %[[KK]] : i32 -> tensor<16xi32>
// CHECK-NEXT:      %[[KIDX:.*]] = arith.addi %[[KR]], %[[KKS]] : tensor<16xi32>
// CHECK-NEXT:      %[[C33:.*]] = arith.constant 33 : i32
// CHECK-NEXT:      %[[C33S:.*]] = tile.splat %[[C33]] : i32 -> tensor<16xi32>
// CHECK-NEXT:      %[[KMASK:.*]] = tile.cmp "lt" %[[KIDX]], %[[C33S]] : tensor<16xi32> -> tensor<16xi1>
// CHECK:           %[[KM0:.*]] = tile.expand_dims %[[KMASK]], 0 : tensor<16xi1> -> tensor<1x16xi1>
// CHECK-NEXT:      %[[RMB:.*]] = tile.broadcast %[[RMASK]] : tensor<16x1xi1> -> tensor<16x16xi1>
// CHECK-NEXT:      %[[KM0B:.*]] = tile.broadcast %[[KM0]] : tensor<1x16xi1> -> tensor<16x16xi1>
// CHECK-NEXT:      %[[AMASK:.*]] = arith.andi %[[RMB]], %[[KM0B]] : tensor<16x16xi1>
// CHECK-NEXT:      %[[KM1:.*]] = tile.expand_dims %[[KMASK]], 1 : tensor<16xi1> -> tensor<16x1xi1>
// CHECK-NEXT:      %[[KM1B:.*]] = tile.broadcast %[[KM1]] : tensor<16x1xi1> -> tensor<16x16xi1>
// CHECK-NEXT:      %[[CMB:.*]] = tile.broadcast %[[CMASK]] : tensor<1x16xi1> -> tensor<16x16xi1>
// CHECK-NEXT:      %[[BMASK:.*]] = arith.andi %[[KM1B]], %[[CMB]] : tensor<16x16xi1>
// CHECK:           %[[A:.*]] = tile.load %in0[%{{.*}}] mask %[[AMASK]] : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xi1> -> tensor<16x16xf32>
// CHECK:           %[[B:.*]] = tile.load %in1[%{{.*}}] mask %[[BMASK]] : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xi1> -> tensor<16x16xf32>
// CHECK-NEXT:      %[[D:.*]] = tile.dot %[[A]], %[[B]], %[[ACC]] : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT:      scf.yield %[[D]] : tensor<16x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[BIAS:.*]] = tile.load %in2[%[[COL]]] mask %[[CMASK]] : !tile.ptr<f32>, tensor<1x16xi32>, tensor<1x16xi1> -> tensor<1x16xf32>
// CHECK-NEXT:    %[[BIASB:.*]] = tile.broadcast %[[BIAS]] : tensor<1x16xf32> -> tensor<16x16xf32>
// CHECK-NEXT:    %[[H:.*]] = arith.addf %[[RES]], %[[BIASB]] : tensor<16x16xf32>
// CHECK:         math.tanh
// CHECK:         %[[G:.*]] = arith.mulf
// CHECK:         %[[R:.*]] = tile.load %in3[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xi1> -> tensor<16x16xf32>
// CHECK-NEXT:    %[[Y:.*]] = arith.addf %[[G]], %[[R]] : tensor<16x16xf32>
// CHECK:         tile.store %out0[%{{.*}}], %[[Y]] mask %{{.*}} : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xf32>, tensor<16x16xi1>
// CHECK-NEXT:    tile.return

// TRITON-LABEL: # --- kernel @epilogue_k0
// TRITON:       def epilogue_k0(in0, in1, in2, in3, out0):
// TRITON:           for {{v_[0-9]+}} in range(0, 33, 16):
// TRITON:               [[A:v_[0-9]+]] = tl.load(in0 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON:               [[B:v_[0-9]+]] = tl.load(in1 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON-NEXT:          [[D:v_[0-9]+]] = tl.dot([[A]], [[B]], [[ACC:v_[0-9]+]], input_precision="ieee")
// TRITON-NEXT:          [[ACC]] = [[D]]
// TRITON-NEXT:      [[RES:v_[0-9]+]] = [[ACC]]
// TRITON-NEXT:      [[BIAS:v_[0-9]+]] = tl.load(in2 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON-NEXT:      [[BIASB:v_[0-9]+]] = tl.broadcast_to([[BIAS]], (16, 16))
// TRITON-NEXT:      {{v_[0-9]+}} = [[RES]] + [[BIASB]]
// TRITON:           = 2 * tl.sigmoid(2 * {{v_[0-9]+}}) - 1
// TRITON:           [[R:v_[0-9]+]] = tl.load(in3 + {{v_[0-9]+}}, mask={{v_[0-9]+}}, other=0)
// TRITON-NEXT:      [[Y:v_[0-9]+]] = {{v_[0-9]+}} + [[R]]
// TRITON:           tl.store(out0 + {{v_[0-9]+}}, [[Y]], mask={{v_[0-9]+}})

func.func @epilogue(%x: tensor<40x33xf32>, %w: tensor<33x20xf32>, %b: tensor<20xf32>, %r: tensor<40x20xf32>) -> tensor<40x20xf32> {
  %0 = schedule.kernel @epilogue_k0(%x_1 = %x, %w_1 = %w, %b_1 = %b, %r_1 = %r) : (tensor<40x33xf32>, tensor<33x20xf32>, tensor<20xf32>, tensor<40x20xf32>) -> tensor<40x20xf32> {
    %1 = graph.matmul %x_1, %w_1 : tensor<40x33xf32>, tensor<33x20xf32> -> tensor<40x20xf32>
    %2 = graph.add %1, %b_1 : tensor<40x20xf32>, tensor<20xf32> -> tensor<40x20xf32>
    %3 = graph.gelu %2 {approximate = tanh} : tensor<40x20xf32>
    %4 = graph.add %3, %r_1 : tensor<40x20xf32>
    schedule.yield %4 : tensor<40x20xf32>
  }
  func.return %0 : tensor<40x20xf32>
}

// -----

// f64 operands accumulate in f64 (tl.dot takes f64 from Triton 3.6 on); the epilogue's
// constant stays f64 (a typed tl.full: Triton reads a bare float literal as f32).
// CHECK-LABEL: tile.kernel @f64_k0
// CHECK:         %[[ACC0:.*]] = arith.constant dense<0.000000e+00> : tensor<16x16xf64>
// CHECK:           %{{.*}} = tile.dot %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x16xf64>, tensor<16x16xf64> -> tensor<16x16xf64>
// CHECK:         %{{.*}} = arith.constant 3.000000e-01 : f64

// TRITON-LABEL: # --- kernel @f64_k0
// TRITON:               {{v_[0-9]+}} = tl.dot({{v_[0-9]+}}, {{v_[0-9]+}}, {{v_[0-9]+}}, input_precision="ieee")
// TRITON:           {{v_[0-9]+}} = tl.full((), 0.3, tl.float64)

func.func @f64(%x: tensor<16x16xf64>, %w: tensor<16x16xf64>) -> tensor<16x16xf64> {
  %0 = schedule.kernel @f64_k0(%x_1 = %x, %w_1 = %w) : (tensor<16x16xf64>, tensor<16x16xf64>) -> tensor<16x16xf64> {
    %1 = graph.matmul %x_1, %w_1 : tensor<16x16xf64>, tensor<16x16xf64> -> tensor<16x16xf64>
    %c = graph.constant dense<3.000000e-01> : tensor<f64>
    %2 = graph.mul %1, %c : tensor<16x16xf64>, tensor<f64> -> tensor<16x16xf64>
    schedule.yield %2 : tensor<16x16xf64>
  }
  func.return %0 : tensor<16x16xf64>
}

// -----

// Integer operands (tl.dot takes int8 only): an exact multiply-and-sum of a 3-D
// broadcast into an accumulator of their type.
// CHECK-LABEL: tile.kernel @i64_k0
// CHECK:         %[[ACC0:.*]] = arith.constant dense<0> : tensor<16x16xi64>
// CHECK:           %{{.*}} = tile.dot %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x16xi64>, tensor<16x16xi64> -> tensor<16x16xi64>

// TRITON-LABEL: # --- kernel @i64_k0
// TRITON:               {{v_[0-9]+}} = [[ACC:v_[0-9]+]] + tl.sum([[A:v_[0-9]+]][:, :, None] * [[B:v_[0-9]+]][None, :, :], axis=1)

func.func @i64(%x: tensor<16x16xi64>, %w: tensor<16x16xi64>) -> tensor<16x16xi64> {
  %0 = schedule.kernel @i64_k0(%x_1 = %x, %w_1 = %w) : (tensor<16x16xi64>, tensor<16x16xi64>) -> tensor<16x16xi64> {
    %1 = graph.matmul %x_1, %w_1 : tensor<16x16xi64>, tensor<16x16xi64> -> tensor<16x16xi64>
    schedule.yield %1 : tensor<16x16xi64>
  }
  func.return %0 : tensor<16x16xi64>
}

// -----

// A dim of 0: no output tile, a grid of no programs (the runtime launches nothing).
// CHECK-LABEL: tile.kernel @empty_k0
// CHECK-SAME:    grid [0, 1, 1]

func.func @empty(%x: tensor<0x16xf32>, %w: tensor<16x16xf32>) -> tensor<0x16xf32> {
  %0 = schedule.kernel @empty_k0(%x_1 = %x, %w_1 = %w) : (tensor<0x16xf32>, tensor<16x16xf32>) -> tensor<0x16xf32> {
    %1 = graph.matmul %x_1, %w_1 : tensor<0x16xf32>, tensor<16x16xf32> -> tensor<0x16xf32>
    schedule.yield %1 : tensor<0x16xf32>
  }
  func.return %0 : tensor<0x16xf32>
}
