// RUN: tessera-opt %s -p lower-graph-to-schedule,lower-schedule-to-tile | filecheck %s
// RUN: tessera-opt %s -p lower-graph-to-schedule,lower-schedule-to-tile | tessera-opt | filecheck %s
// RUN: tessera-opt %s -p lower-graph-to-schedule,lower-schedule-to-tile -t triton | filecheck %s --check-prefix=TRITON

// Flash attention: softmax(score(q kᵀ)) v becomes one kernel (named after attention, not
// the softmax) and a FlashAttention-2 forward tile kernel: a program per (block of 32
// query rows, batch index), the q block loaded once, then an scf.for over blocks of keys
// carrying the running row max, the row sum and the f32 accumulator; each step computes
// a scores block with tile.dot, applies the score ops (the scale; the causal mask from
// the indices), masks keys past Tk with -inf, and accumulates p v with a second tile.dot.
// Causal: key blocks below the query block's first row need no mask (a first loop),
// the diagonal blocks compare indices (a second loop), blocks above are skipped.
// The second RUN line re-parses (and re-verifies) the tile IR; the third prints Triton.

// Non-causal f32, k transposed in the graph: 40 queries need 2 programs of 32 rows per
// batch; 40 keys take 2 steps of 32, the second masked.
// CHECK-LABEL: func.func @attn
// CHECK-NEXT:    schedule.kernel @attn_k0_attention(%{{.*}} = %k, %{{.*}} = %q, %{{.*}} = %v)
// CHECK-NEXT:      graph.constant dense<2.500000e-01> : tensor<f32>
// CHECK-NEXT:      graph.transpose
// CHECK-NEXT:      graph.matmul
// CHECK-NEXT:      graph.mul
// CHECK-NEXT:      graph.softmax
// CHECK-NEXT:      graph.matmul
// CHECK-NEXT:      schedule.yield

func.func @attn(%q: tensor<2x40x16xf32>, %k: tensor<2x40x16xf32>, %v: tensor<2x40x16xf32>) -> tensor<2x40x16xf32> {
  %kt = graph.transpose %k {perm = [0, 2, 1]} : tensor<2x40x16xf32> -> tensor<2x16x40xf32>
  %s = graph.matmul %q, %kt : tensor<2x40x16xf32>, tensor<2x16x40xf32> -> tensor<2x40x40xf32>
  %c = graph.constant dense<2.500000e-01> : tensor<f32>
  %s1 = graph.mul %s, %c : tensor<2x40x40xf32>, tensor<f32> -> tensor<2x40x40xf32>
  %p = graph.softmax %s1 {axis = 2} : tensor<2x40x40xf32>
  %o = graph.matmul %p, %v : tensor<2x40x40xf32>, tensor<2x40x16xf32> -> tensor<2x40x16xf32>
  func.return %o : tensor<2x40x16xf32>
}

// Causal bf16 with heads (np.tril mask, fill -1e9): the mask constant is a kernel argument
// but is not loaded (the kernel compares key and query indices), and the key loop stops at
// the diagonal block: upper bound min(Tk, (pid + 1) * 16). The head dim 8 is padded to 16.
// CHECK-LABEL: func.func @causal
// CHECK-NEXT:    schedule.kernel @causal_k0_attention(

func.func @causal(%q: tensor<2x3x4x8xbf16>, %k: tensor<2x3x4x8xbf16>, %v: tensor<2x3x4x8xbf16>) -> tensor<2x3x4x8xbf16> {
  %kt = graph.transpose %k {perm = [0, 1, 3, 2]} : tensor<2x3x4x8xbf16> -> tensor<2x3x8x4xbf16>
  %s = graph.matmul %q, %kt : tensor<2x3x4x8xbf16>, tensor<2x3x8x4xbf16> -> tensor<2x3x4x4xbf16>
  %mask = graph.constant dense<[[true, false, false, false], [true, true, false, false], [true, true, true, false], [true, true, true, true]]> : tensor<4x4xi1>
  %fill = graph.constant dense<-1.000000e+09> : tensor<bf16>
  %s1 = graph.select %mask, %s, %fill : tensor<4x4xi1>, tensor<2x3x4x4xbf16>, tensor<bf16> -> tensor<2x3x4x4xbf16>
  %p = graph.softmax %s1 {axis = 3} : tensor<2x3x4x4xbf16>
  %o = graph.matmul %p, %v : tensor<2x3x4x4xbf16>, tensor<2x3x4x8xbf16> -> tensor<2x3x4x8xbf16>
  func.return %o : tensor<2x3x4x8xbf16>
}

