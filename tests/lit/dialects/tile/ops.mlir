// RUN: tessera-opt %s | filecheck %s --enable-var-scope
// RUN: tessera-opt %s | tessera-opt | filecheck %s --enable-var-scope
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s --enable-var-scope
// RUN: tessera-opt %s --print-op-generic | filecheck %s --check-prefix=GENERIC

// Every op and type of the tile dialect in its custom form, with the upstream arith, math
// and scf ops a kernel is written in; the second and third RUN lines re-parse the custom
// and the generic form. Op lines end in {{$}} so that a printer adding anything fails.

// Every tile op, on scalars and blocks: index arithmetic, masked and unmasked loads and
// stores (block and scalar offsets), shape changes (a transpose too), a bf16 dot into an f32 accumulator,
// the three reductions (to a block and to a scalar), comparison, selection, conversion.
// CHECK-LABEL: tile.kernel @all_ops
// CHECK-SAME:  (%[[X:.*]]: !tile.ptr<f32>, %[[W:.*]]: !tile.ptr<bf16>, %[[Y:.*]]: !tile.ptr<f32>, %[[N:.*]]: i32, %[[S:.*]]: f32) grid [4, 2, 1] warps 8 stages 3 {{{$}}
// CHECK-NEXT:    %[[PID:.*]] = tile.program_id 0 : i32{{$}}
// CHECK-NEXT:    %[[PID1:.*]] = tile.program_id 1 : i32{{$}}
// CHECK-NEXT:    %[[R:.*]] = tile.arange : tensor<16xi32>{{$}}
// CHECK-NEXT:    %[[C16:.*]] = arith.constant 16 : i32{{$}}
// CHECK-NEXT:    %[[BASE:.*]] = arith.muli %[[PID]], %[[C16]] : i32{{$}}
// CHECK-NEXT:    %[[B:.*]] = tile.splat %[[BASE]] : i32 -> tensor<16xi32>{{$}}
// CHECK-NEXT:    %[[OFF:.*]] = arith.addi %[[B]], %[[R]] : tensor<16xi32>{{$}}
// CHECK-NEXT:    %[[NB:.*]] = tile.splat %[[N]] : i32 -> tensor<16xi32>{{$}}
// CHECK-NEXT:    %[[M:.*]] = tile.cmp "lt" %[[OFF]], %[[NB]] : tensor<16xi32> -> tensor<16xi1>{{$}}
// CHECK-NEXT:    %{{.*}} = tile.load %[[X]][%[[OFF]]] mask %[[M]] : !tile.ptr<f32>, tensor<16xi32>, tensor<16xi1> -> tensor<16xf32>{{$}}
// CHECK-NEXT:    %[[SC:.*]] = tile.load %[[X]][%[[PID1]]] : !tile.ptr<f32>, i32 -> f32{{$}}
// CHECK-NEXT:    %[[ROW:.*]] = tile.expand_dims %[[OFF]], 1 : tensor<16xi32> -> tensor<16x1xi32>{{$}}
// CHECK-NEXT:    %[[COL:.*]] = tile.expand_dims %[[R]], 0 : tensor<16xi32> -> tensor<1x16xi32>{{$}}
// CHECK-NEXT:    %{{.*}} = tile.trans %[[ROW]] : tensor<16x1xi32> -> tensor<1x16xi32>{{$}}
// CHECK-NEXT:    %[[ROWS:.*]] = tile.broadcast %[[ROW]] : tensor<16x1xi32> -> tensor<16x16xi32>{{$}}
// CHECK-NEXT:    %[[COLS:.*]] = tile.broadcast %[[COL]] : tensor<1x16xi32> -> tensor<16x16xi32>{{$}}
// CHECK-NEXT:    %[[O2:.*]] = arith.addi %[[ROWS]], %[[COLS]] : tensor<16x16xi32>{{$}}
// CHECK-NEXT:    %[[A:.*]] = tile.load %[[W]][%[[O2]]] : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>{{$}}
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant dense<0.000000e+00> : tensor<16x16xf32>{{$}}
// CHECK-NEXT:    %[[D:.*]] = tile.dot %[[A]], %[[A]], %[[ZERO]] : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>{{$}}
// CHECK-NEXT:    %[[SUM:.*]] = tile.reduce "sum" %[[D]], 1 : tensor<16x16xf32> -> tensor<16xf32>{{$}}
// CHECK-NEXT:    %[[MX:.*]] = tile.reduce "max" %[[SUM]], 0 : tensor<16xf32> -> f32{{$}}
// CHECK-NEXT:    %[[MN:.*]] = tile.reduce "min" %[[D]], 0 : tensor<16x16xf32> -> tensor<16xf32>{{$}}
// CHECK-NEXT:    %[[E:.*]] = arith.cmpf olt, %[[MX]], %[[S]] : f32{{$}}
// CHECK-NEXT:    %[[SEL:.*]] = tile.select %[[M]], %[[SUM]], %[[MN]] : tensor<16xi1>, tensor<16xf32>{{$}}
// CHECK-NEXT:    %[[SS:.*]] = tile.select %[[E]], %[[MX]], %[[SC]] : i1, f32{{$}}
// CHECK-NEXT:    %[[CV:.*]] = tile.convert %[[SEL]] : tensor<16xf32> -> tensor<16xbf16>{{$}}
// CHECK-NEXT:    %[[BACK:.*]] = tile.convert %[[CV]] : tensor<16xbf16> -> tensor<16xf32>{{$}}
// CHECK-NEXT:    %{{.*}} = tile.convert %[[PID]] : i32 -> f32{{$}}
// CHECK-NEXT:    %{{.*}} = tile.cmp "eq" %[[SC]], %[[S]] : f32 -> i1{{$}}
// CHECK-NEXT:    %{{.*}} = tile.cmp "ne" %[[OFF]], %[[NB]] : tensor<16xi32> -> tensor<16xi1>{{$}}
// CHECK-NEXT:    %{{.*}} = tile.cmp "le" %[[OFF]], %[[NB]] : tensor<16xi32> -> tensor<16xi1>{{$}}
// CHECK-NEXT:    %{{.*}} = tile.cmp "gt" %[[OFF]], %[[NB]] : tensor<16xi32> -> tensor<16xi1>{{$}}
// CHECK-NEXT:    %{{.*}} = tile.cmp "ge" %[[SEL]], %[[SUM]] : tensor<16xf32> -> tensor<16xi1>{{$}}
// CHECK-NEXT:    tile.store %[[Y]][%[[OFF]]], %[[BACK]] mask %[[M]] : !tile.ptr<f32>, tensor<16xi32>, tensor<16xf32>, tensor<16xi1>{{$}}
// CHECK-NEXT:    tile.store %[[Y]][%[[PID]]], %[[SS]] : !tile.ptr<f32>, i32, f32{{$}}
// CHECK-NEXT:    tile.return{{$}}
// CHECK-NEXT:  }
tile.kernel @all_ops(%x: !tile.ptr<f32>, %w: !tile.ptr<bf16>, %y: !tile.ptr<f32>, %n: i32, %s: f32) grid [4, 2, 1] warps 8 stages 3 {
  %pid = tile.program_id 0 : i32
  %pid1 = tile.program_id 1 : i32
  %r = tile.arange : tensor<16xi32>
  %c16 = arith.constant 16 : i32
  %base = arith.muli %pid, %c16 : i32
  %b = tile.splat %base : i32 -> tensor<16xi32>
  %off = arith.addi %b, %r : tensor<16xi32>
  %nb = tile.splat %n : i32 -> tensor<16xi32>
  %m = tile.cmp "lt" %off, %nb : tensor<16xi32> -> tensor<16xi1>
  %v = tile.load %x[%off] mask %m : !tile.ptr<f32>, tensor<16xi32>, tensor<16xi1> -> tensor<16xf32>
  %sc = tile.load %x[%pid1] : !tile.ptr<f32>, i32 -> f32
  %row = tile.expand_dims %off, 1 : tensor<16xi32> -> tensor<16x1xi32>
  %col = tile.expand_dims %r, 0 : tensor<16xi32> -> tensor<1x16xi32>
  %tr = tile.trans %row : tensor<16x1xi32> -> tensor<1x16xi32>
  %rows = tile.broadcast %row : tensor<16x1xi32> -> tensor<16x16xi32>
  %cols = tile.broadcast %col : tensor<1x16xi32> -> tensor<16x16xi32>
  %o2 = arith.addi %rows, %cols : tensor<16x16xi32>
  %a = tile.load %w[%o2] : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
  %zero = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
  %d = tile.dot %a, %a, %zero : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
  %sum = tile.reduce "sum" %d, 1 : tensor<16x16xf32> -> tensor<16xf32>
  %mx = tile.reduce "max" %sum, 0 : tensor<16xf32> -> f32
  %mn = tile.reduce "min" %d, 0 : tensor<16x16xf32> -> tensor<16xf32>
  %e = arith.cmpf olt, %mx, %s : f32
  %sel = tile.select %m, %sum, %mn : tensor<16xi1>, tensor<16xf32>
  %ss = tile.select %e, %mx, %sc : i1, f32
  %cv = tile.convert %sel : tensor<16xf32> -> tensor<16xbf16>
  %back = tile.convert %cv : tensor<16xbf16> -> tensor<16xf32>
  %ci = tile.convert %pid : i32 -> f32
  %eq = tile.cmp "eq" %sc, %s : f32 -> i1
  %ne = tile.cmp "ne" %off, %nb : tensor<16xi32> -> tensor<16xi1>
  %le = tile.cmp "le" %off, %nb : tensor<16xi32> -> tensor<16xi1>
  %gt = tile.cmp "gt" %off, %nb : tensor<16xi32> -> tensor<16xi1>
  %ge = tile.cmp "ge" %sel, %sum : tensor<16xf32> -> tensor<16xi1>
  tile.store %y[%off], %back mask %m : !tile.ptr<f32>, tensor<16xi32>, tensor<16xf32>, tensor<16xi1>
  tile.store %y[%pid], %ss : !tile.ptr<f32>, i32, f32
  tile.return
}

