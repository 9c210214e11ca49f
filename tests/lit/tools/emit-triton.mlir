// RUN: tessera-opt %s -t triton | filecheck %s --match-full-lines --strict-whitespace
// RUN: tessera-opt %s -t triton > %t.py && %python -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" %t.py
// RUN: echo 'func.func @f() { func.return }' | not tessera-opt -t triton 2>&1 | filecheck %s --check-prefix=EMPTY

// `tessera-opt -t triton` prints the Triton source of every tile.kernel in the module:
// one `@triton.jit` function per kernel, one line per op, every SSA value a Python name
// (its name hint, made unique and kept clear of Python keywords and of the names the
// source uses: tl, triton, range, float), scalar constants inline, block sizes as
// literals; a reduction Triton has no function for (prod) is a tl.reduce with a
// combine function defined before the kernel. The checks match whole lines with their indentation; the second RUN line
// checks that the whole output is valid Python.

// A module without tile kernels has nothing to print: the error says what to run first.
// EMPTY: tessera-opt: error: emit-triton: the module has no tile.kernel; run lower-schedule-to-tile first
// EMPTY-NOT: Traceback

// CHECK-LABEL:# --- kernel @every_op
// CHECK-NEXT:import triton
// CHECK-NEXT:import triton.language as tl
// CHECK-EMPTY:
// CHECK-EMPTY:
// CHECK-NEXT:@triton.jit
// CHECK-NEXT:def _tessera_combine_prod(a, b):
// CHECK-NEXT:    return a * b
// CHECK-EMPTY:
// CHECK-EMPTY:
// CHECK-NEXT:@triton.jit
// CHECK-NEXT:def every_op(x, w, out, n, scale):
// CHECK-NEXT:    pid = tl.program_id(0)
// CHECK-NEXT:    base = pid * 16
// CHECK-NEXT:    r = tl.arange(0, 16)
// CHECK-NEXT:    bases = tl.full((16,), base, tl.int32)
// CHECK-NEXT:    off = bases + r
// CHECK-NEXT:    ns = tl.full((16,), n, tl.int32)
// CHECK-NEXT:    mask = off < ns
// CHECK-NEXT:    v = tl.load(x + off, mask=mask, other=0)
// CHECK-NEXT:    s0 = tl.load(x + pid)
// CHECK-NEXT:    row = tl.expand_dims(off, 1)
// CHECK-NEXT:    col = tl.expand_dims(r, 0)
// CHECK-NEXT:    rowt = tl.trans(row)
// CHECK-NEXT:    rows = tl.broadcast_to(row, (16, 16))
// CHECK-NEXT:    cols = tl.broadcast_to(col, (16, 16))
// CHECK-NEXT:    o2 = rows + cols
// CHECK-NEXT:    a = tl.load(w + o2)
// CHECK-NEXT:    af = a.to(tl.float32)
// CHECK-NEXT:    zero = tl.full((16, 16), 0.0, tl.float32)
// CHECK-NEXT:    d = tl.dot(a, a, zero)
// CHECK-NEXT:    d2 = tl.dot(af, af, d, input_precision="ieee")
// CHECK-NEXT:    sum = tl.sum(d2, axis=1)
// CHECK-NEXT:    mx = tl.max(sum, axis=0)
// CHECK-NEXT:    mn = tl.min(d2, axis=0)
// CHECK-NEXT:    pr = tl.reduce(d2, 0, _tessera_combine_prod)
// CHECK-NEXT:    e = tl.exp(v)
// CHECK-NEXT:    l = tl.log(e)
// CHECK-NEXT:    sq = tl.sqrt(l)
// CHECK-NEXT:    rs = tl.rsqrt(sq)
// CHECK-NEXT:    ab = tl.abs(rs)
// CHECK-NEXT:    er = tl.erf(ab)
// CHECK-NEXT:    th = 2 * tl.sigmoid(2 * er) - 1
// CHECK-NEXT:    ng = -th
// CHECK-NEXT:    ad = ng + sum
// CHECK-NEXT:    sb = ad - mn
// CHECK-NEXT:    ml = sb * sb
// CHECK-NEXT:    dv = ml / mn
// CHECK-NEXT:    mxf = tl.maximum(dv, ml, propagate_nan=tl.PropagateNan.ALL)
// CHECK-NEXT:    mnf = tl.minimum(mxf, dv, propagate_nan=tl.PropagateNan.ALL)
// CHECK-NEXT:    si = off - r
// CHECK-NEXT:    qi = si // ns
// CHECK-NEXT:    ri = si % ns
// CHECK-NEXT:    xi = tl.maximum(qi, ri)
// CHECK-NEXT:    yi = tl.minimum(xi, qi)
// CHECK-NEXT:    eq = yi == xi
// CHECK-NEXT:    ne = mnf != dv
// CHECK-NEXT:    le = yi <= xi
// CHECK-NEXT:    gt = yi > xi
// CHECK-NEXT:    ge = yi >= xi
// CHECK-NEXT:    and_1 = eq & ne
// CHECK-NEXT:    or_1 = and_1 | le
// CHECK-NEXT:    xor = or_1 ^ gt
// CHECK-NEXT:    range_1 = tl.where(xor, mnf, v)
// CHECK-NEXT:    scaled = tl.full((16,), scale, tl.float32)
// CHECK-NEXT:    acc = range_1
// CHECK-NEXT:    t = 0.0
// CHECK-NEXT:    for i in range(0, 4, 1):
// CHECK-NEXT:        is_1 = tl.full((16,), i, tl.int32)
// CHECK-NEXT:        isf = is_1.to(tl.float32)
// CHECK-NEXT:        t2 = t + -0.5
// CHECK-NEXT:        acc2 = acc * scaled
// CHECK-NEXT:        acc3 = acc2 + isf
// CHECK-NEXT:        acc, t = acc3, t2
// CHECK-NEXT:    res = acc
// CHECK-NEXT:    res_1 = t
// CHECK-NEXT:    for j in range(0, 4, 1):
// CHECK-NEXT:        pass
// CHECK-NEXT:    m1 = tl.maximum(float("nan"), float("inf"), propagate_nan=tl.PropagateNan.ALL)
// CHECK-NEXT:    m2 = tl.minimum(m1, float("-inf"), propagate_nan=tl.PropagateNan.ALL)
// CHECK-NEXT:    m3 = m2 * -0.5
// CHECK-NEXT:    m4 = m3 + res_1
// CHECK-NEXT:    m5 = m4 + mx
// CHECK-NEXT:    m6 = m5 + s0
// CHECK-NEXT:    out1 = tl.where(ge, res, scaled)
// CHECK-NEXT:    tl.store(out + off, out1, mask=mask)
// CHECK-NEXT:    tl.store(out + pid, m6)
// CHECK-EMPTY:
// CHECK-LABEL:# --- kernel @names
// CHECK-NEXT:import triton
// CHECK-NEXT:import triton.language as tl
// CHECK-EMPTY:
// CHECK-EMPTY:
// CHECK-NEXT:@triton.jit
// CHECK-NEXT:def names(tl_1, triton_1):
// CHECK-NEXT:    v = tl.program_id(0)
// CHECK-NEXT:    v_1 = tl.program_id(1)
// CHECK-NEXT:    tl_2 = tl.program_id(2)
// CHECK-NEXT:    v_2 = v + v_1
// CHECK-NEXT:    v_3 = v_2 + tl_2
// CHECK-NEXT:    v_4 = v_3 + triton_1
// CHECK-NEXT:    float_1 = v_4 + v_4
// CHECK-NEXT:    range_1 = float_1 + float_1
// CHECK-EMPTY:
// CHECK-LABEL:# --- kernel @empty
// CHECK-NEXT:import triton
// CHECK-NEXT:import triton.language as tl
// CHECK-EMPTY:
// CHECK-EMPTY:
// CHECK-NEXT:@triton.jit
// CHECK-NEXT:def empty():
// CHECK-NEXT:    pass