// CHECK-LABEL: tile.kernel @attn_k0_attention
// CHECK-SAME:    (%in0: !tile.ptr<f32>, %in1: !tile.ptr<f32>, %in2: !tile.ptr<f32>, %out0: !tile.ptr<f32>) grid [2, 2, 1] warps 4 stages 1 {
// CHECK:         %[[Q:.*]] = tile.load %in1[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<32x16xi32>, tensor<32x16xi1> -> tensor<32x16xf32>
// CHECK:         %[[NEGINF:.*]] = arith.constant 0xff800000 : f32
// CHECK-NEXT:    %[[M0:.*]] = tile.splat %[[NEGINF]] : f32 -> tensor<32x1xf32>
// CHECK-NEXT:    %[[L0:.*]] = arith.constant dense<0.000000e+00> : tensor<32x1xf32>
// CHECK-NEXT:    %[[A0:.*]] = arith.constant dense<0.000000e+00> : tensor<32x16xf32>
// CHECK-NEXT:    %[[TK:.*]] = arith.constant 40 : i32
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK-NEXT:    %[[BN:.*]] = arith.constant 32 : i32
// CHECK-NEXT:    %{{.*}}, %[[L:.*]], %[[ACC:.*]] = scf.for %{{.*}} = %[[ZERO]] to %[[TK]] step %[[BN]] iter_args(%[[MI:.*]] = %[[M0]], %[[LI:.*]] = %[[L0]], %[[AI:.*]] = %[[A0]]) -> (tensor<32x1xf32>, tensor<32x1xf32>, tensor<32x16xf32>) : i32 {
// CHECK:           %[[KT:.*]] = tile.load %in0[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<16x32xi32>, tensor<16x32xi1> -> tensor<16x32xf32>
// CHECK:           %[[S:.*]] = tile.dot %[[Q]], %[[KT]], %{{.*}} : tensor<32x16xf32>, tensor<16x32xf32> -> tensor<32x32xf32>
// CHECK:           %[[SCALED:.*]] = arith.mulf %[[S]], %{{.*}} : tensor<32x32xf32>
// CHECK:           %[[MASKED:.*]] = tile.select %{{.*}}, %[[SCALED]], %{{.*}} : tensor<32x32xi1>, tensor<32x32xf32>
// CHECK-NEXT:      %[[ROWMAX:.*]] = tile.reduce "max" %[[MASKED]], 1 : tensor<32x32xf32> -> tensor<32xf32>
// CHECK-NEXT:      %[[ROWMAX2:.*]] = tile.expand_dims %[[ROWMAX]], 1
// CHECK-NEXT:      %[[MNEW:.*]] = arith.maximumf %[[MI]], %[[ROWMAX2]] : tensor<32x1xf32>
// CHECK:           %[[ALPHA:.*]] = math.exp %{{.*}} : tensor<32x1xf32>
// CHECK:           %[[P:.*]] = math.exp %{{.*}} : tensor<32x32xf32>
// CHECK:           tile.reduce "sum" %[[P]], 1 : tensor<32x32xf32> -> tensor<32xf32>
// CHECK:           %[[LNEW:.*]] = arith.addf
// CHECK:           %[[V:.*]] = tile.load %in2[%{{.*}}] mask %{{.*}} : !tile.ptr<f32>, tensor<32x16xi32>, tensor<32x16xi1> -> tensor<32x16xf32>
// CHECK:           %[[SCALEDACC:.*]] = arith.mulf %[[AI]], %{{.*}} : tensor<32x16xf32>
// CHECK-NEXT:      %[[ANEW:.*]] = tile.dot %[[P]], %[[V]], %[[SCALEDACC]] : tensor<32x32xf32>, tensor<32x16xf32> -> tensor<32x16xf32>
// CHECK-NEXT:      scf.yield %[[MNEW]], %[[LNEW]], %[[ANEW]] : tensor<32x1xf32>, tensor<32x1xf32>, tensor<32x16xf32>
// CHECK-NEXT:    }
// CHECK:         %[[OUT:.*]] = arith.divf %[[ACC]], %{{.*}} : tensor<32x16xf32>
// CHECK:         tile.store %out0[%{{.*}}], %[[OUT]] mask %{{.*}} : !tile.ptr<f32>, tensor<32x16xi32>, tensor<32x16xf32>, tensor<32x16xi1>
// CHECK-NEXT:    tile.return