// A K loop: scf.for over i32 with a loop-carried accumulator and math on blocks; the
// kernel's attributes (all_slice positions) follow its launch parameters.
// CHECK-LABEL: tile.kernel @loop
// CHECK-SAME:  (%{{.*}}: !tile.ptr<f16>, %{{.*}}: !tile.ptr<f64>, %{{.*}}: i32, %{{.*}}: i64, %{{.*}}: bf16) grid [1, 1, 1] warps 1 stages 2 attributes {positions = [["tp"], ["dp", "tp"]]} {{{$}}
// CHECK-NEXT:    %[[C0:.*]] = arith.constant 0 : i32{{$}}
// CHECK-NEXT:    %[[C64:.*]] = arith.constant 64 : i32{{$}}
// CHECK-NEXT:    %[[C16:.*]] = arith.constant 16 : i32{{$}}
// CHECK-NEXT:    %[[INIT:.*]] = arith.constant dense<0.000000e+00> : tensor<16x16xf32>{{$}}
// CHECK-NEXT:    %[[R:.*]] = tile.arange : tensor<16xi32>{{$}}
// CHECK-NEXT:    %{{.*}} = scf.for %[[K:.*]] = %[[C0]] to %[[C64]] step %[[C16]] iter_args(%[[ACC:.*]] = %[[INIT]]) -> (tensor<16x16xf32>) : i32 {{{$}}
// CHECK-NEXT:      %[[KS:.*]] = tile.splat %[[K]] : i32 -> tensor<16xi32>{{$}}
// CHECK-NEXT:      %{{.*}} = arith.addi %[[R]], %[[KS]] : tensor<16xi32>{{$}}
// CHECK-NEXT:      %[[EXP:.*]] = math.exp %[[ACC]] : tensor<16x16xf32>{{$}}
// CHECK-NEXT:      scf.yield %[[EXP]] : tensor<16x16xf32>{{$}}
// CHECK-NEXT:    }
// CHECK-NEXT:    tile.return{{$}}
// CHECK-NEXT:  }
tile.kernel @loop(%a: !tile.ptr<f16>, %out: !tile.ptr<f64>, %rank: i32, %n: i64, %s: bf16) grid [1, 1, 1] warps 1 stages 2 attributes {positions = [["tp"], ["dp", "tp"]]} {
  %c0 = arith.constant 0 : i32
  %c64 = arith.constant 64 : i32
  %c16 = arith.constant 16 : i32
  %init = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
  %r = tile.arange : tensor<16xi32>
  %res = scf.for %k = %c0 to %c64 step %c16 iter_args(%acc = %init) -> (tensor<16x16xf32>) : i32 {
    %ks = tile.splat %k : i32 -> tensor<16xi32>
    %kk = arith.addi %r, %ks : tensor<16xi32>
    %e = math.exp %acc : tensor<16x16xf32>
    scf.yield %e : tensor<16x16xf32>
  }
  tile.return
}