tile.kernel @every_op(%x: !tile.ptr<f32>, %w: !tile.ptr<bf16>, %out: !tile.ptr<f32>, %n: i32, %scale: f32) grid [4, 2, 1] warps 8 stages 3 {
  %pid = tile.program_id 0 : i32
  %c16 = arith.constant 16 : i32
  %base = arith.muli %pid, %c16 : i32
  %r = tile.arange : tensor<16xi32>
  %bases = tile.splat %base : i32 -> tensor<16xi32>
  %off = arith.addi %bases, %r : tensor<16xi32>
  %ns = tile.splat %n : i32 -> tensor<16xi32>
  %mask = tile.cmp "lt" %off, %ns : tensor<16xi32> -> tensor<16xi1>
  %v = tile.load %x[%off] mask %mask : !tile.ptr<f32>, tensor<16xi32>, tensor<16xi1> -> tensor<16xf32>
  %s0 = tile.load %x[%pid] : !tile.ptr<f32>, i32 -> f32
  %row = tile.expand_dims %off, 1 : tensor<16xi32> -> tensor<16x1xi32>
  %col = tile.expand_dims %r, 0 : tensor<16xi32> -> tensor<1x16xi32>
  %rowt = tile.trans %row : tensor<16x1xi32> -> tensor<1x16xi32>
  %rows = tile.broadcast %row : tensor<16x1xi32> -> tensor<16x16xi32>
  %cols = tile.broadcast %col : tensor<1x16xi32> -> tensor<16x16xi32>
  %o2 = arith.addi %rows, %cols : tensor<16x16xi32>
  %a = tile.load %w[%o2] : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
  %af = tile.convert %a : tensor<16x16xbf16> -> tensor<16x16xf32>
  %zero = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
  %d = tile.dot %a, %a, %zero : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
  %d2 = tile.dot %af, %af, %d : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  %sum = tile.reduce "sum" %d2, 1 : tensor<16x16xf32> -> tensor<16xf32>
  %mx = tile.reduce "max" %sum, 0 : tensor<16xf32> -> f32
  %mn = tile.reduce "min" %d2, 0 : tensor<16x16xf32> -> tensor<16xf32>
  %pr = tile.reduce "prod" %d2, 0 : tensor<16x16xf32> -> tensor<16xf32>
  %e = math.exp %v : tensor<16xf32>
  %l = math.log %e : tensor<16xf32>
  %sq = math.sqrt %l : tensor<16xf32>
  %rs = math.rsqrt %sq : tensor<16xf32>
  %ab = math.absf %rs : tensor<16xf32>
  %er = math.erf %ab : tensor<16xf32>
  %th = math.tanh %er : tensor<16xf32>
  %ng = arith.negf %th : tensor<16xf32>
  %ad = arith.addf %ng, %sum : tensor<16xf32>
  %sb = arith.subf %ad, %mn : tensor<16xf32>
  %ml = arith.mulf %sb, %sb : tensor<16xf32>
  %dv = arith.divf %ml, %mn : tensor<16xf32>
  %mxf = arith.maximumf %dv, %ml : tensor<16xf32>
  %mnf = arith.minimumf %mxf, %dv : tensor<16xf32>
  %si = arith.subi %off, %r : tensor<16xi32>
  %qi = arith.divsi %si, %ns : tensor<16xi32>
  %ri = arith.remsi %si, %ns : tensor<16xi32>
  %xi = arith.maxsi %qi, %ri : tensor<16xi32>
  %yi = arith.minsi %xi, %qi : tensor<16xi32>
  %eq = tile.cmp "eq" %yi, %xi : tensor<16xi32> -> tensor<16xi1>
  %ne = tile.cmp "ne" %mnf, %dv : tensor<16xf32> -> tensor<16xi1>
  %le = tile.cmp "le" %yi, %xi : tensor<16xi32> -> tensor<16xi1>
  %gt = tile.cmp "gt" %yi, %xi : tensor<16xi32> -> tensor<16xi1>
  %ge = tile.cmp "ge" %yi, %xi : tensor<16xi32> -> tensor<16xi1>
  %and = arith.andi %eq, %ne : tensor<16xi1>
  %or = arith.ori %and, %le : tensor<16xi1>
  %xor = arith.xori %or, %gt : tensor<16xi1>
  %range = tile.select %xor, %mnf, %v : tensor<16xi1>, tensor<16xf32>
  %scaled = tile.splat %scale : f32 -> tensor<16xf32>
  %nan = arith.constant 0x7FC00000 : f32
  %inf = arith.constant 0x7F800000 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %half = arith.constant -5.000000e-01 : f32
  %c0 = arith.constant 0 : i32
  %c4 = arith.constant 4 : i32
  %c1 = arith.constant 1 : i32
  %init = arith.constant 0.000000e+00 : f32
  %res:2 = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %range, %t = %init) -> (tensor<16xf32>, f32) : i32 {
    %is = tile.splat %i : i32 -> tensor<16xi32>
    %isf = tile.convert %is : tensor<16xi32> -> tensor<16xf32>
    %t2 = arith.addf %t, %half : f32
    %acc2 = arith.mulf %acc, %scaled : tensor<16xf32>
    %acc3 = arith.addf %acc2, %isf : tensor<16xf32>
    scf.yield %acc3, %t2 : tensor<16xf32>, f32
  }
  scf.for %j = %c0 to %c4 step %c1 : i32 {
    scf.yield
  }
  %m1 = arith.maximumf %nan, %inf : f32
  %m2 = arith.minimumf %m1, %ninf : f32
  %m3 = arith.mulf %m2, %half : f32
  %m4 = arith.addf %m3, %res#1 : f32
  %m5 = arith.addf %m4, %mx : f32
  %m6 = arith.addf %m5, %s0 : f32
  %out1 = tile.select %ge, %res#0, %scaled : tensor<16xi1>, tensor<16xf32>
  tile.store %out[%off], %out1 mask %mask : !tile.ptr<f32>, tensor<16xi32>, tensor<16xf32>, tensor<16xi1>
  tile.store %out[%pid], %m6 : !tile.ptr<f32>, i32, f32
  tile.return
}
tile.kernel @names(%tl: !tile.ptr<f32>, %triton: i32) grid [1, 1, 1] warps 4 stages 1 {
  %0 = tile.program_id 0 : i32
  %1 = tile.program_id 1 : i32
  %tl_1 = tile.program_id 2 : i32
  %v = arith.addi %0, %1 : i32
  %v_1 = arith.addi %v, %tl_1 : i32
  %v_2 = arith.addi %v_1, %triton : i32
  %float = arith.addi %v_2, %v_2 : i32
  %range = arith.addi %float, %float : i32
  tile.return
}
tile.kernel @empty() grid [1, 1, 1] warps 4 stages 1 {
  tile.return
}