// CHECK-LABEL: tile.kernel @causal_k0_attention
// CHECK-SAME:    (%in0: !tile.ptr<bf16>, %in1: !tile.ptr<bf16>, %in2: !tile.ptr<bf16>, %out0: !tile.ptr<bf16>, %const0: !tile.ptr<i1>) grid [1, 6, 1]
// CHECK-NEXT:    %[[PID:.*]] = tile.program_id 0 : i32
// CHECK-NOT:     tile.load %const0
// CHECK:         %[[CQ:.*]] = tile.load %in1[%{{.*}}] mask %{{.*}} -> tensor<16x16xbf16>
// CHECK:         %[[FIRST:.*]] = arith.muli %[[PID]], %{{.*}} : i32
// CHECK-NEXT:    %{{.*}} = arith.constant 4 : i32
// CHECK-NEXT:    %[[BELOW:.*]] = arith.minsi %[[FIRST]], %{{.*}} : i32
// CHECK:         scf.for %{{.*}} = %{{.*}} to %[[BELOW]] step
// CHECK-NOT:       tile.cmp "le"
// CHECK-NOT:       tile.load %const0
// CHECK:           tile.dot %[[CQ]]
// CHECK-NOT:       tile.cmp "le"
// CHECK:           scf.yield
// CHECK:         %[[UPPER:.*]] = arith.minsi %{{.*}}, %{{.*}} : i32
// CHECK:         scf.for %{{.*}} = %[[BELOW]] to %[[UPPER]] step
// CHECK-NOT:     tile.load %const0
// CHECK:           %[[CKT:.*]] = tile.load %in0{{.*}} -> tensor<16x16xbf16>
// CHECK:           tile.dot %[[CQ]], %[[CKT]], %{{.*}} : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
// CHECK:           %[[VISIBLE:.*]] = tile.cmp "le" %{{.*}}, %{{.*}} : tensor<16x16xi32> -> tensor<16x16xi1>
// CHECK:           tile.select %[[VISIBLE]]
// CHECK:           %[[CP:.*]] = tile.convert %{{.*}} : tensor<16x16xf32> -> tensor<16x16xbf16>
// CHECK:           tile.dot %[[CP]], %{{.*}}, %{{.*}} : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
// CHECK:         tile.convert %{{.*}} : tensor<16x16xf32> -> tensor<16x16xbf16>
// CHECK:         tile.store %out0

// TRITON-LABEL: # --- kernel @attn_k0_attention
// TRITON:       def attn_k0_attention(in0, in1, in2, out0):
// TRITON:         [[Q:v_[0-9]+]] = tl.load(in1 + {{.*}}, mask={{.*}}, other=0)
// TRITON:         for [[START:v_[0-9]+]] in range(0, 40, 32):
// TRITON:           [[S:v_[0-9]+]] = tl.dot([[Q]], {{.*}}, input_precision="ieee")
// TRITON:           tl.max({{.*}}, axis=1)
// TRITON:           tl.exp(
// TRITON:           tl.sum({{.*}}, axis=1)
// TRITON:           tl.dot({{.*}}, input_precision="ieee")
// TRITON:         tl.store(out0 + {{.*}}, mask={{.*}})
// TRITON-LABEL: # --- kernel @causal_k0_attention
// TRITON:       def causal_k0_attention(in0, in1, in2, out0, const0):
// TRITON-NOT:     tl.load(const0
// TRITON:         [[BELOW:v_[0-9]+]] = tl.minimum({{.*}}, 4)
// TRITON:         for {{.*}} in range(0, [[BELOW]], 16):
// TRITON:         [[UPPER:v_[0-9]+]] = tl.minimum(4, {{.*}})
// TRITON:         for {{.*}} in range([[BELOW]], [[UPPER]], 16):
// TRITON:           tl.dot({{[^,]*}}, {{[^,]*}}, {{[^,]*}})
// TRITON:           tl.max(
// TRITON:           .to(tl.bfloat16)
// TRITON:           tl.dot(
// TRITON:         tl.store(out0