// The smallest kernel: no arguments, one program, just tile.return.
// CHECK-LABEL: tile.kernel @empty() grid [1, 1, 1] warps 4 stages 1 {{{$}}
// CHECK-NEXT:    tile.return{{$}}
// CHECK-NEXT:  }
tile.kernel @empty() grid [1, 1, 1] warps 4 stages 1 {
  tile.return
}

// The generic form spells out the kernel's properties and the ops' attributes.
// GENERIC: "tile.kernel"() <{sym_name = "all_ops", function_type = (!tile.ptr<f32>, !tile.ptr<bf16>, !tile.ptr<f32>, i32, f32) -> (), grid = array<i64: 4, 2, 1>, num_warps = 8 : i64, num_stages = 3 : i64}> ({
// GENERIC: "tile.program_id"() <{axis = 0 : i32}> : () -> i32
// GENERIC: "tile.arange"() : () -> tensor<16xi32>
// GENERIC: "tile.splat"(%{{.*}}) : (i32) -> tensor<16xi32>
// GENERIC: "tile.cmp"(%{{.*}}, %{{.*}}) <{predicate = "lt"}> : (tensor<16xi32>, tensor<16xi32>) -> tensor<16xi1>
// GENERIC: "tile.load"(%{{.*}}, %{{.*}}, %{{.*}}) : (!tile.ptr<f32>, tensor<16xi32>, tensor<16xi1>) -> tensor<16xf32>
// GENERIC: "tile.load"(%{{.*}}, %{{.*}}) : (!tile.ptr<f32>, i32) -> f32
// GENERIC: "tile.expand_dims"(%{{.*}}) <{axis = 1 : i32}> : (tensor<16xi32>) -> tensor<16x1xi32>
// GENERIC: "tile.broadcast"(%{{.*}}) : (tensor<16x1xi32>) -> tensor<16x16xi32>
// GENERIC: "tile.dot"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<16x16xbf16>, tensor<16x16xbf16>, tensor<16x16xf32>) -> tensor<16x16xf32>
// GENERIC: "tile.reduce"(%{{.*}}) <{kind = "sum", axis = 1 : i32}> : (tensor<16x16xf32>) -> tensor<16xf32>
// GENERIC: "tile.select"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<16xi1>, tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
// GENERIC: "tile.convert"(%{{.*}}) : (tensor<16xf32>) -> tensor<16xbf16>
// GENERIC: "tile.store"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (!tile.ptr<f32>, tensor<16xi32>, tensor<16xf32>, tensor<16xi1>) -> ()
// GENERIC: "tile.store"(%{{.*}}, %{{.*}}, %{{.*}}) : (!tile.ptr<f32>, i32, f32) -> ()
// GENERIC: "tile.return"() : () -> ()
// GENERIC: "tile.kernel"() <{sym_name = "loop", function_type = (!tile.ptr<f16>, !tile.ptr<f64>, i32, i64, bf16) -> (), grid = array<i64: 1, 1, 1>, num_warps = 1 : i64, num_stages = 2 : i64}> ({
// GENERIC: }) {positions = [["tp"], ["dp", "tp"]]} : () -> ()
