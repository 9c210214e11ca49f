// RUN: tessera-opt %s | filecheck %s --enable-var-scope
// RUN: tessera-opt %s | tessera-opt | filecheck %s --enable-var-scope
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s --enable-var-scope

// Every op of the graph dialect, printed in its custom form; the second and third RUN
// lines re-parse the custom and the generic form. Op lines end in {{$}} so a printer
// that adds anything (a redundant `-> T`, a type suffix on a property) fails.

// Float unary ops keep their operand's type: the one-type form `: T`.
// CHECK-LABEL: func.func @unary_float
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>) -> tensor<4x8xf32> {
// CHECK-NEXT: %[[NEG:.*]] = graph.neg %[[X]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[ABS:.*]] = graph.abs %[[NEG]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[RELU:.*]] = graph.relu %[[ABS]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[EXP:.*]] = graph.exp %[[RELU]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[LOG:.*]] = graph.log %[[EXP]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[TANH:.*]] = graph.tanh %[[LOG]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[SQRT:.*]] = graph.sqrt %[[TANH]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[RSQRT:.*]] = graph.rsqrt %[[SQRT]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[SILU:.*]] = graph.silu %[[RSQRT]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[SIG:.*]] = graph.sigmoid %[[SILU]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[STOP:.*]] = graph.stop_gradient %[[SIG]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: func.return %[[STOP]] : tensor<4x8xf32>{{$}}
func.func @unary_float(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %neg = graph.neg %x : tensor<4x8xf32>
  %abs = graph.abs %neg : tensor<4x8xf32>
  %relu = graph.relu %abs : tensor<4x8xf32>
  %exp = graph.exp %relu : tensor<4x8xf32>
  %log = graph.log %exp : tensor<4x8xf32>
  %tanh = graph.tanh %log : tensor<4x8xf32>
  %sqrt = graph.sqrt %tanh : tensor<4x8xf32>
  %rsqrt = graph.rsqrt %sqrt : tensor<4x8xf32>
  %silu = graph.silu %rsqrt : tensor<4x8xf32>
  %sig = graph.sigmoid %silu : tensor<4x8xf32>
  %stop = graph.stop_gradient %sig : tensor<4x8xf32>
  func.return %stop : tensor<4x8xf32>
}


// Float unary ops on the half-precision dtypes, and gelu's two approximations (a
// string property printed as a bare identifier, quoted or not in the input).
// CHECK-LABEL: func.func @unary_half_precision_and_gelu
// CHECK-SAME: (%[[H:.*]]: tensor<8xf16>, %[[B:.*]]: tensor<2x3xbf16>) {
// CHECK-NEXT: %[[EXP:.*]] = graph.exp %[[H]] : tensor<8xf16>{{$}}
// CHECK-NEXT: %[[SIG:.*]] = graph.sigmoid %[[B]] : tensor<2x3xbf16>{{$}}
// CHECK-NEXT: %[[G0:.*]] = graph.gelu %[[EXP]] {approximate = none} : tensor<8xf16>{{$}}
// CHECK-NEXT: %[[G1:.*]] = graph.gelu %[[SIG]] {approximate = tanh} : tensor<2x3xbf16>{{$}}
// CHECK-NEXT: %[[G2:.*]] = graph.gelu %[[G0]] {approximate = tanh} : tensor<8xf16>{{$}}
// CHECK-NEXT: func.return
func.func @unary_half_precision_and_gelu(%h: tensor<8xf16>, %b: tensor<2x3xbf16>) {
  %exp = graph.exp %h : tensor<8xf16>
  %sig = graph.sigmoid %b : tensor<2x3xbf16>
  %g0 = graph.gelu %exp {approximate = none} : tensor<8xf16>
  %g1 = graph.gelu %sig {approximate = tanh} : tensor<2x3xbf16>
  %g2 = graph.gelu %g0 {approximate = "tanh"} : tensor<8xf16>
  func.return
}


// neg, abs and relu also take integers; unary ops take 0-d tensors.
// CHECK-LABEL: func.func @unary_integer_and_0d
// CHECK-SAME: (%[[I:.*]]: tensor<4xi32>, %[[L:.*]]: tensor<2x2xi64>, %[[S:.*]]: tensor<f32>) {
// CHECK-NEXT: %{{.*}} = graph.neg %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.abs %[[L]] : tensor<2x2xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.relu %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: %[[E:.*]] = graph.exp %[[S]] : tensor<f32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.neg %[[E]] : tensor<f32>{{$}}
// CHECK-NEXT: func.return
func.func @unary_integer_and_0d(%i: tensor<4xi32>, %l: tensor<2x2xi64>, %s: tensor<f32>) {
  %0 = graph.neg %i : tensor<4xi32>
  %1 = graph.abs %l : tensor<2x2xi64>
  %2 = graph.relu %i : tensor<4xi32>
  %3 = graph.exp %s : tensor<f32>
  %4 = graph.neg %3 : tensor<f32>
  func.return
}


// Binary ops whose operands and result share one type print the one-type form.
// CHECK-LABEL: func.func @binary_same_type
// CHECK-SAME: (%[[A:.*]]: tensor<4x8xf32>, %[[B:.*]]: tensor<4x8xf32>) -> tensor<4x8xf32> {
// CHECK-NEXT: %[[ADD:.*]] = graph.add %[[A]], %[[B]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[SUB:.*]] = graph.sub %[[ADD]], %[[B]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[MUL:.*]] = graph.mul %[[SUB]], %[[A]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[DIV:.*]] = graph.div %[[MUL]], %[[B]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[POW:.*]] = graph.pow %[[DIV]], %[[A]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[MAX:.*]] = graph.maximum %[[POW]], %[[B]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[MIN:.*]] = graph.minimum %[[MAX]], %[[A]] : tensor<4x8xf32>{{$}}
// CHECK-NEXT: func.return %[[MIN]] : tensor<4x8xf32>{{$}}
func.func @binary_same_type(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %add = graph.add %a, %b : tensor<4x8xf32>
  %sub = graph.sub %add, %b : tensor<4x8xf32>
  %mul = graph.mul %sub, %a : tensor<4x8xf32>
  %div = graph.div %mul, %b : tensor<4x8xf32>
  %pow = graph.pow %div, %a : tensor<4x8xf32>
  %max = graph.maximum %pow, %b : tensor<4x8xf32>
  %min = graph.minimum %max, %a : tensor<4x8xf32>
  func.return %min : tensor<4x8xf32>
}


// Numpy broadcasting (trailing dims aligned, size-1 dims stretched, 0-d operands) needs
// the full `T1, T2 -> R` form; the half-precision dtypes broadcast the same way.
// CHECK-LABEL: func.func @binary_broadcast
// CHECK-SAME: (%[[M:.*]]: tensor<4x8xf32>, %[[ROW:.*]]: tensor<8xf32>, %[[COL:.*]]: tensor<4x1xf32>, %[[S:.*]]: tensor<f32>, %[[H:.*]]: tensor<2x1x3xf16>, %[[B:.*]]: tensor<5x1xbf16>, %[[H2:.*]]: tensor<4x3xf16>) {
// CHECK-NEXT: %{{.*}} = graph.add %[[M]], %[[ROW]] : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.mul %[[COL]], %[[ROW]] : tensor<4x1xf32>, tensor<8xf32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.sub %[[S]], %[[M]] : tensor<f32>, tensor<4x8xf32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.div %[[M]], %[[S]] : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.pow %[[H]], %[[H]] : tensor<2x1x3xf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.maximum %[[B]], %[[B]] : tensor<5x1xbf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.minimum %[[H]], %[[H2]] : tensor<2x1x3xf16>, tensor<4x3xf16> -> tensor<2x4x3xf16>{{$}}
// CHECK-NEXT: func.return
func.func @binary_broadcast(%m: tensor<4x8xf32>, %row: tensor<8xf32>, %col: tensor<4x1xf32>, %s: tensor<f32>, %h: tensor<2x1x3xf16>, %b: tensor<5x1xbf16>, %h2: tensor<4x3xf16>) {
  %0 = graph.add %m, %row : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  %1 = graph.mul %col, %row : tensor<4x1xf32>, tensor<8xf32> -> tensor<4x8xf32>
  %2 = graph.sub %s, %m : tensor<f32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %3 = graph.div %m, %s : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  %4 = graph.pow %h, %h : tensor<2x1x3xf16>
  %5 = graph.maximum %b, %b : tensor<5x1xbf16>
  %6 = graph.minimum %h, %h2 : tensor<2x1x3xf16>, tensor<4x3xf16> -> tensor<2x4x3xf16>
  func.return
}

// Integer and bool arithmetic keeps the dtype (numpy's rules; the tracer widens a sum of
// bools or int32 to i64 first): an integer power is an integer, add and mul of bools are
// the logical or and and.
// CHECK-LABEL: func.func @integer_and_bool_arithmetic
// CHECK-SAME: (%[[I:.*]]: tensor<4xi32>, %[[J:.*]]: tensor<4xi64>, %[[C:.*]]: tensor<4xi1>) {
// CHECK-NEXT: %{{.*}} = graph.pow %[[I]], %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.pow %[[J]], %[[J]] : tensor<4xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.add %[[C]], %[[C]] : tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.mul %[[C]], %[[C]] : tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.sub %[[I]], %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: func.return
func.func @integer_and_bool_arithmetic(%i: tensor<4xi32>, %j: tensor<4xi64>, %c: tensor<4xi1>) {
  %0 = graph.pow %i, %i : tensor<4xi32>
  %1 = graph.pow %j, %j : tensor<4xi64>
  %2 = graph.add %c, %c : tensor<4xi1>
  %3 = graph.mul %c, %c : tensor<4xi1>
  %4 = graph.sub %i, %i : tensor<4xi32>
  func.return
}


// add, sub, mul, maximum and minimum take integers.
// CHECK-LABEL: func.func @binary_integer
// CHECK-SAME: (%[[I:.*]]: tensor<4xi32>, %[[L:.*]]: tensor<3x1xi64>, %[[R:.*]]: tensor<4xi64>) {
// CHECK-NEXT: %{{.*}} = graph.add %[[I]], %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.sub %[[I]], %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.mul %[[L]], %[[R]] : tensor<3x1xi64>, tensor<4xi64> -> tensor<3x4xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.maximum %[[R]], %[[R]] : tensor<4xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.minimum %[[I]], %[[I]] : tensor<4xi32>{{$}}
// CHECK-NEXT: func.return
func.func @binary_integer(%i: tensor<4xi32>, %l: tensor<3x1xi64>, %r: tensor<4xi64>) {
  %0 = graph.add %i, %i : tensor<4xi32>
  %1 = graph.sub %i, %i : tensor<4xi32>
  %2 = graph.mul %l, %r : tensor<3x1xi64>, tensor<4xi64> -> tensor<3x4xi64>
  %3 = graph.maximum %r, %r : tensor<4xi64>
  %4 = graph.minimum %i, %i : tensor<4xi32>
  func.return
}


// A plain 2-d matmul: [m, k] @ [k, n] -> [m, n].
// CHECK-LABEL: func.func @matmul_2d
// CHECK-SAME: (%[[X:.*]]: tensor<16x64xf32>, %[[W:.*]]: tensor<64x256xf32>) -> tensor<16x256xf32> {
// CHECK-NEXT: %[[Y:.*]] = graph.matmul %[[X]], %[[W]] : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>{{$}}
// CHECK-NEXT: func.return %[[Y]] : tensor<16x256xf32>{{$}}
func.func @matmul_2d(%x: tensor<16x64xf32>, %w: tensor<64x256xf32>) -> tensor<16x256xf32> {
  %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>
  func.return %y : tensor<16x256xf32>
}


// Batched matmul: batch dims broadcast ([2, 1] with [3] gives [2, 3]); square operands
// of one type print the one-type form; f16 and bf16 contract like f32.
// CHECK-LABEL: func.func @matmul_batched
// CHECK-SAME: (%[[A:.*]]: tensor<2x1x4x8xf32>, %[[B:.*]]: tensor<3x8x5xf32>, %[[H:.*]]: tensor<6x6xf16>, %[[P:.*]]: tensor<7x2x4xbf16>, %[[Q:.*]]: tensor<4x3xbf16>) {
// CHECK-NEXT: %{{.*}} = graph.matmul %[[A]], %[[B]] : tensor<2x1x4x8xf32>, tensor<3x8x5xf32> -> tensor<2x3x4x5xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.matmul %[[H]], %[[H]] : tensor<6x6xf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.matmul %[[P]], %[[Q]] : tensor<7x2x4xbf16>, tensor<4x3xbf16> -> tensor<7x2x3xbf16>{{$}}
// CHECK-NEXT: func.return
func.func @matmul_batched(%a: tensor<2x1x4x8xf32>, %b: tensor<3x8x5xf32>, %h: tensor<6x6xf16>, %p: tensor<7x2x4xbf16>, %q: tensor<4x3xbf16>) {
  %0 = graph.matmul %a, %b : tensor<2x1x4x8xf32>, tensor<3x8x5xf32> -> tensor<2x3x4x5xf32>
  %1 = graph.matmul %h, %h : tensor<6x6xf16>
  %2 = graph.matmul %p, %q : tensor<7x2x4xbf16>, tensor<4x3xbf16> -> tensor<7x2x3xbf16>
  func.return
}


// compare: every predicate, float and integer operands, broadcasting; the result is i1.
// CHECK-LABEL: func.func @compare_predicates
// CHECK-SAME: (%[[A:.*]]: tensor<4xf32>, %[[B:.*]]: tensor<4xf32>, %[[I:.*]]: tensor<2x1xi64>, %[[J:.*]]: tensor<3xi64>, %[[C:.*]]: tensor<4xi1>) {
// CHECK-NEXT: %{{.*}} = graph.compare %[[A]], %[[B]] {predicate = eq} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.compare %[[A]], %[[B]] {predicate = ne} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.compare %[[A]], %[[B]] {predicate = lt} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.compare %[[A]], %[[B]] {predicate = le} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.compare %[[I]], %[[J]] {predicate = gt} : tensor<2x1xi64>, tensor<3xi64> -> tensor<2x3xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.compare %[[I]], %[[J]] {predicate = ge} : tensor<2x1xi64>, tensor<3xi64> -> tensor<2x3xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.compare %[[C]], %[[C]] {predicate = eq} : tensor<4xi1>{{$}}
// CHECK-NEXT: func.return
func.func @compare_predicates(%a: tensor<4xf32>, %b: tensor<4xf32>, %i: tensor<2x1xi64>, %j: tensor<3xi64>, %c: tensor<4xi1>) {
  %0 = graph.compare %a, %b {predicate = eq} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  %1 = graph.compare %a, %b {predicate = ne} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  %2 = graph.compare %a, %b {predicate = lt} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  %3 = graph.compare %a, %b {predicate = le} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  %4 = graph.compare %i, %j {predicate = gt} : tensor<2x1xi64>, tensor<3xi64> -> tensor<2x3xi1>
  %5 = graph.compare %i, %j {predicate = ge} : tensor<2x1xi64>, tensor<3xi64> -> tensor<2x3xi1>
  %6 = graph.compare %c, %c {predicate = eq} : tensor<4xi1>
  func.return
}


// select: an i1 condition picks between two values of one dtype; all three broadcast.
// CHECK-LABEL: func.func @select
// CHECK-SAME: (%[[C:.*]]: tensor<4x8xi1>, %[[X:.*]]: tensor<4x8xf32>, %[[Y:.*]]: tensor<4x8xf32>, %[[COL:.*]]: tensor<4x1xi1>, %[[S:.*]]: tensor<i32>, %[[I:.*]]: tensor<8xi32>) {
// CHECK-NEXT: %{{.*}} = graph.select %[[C]], %[[X]], %[[Y]] : tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.select %[[COL]], %[[I]], %[[S]] : tensor<4x1xi1>, tensor<8xi32>, tensor<i32> -> tensor<4x8xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.select %[[C]], %[[C]], %[[C]] : tensor<4x8xi1>{{$}}
// CHECK-NEXT: func.return
func.func @select(%c: tensor<4x8xi1>, %x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %col: tensor<4x1xi1>, %s: tensor<i32>, %i: tensor<8xi32>) {
  %0 = graph.select %c, %x, %y : tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %1 = graph.select %col, %i, %s : tensor<4x1xi1>, tensor<8xi32>, tensor<i32> -> tensor<4x8xi32>
  %2 = graph.select %c, %c, %c : tensor<4x8xi1>
  func.return
}


// cast converts between all six dtypes; the target dtype is only in the result type.
// CHECK-LABEL: func.func @cast_dtypes
// CHECK-SAME: (%[[X:.*]]: tensor<2x3xf32>) {
// CHECK-NEXT: %[[F16:.*]] = graph.cast %[[X]] : tensor<2x3xf32> -> tensor<2x3xf16>{{$}}
// CHECK-NEXT: %[[BF16:.*]] = graph.cast %[[F16]] : tensor<2x3xf16> -> tensor<2x3xbf16>{{$}}
// CHECK-NEXT: %[[I32:.*]] = graph.cast %[[BF16]] : tensor<2x3xbf16> -> tensor<2x3xi32>{{$}}
// CHECK-NEXT: %[[I64:.*]] = graph.cast %[[I32]] : tensor<2x3xi32> -> tensor<2x3xi64>{{$}}
// CHECK-NEXT: %[[I1:.*]] = graph.cast %[[I64]] : tensor<2x3xi64> -> tensor<2x3xi1>{{$}}
// CHECK-NEXT: %[[F32:.*]] = graph.cast %[[I1]] : tensor<2x3xi1> -> tensor<2x3xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.cast %[[F32]] : tensor<2x3xf32>{{$}}
// CHECK-NEXT: func.return
func.func @cast_dtypes(%x: tensor<2x3xf32>) {
  %f16 = graph.cast %x : tensor<2x3xf32> -> tensor<2x3xf16>
  %bf16 = graph.cast %f16 : tensor<2x3xf16> -> tensor<2x3xbf16>
  %i32 = graph.cast %bf16 : tensor<2x3xbf16> -> tensor<2x3xi32>
  %i64 = graph.cast %i32 : tensor<2x3xi32> -> tensor<2x3xi64>
  %i1 = graph.cast %i64 : tensor<2x3xi64> -> tensor<2x3xi1>
  %f32 = graph.cast %i1 : tensor<2x3xi1> -> tensor<2x3xf32>
  %same = graph.cast %f32 : tensor<2x3xf32>
  func.return
}


// Splat constants (one value fills the tensor, as op.full makes) of every dtype, 0-d too.
// CHECK-LABEL: func.func @constant_splat
// CHECK-NEXT: %{{.*}} = graph.constant dense<1.500000e+00> : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<0.000000e+00> : tensor<16xf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<-2.500000e-01> : tensor<2x2xbf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<7> : tensor<3xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<-1> : tensor<2x5xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<true> : tensor<4xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<3.000000e+00> : tensor<f32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<42> : tensor<i64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<false> : tensor<i1>{{$}}
// CHECK-NEXT: func.return
func.func @constant_splat() {
  %0 = graph.constant dense<1.5> : tensor<4x8xf32>
  %1 = graph.constant dense<0.0> : tensor<16xf16>
  %2 = graph.constant dense<-0.25> : tensor<2x2xbf16>
  %3 = graph.constant dense<7> : tensor<3xi32>
  %4 = graph.constant dense<-1> : tensor<2x5xi64>
  %5 = graph.constant dense<true> : tensor<4xi1>
  %6 = graph.constant dense<3.0> : tensor<f32>
  %7 = graph.constant dense<42> : tensor<i64>
  %8 = graph.constant dense<false> : tensor<i1>
  func.return
}


// Non-splat constants of every dtype, nested for rank 2.
// CHECK-LABEL: func.func @constant_non_splat
// CHECK-NEXT: %{{.*}} = graph.constant dense<{{\[}}[1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]> : tensor<2x2xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<[5.000000e-01, 2.500000e-01]> : tensor<2xf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<[1.000000e+00, -2.000000e+00, 3.000000e+00]> : tensor<3xbf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<[0, 1, 2]> : tensor<3xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<{{\[}}[1, -2], [3, 4]]> : tensor<2x2xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant dense<[true, false, true]> : tensor<3xi1>{{$}}
// CHECK-NEXT: func.return
func.func @constant_non_splat() {
  %0 = graph.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %1 = graph.constant dense<[0.5, 0.25]> : tensor<2xf16>
  %2 = graph.constant dense<[1.0, -2.0, 3.0]> : tensor<3xbf16>
  %3 = graph.constant dense<[0, 1, 2]> : tensor<3xi32>
  %4 = graph.constant dense<[[1, -2], [3, 4]]> : tensor<2x2xi64>
  %5 = graph.constant dense<[true, false, true]> : tensor<3xi1>
  func.return
}


// Reductions: keepdims true keeps reduced dims as 1, false drops them; several axes;
// empty axes reduce nothing (the result type is the operand's: the one-type form).
// CHECK-LABEL: func.func @reductions
// CHECK-SAME: (%[[X:.*]]: tensor<2x3x4xf32>, %[[I:.*]]: tensor<5x6xi32>) {
// CHECK-NEXT: %{{.*}} = graph.sum %[[X]] {axes = [1], keepdims = true} : tensor<2x3x4xf32> -> tensor<2x1x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.sum %[[X]] {axes = [1], keepdims = false} : tensor<2x3x4xf32> -> tensor<2x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.mean %[[X]] {axes = [0, 2], keepdims = false} : tensor<2x3x4xf32> -> tensor<3xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.mean %[[X]] {axes = [0, 2], keepdims = true} : tensor<2x3x4xf32> -> tensor<1x3x1xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.max %[[X]] {axes = [], keepdims = false} : tensor<2x3x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.min %[[X]] {axes = [], keepdims = true} : tensor<2x3x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.max %[[I]] {axes = [0], keepdims = false} : tensor<5x6xi32> -> tensor<6xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.min %[[I]] {axes = [1], keepdims = true} : tensor<5x6xi32> -> tensor<5x1xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.sum %[[I]] {axes = [0, 1], keepdims = false} : tensor<5x6xi32> -> tensor<i32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.prod %[[X]] {axes = [2], keepdims = false} : tensor<2x3x4xf32> -> tensor<2x3xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.prod %[[I]] {axes = [1], keepdims = true} : tensor<5x6xi32> -> tensor<5x1xi32>{{$}}
// CHECK-NEXT: func.return
func.func @reductions(%x: tensor<2x3x4xf32>, %i: tensor<5x6xi32>) {
  %0 = graph.sum %x {axes = [1], keepdims = true} : tensor<2x3x4xf32> -> tensor<2x1x4xf32>
  %1 = graph.sum %x {axes = [1], keepdims = false} : tensor<2x3x4xf32> -> tensor<2x4xf32>
  %2 = graph.mean %x {axes = [0, 2], keepdims = false} : tensor<2x3x4xf32> -> tensor<3xf32>
  %3 = graph.mean %x {axes = [0, 2], keepdims = true} : tensor<2x3x4xf32> -> tensor<1x3x1xf32>
  %4 = graph.max %x {axes = [], keepdims = false} : tensor<2x3x4xf32>
  %5 = graph.min %x {axes = [], keepdims = true} : tensor<2x3x4xf32>
  %6 = graph.max %i {axes = [0], keepdims = false} : tensor<5x6xi32> -> tensor<6xi32>
  %7 = graph.min %i {axes = [1], keepdims = true} : tensor<5x6xi32> -> tensor<5x1xi32>
  %8 = graph.sum %i {axes = [0, 1], keepdims = false} : tensor<5x6xi32> -> tensor<i32>
  %9 = graph.prod %x {axes = [2], keepdims = false} : tensor<2x3x4xf32> -> tensor<2x3xf32>
  %10 = graph.prod %i {axes = [1], keepdims = true} : tensor<5x6xi32> -> tensor<5x1xi32>
  func.return
}


// Reductions over every axis give 0-d tensors; a 0-d tensor reduces over no axes. mean
// takes the half-precision dtypes.
// CHECK-LABEL: func.func @reductions_0d
// CHECK-SAME: (%[[X:.*]]: tensor<8xbf16>, %[[S:.*]]: tensor<f16>) {
// CHECK-NEXT: %[[M:.*]] = graph.mean %[[X]] {axes = [0], keepdims = false} : tensor<8xbf16> -> tensor<bf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.sum %[[M]] {axes = [], keepdims = true} : tensor<bf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.mean %[[S]] {axes = [], keepdims = false} : tensor<f16>{{$}}
// CHECK-NEXT: func.return
func.func @reductions_0d(%x: tensor<8xbf16>, %s: tensor<f16>) {
  %m = graph.mean %x {axes = [0], keepdims = false} : tensor<8xbf16> -> tensor<bf16>
  %0 = graph.sum %m {axes = [], keepdims = true} : tensor<bf16>
  %1 = graph.mean %s {axes = [], keepdims = false} : tensor<f16>
  func.return
}


// softmax and log_softmax along one axis (an integer property).
// CHECK-LABEL: func.func @softmax
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[B:.*]]: tensor<2x3x5xbf16>) {
// CHECK-NEXT: %{{.*}} = graph.softmax %[[X]] {axis = 1} : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.softmax %[[X]] {axis = 0} : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.log_softmax %[[B]] {axis = 2} : tensor<2x3x5xbf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.log_softmax %[[X]] {axis = 1} : tensor<4x8xf32>{{$}}
// CHECK-NEXT: func.return
func.func @softmax(%x: tensor<4x8xf32>, %b: tensor<2x3x5xbf16>) {
  %0 = graph.softmax %x {axis = 1} : tensor<4x8xf32>
  %1 = graph.softmax %x {axis = 0} : tensor<4x8xf32>
  %2 = graph.log_softmax %b {axis = 2} : tensor<2x3x5xbf16>
  %3 = graph.log_softmax %x {axis = 1} : tensor<4x8xf32>
  func.return
}


// layer_norm and rms_norm over one or several axes; eps is a float property printed
// without its type (1.0e-05, 0.0, 0.5).
// CHECK-LABEL: func.func @norms
// CHECK-SAME: (%[[X:.*]]: tensor<2x3x4xf32>, %[[H:.*]]: tensor<4x8xf16>) {
// CHECK-NEXT: %{{.*}} = graph.layer_norm %[[X]] {axes = [2], eps = 1.0e-05} : tensor<2x3x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.layer_norm %[[X]] {axes = [1, 2], eps = 0.0} : tensor<2x3x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.rms_norm %[[H]] {axes = [1], eps = 1.0e-06} : tensor<4x8xf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.rms_norm %[[X]] {axes = [0, 1, 2], eps = 0.5} : tensor<2x3x4xf32>{{$}}
// CHECK-NEXT: func.return
func.func @norms(%x: tensor<2x3x4xf32>, %h: tensor<4x8xf16>) {
  %0 = graph.layer_norm %x {axes = [2], eps = 1.0e-05} : tensor<2x3x4xf32>
  %1 = graph.layer_norm %x {axes = [1, 2], eps = 0.0} : tensor<2x3x4xf32>
  %2 = graph.rms_norm %h {axes = [1], eps = 1.0e-06} : tensor<4x8xf16>
  %3 = graph.rms_norm %x {axes = [0, 1, 2], eps = 0.5} : tensor<2x3x4xf32>
  func.return
}


// cross_entropy with each reduction: none keeps the labels' shape, mean and sum give a
// 0-d loss; labels may be i32 or i64; logits may be bf16.
// CHECK-LABEL: func.func @cross_entropy
// CHECK-SAME: (%[[LOGITS:.*]]: tensor<4x10xf32>, %[[L32:.*]]: tensor<4xi32>, %[[L64:.*]]: tensor<4xi64>, %[[SEQ:.*]]: tensor<2x3x5xbf16>, %[[IDS:.*]]: tensor<2x3xi64>) {
// CHECK-NEXT: %{{.*}} = graph.cross_entropy %[[LOGITS]], %[[L32]] {reduction = none} : tensor<4x10xf32>, tensor<4xi32> -> tensor<4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.cross_entropy %[[LOGITS]], %[[L64]] {reduction = mean} : tensor<4x10xf32>, tensor<4xi64> -> tensor<f32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.cross_entropy %[[LOGITS]], %[[L32]] {reduction = sum} : tensor<4x10xf32>, tensor<4xi32> -> tensor<f32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.cross_entropy %[[SEQ]], %[[IDS]] {reduction = none} : tensor<2x3x5xbf16>, tensor<2x3xi64> -> tensor<2x3xbf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.cross_entropy %[[SEQ]], %[[IDS]] {reduction = mean} : tensor<2x3x5xbf16>, tensor<2x3xi64> -> tensor<bf16>{{$}}
// CHECK-NEXT: func.return
func.func @cross_entropy(%logits: tensor<4x10xf32>, %l32: tensor<4xi32>, %l64: tensor<4xi64>, %seq: tensor<2x3x5xbf16>, %ids: tensor<2x3xi64>) {
  %0 = graph.cross_entropy %logits, %l32 {reduction = none} : tensor<4x10xf32>, tensor<4xi32> -> tensor<4xf32>
  %1 = graph.cross_entropy %logits, %l64 {reduction = mean} : tensor<4x10xf32>, tensor<4xi64> -> tensor<f32>
  %2 = graph.cross_entropy %logits, %l32 {reduction = sum} : tensor<4x10xf32>, tensor<4xi32> -> tensor<f32>
  %3 = graph.cross_entropy %seq, %ids {reduction = none} : tensor<2x3x5xbf16>, tensor<2x3xi64> -> tensor<2x3xbf16>
  %4 = graph.cross_entropy %seq, %ids {reduction = mean} : tensor<2x3x5xbf16>, tensor<2x3xi64> -> tensor<bf16>
  func.return
}


// reshape: the target shape is the result type's; to and from 0-d, and size-0 tensors.
// CHECK-LABEL: func.func @reshape
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[ONE:.*]]: tensor<1xi64>, %[[E:.*]]: tensor<0x3xf16>) {
// CHECK-NEXT: %[[FLAT:.*]] = graph.reshape %[[X]] : tensor<4x8xf32> -> tensor<32xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.reshape %[[FLAT]] : tensor<32xf32> -> tensor<2x2x8xf32>{{$}}
// CHECK-NEXT: %[[S:.*]] = graph.reshape %[[ONE]] : tensor<1xi64> -> tensor<i64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.reshape %[[S]] : tensor<i64> -> tensor<1x1xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.reshape %[[E]] : tensor<0x3xf16> -> tensor<3x0xf16>{{$}}
// CHECK-NEXT: func.return
func.func @reshape(%x: tensor<4x8xf32>, %one: tensor<1xi64>, %e: tensor<0x3xf16>) {
  %flat = graph.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %0 = graph.reshape %flat : tensor<32xf32> -> tensor<2x2x8xf32>
  %s = graph.reshape %one : tensor<1xi64> -> tensor<i64>
  %1 = graph.reshape %s : tensor<i64> -> tensor<1x1xi64>
  %2 = graph.reshape %e : tensor<0x3xf16> -> tensor<3x0xf16>
  func.return
}


// broadcast_to: prepends dims, stretches size-1 dims, expands 0-d tensors.
// CHECK-LABEL: func.func @broadcast_to
// CHECK-SAME: (%[[ROW:.*]]: tensor<8xf32>, %[[COL:.*]]: tensor<4x1xi32>, %[[S:.*]]: tensor<i1>) {
// CHECK-NEXT: %{{.*}} = graph.broadcast_to %[[ROW]] : tensor<8xf32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.broadcast_to %[[COL]] : tensor<4x1xi32> -> tensor<2x4x8xi32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.broadcast_to %[[S]] : tensor<i1> -> tensor<2x3xi1>{{$}}
// CHECK-NEXT: func.return
func.func @broadcast_to(%row: tensor<8xf32>, %col: tensor<4x1xi32>, %s: tensor<i1>) {
  %0 = graph.broadcast_to %row : tensor<8xf32> -> tensor<4x8xf32>
  %1 = graph.broadcast_to %col : tensor<4x1xi32> -> tensor<2x4x8xi32>
  %2 = graph.broadcast_to %s : tensor<i1> -> tensor<2x3xi1>
  func.return
}


// transpose: result dim i is operand dim perm[i]; the identity perm keeps the type.
// CHECK-LABEL: func.func @transpose
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[Y:.*]]: tensor<2x3x5xi64>) {
// CHECK-NEXT: %{{.*}} = graph.transpose %[[X]] {perm = [1, 0]} : tensor<4x8xf32> -> tensor<8x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.transpose %[[Y]] {perm = [0, 2, 1]} : tensor<2x3x5xi64> -> tensor<2x5x3xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.transpose %[[Y]] {perm = [2, 0, 1]} : tensor<2x3x5xi64> -> tensor<5x2x3xi64>{{$}}
// CHECK-NEXT: %{{.*}} = graph.transpose %[[X]] {perm = [0, 1]} : tensor<4x8xf32>{{$}}
// CHECK-NEXT: func.return
func.func @transpose(%x: tensor<4x8xf32>, %y: tensor<2x3x5xi64>) {
  %0 = graph.transpose %x {perm = [1, 0]} : tensor<4x8xf32> -> tensor<8x4xf32>
  %1 = graph.transpose %y {perm = [0, 2, 1]} : tensor<2x3x5xi64> -> tensor<2x5x3xi64>
  %2 = graph.transpose %y {perm = [2, 0, 1]} : tensor<2x3x5xi64> -> tensor<5x2x3xi64>
  %3 = graph.transpose %x {perm = [0, 1]} : tensor<4x8xf32>
  func.return
}


// slice with unit and larger strides (sizes round up: ceil((7 - 0) / 3) = 3), an empty
// slice (start == limit), the full range (one-type form) and a 0-d operand.
// CHECK-LABEL: func.func @slice
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[S:.*]]: tensor<bf16>) {
// CHECK-NEXT: %{{.*}} = graph.slice %[[X]] {starts = [1, 2], limits = [3, 8], strides = [1, 1]} : tensor<4x8xf32> -> tensor<2x6xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.slice %[[X]] {starts = [1, 0], limits = [4, 7], strides = [2, 3]} : tensor<4x8xf32> -> tensor<2x3xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.slice %[[X]] {starts = [2, 0], limits = [2, 8], strides = [1, 1]} : tensor<4x8xf32> -> tensor<0x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.slice %[[X]] {starts = [0, 0], limits = [4, 8], strides = [1, 1]} : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.slice %[[S]] {starts = [], limits = [], strides = []} : tensor<bf16>{{$}}
// CHECK-NEXT: func.return
func.func @slice(%x: tensor<4x8xf32>, %s: tensor<bf16>) {
  %0 = graph.slice %x {starts = [1, 2], limits = [3, 8], strides = [1, 1]} : tensor<4x8xf32> -> tensor<2x6xf32>
  %1 = graph.slice %x {starts = [1, 0], limits = [4, 7], strides = [2, 3]} : tensor<4x8xf32> -> tensor<2x3xf32>
  %2 = graph.slice %x {starts = [2, 0], limits = [2, 8], strides = [1, 1]} : tensor<4x8xf32> -> tensor<0x8xf32>
  %3 = graph.slice %x {starts = [0, 0], limits = [4, 8], strides = [1, 1]} : tensor<4x8xf32>
  %4 = graph.slice %s {starts = [], limits = [], strides = []} : tensor<bf16>
  func.return
}


// concat of three operands of different sizes along axis 0 and along axis 1, and of a
// single operand (the one-type form).
// CHECK-LABEL: func.func @concat
// CHECK-SAME: (%[[A:.*]]: tensor<1x8xf32>, %[[B:.*]]: tensor<2x8xf32>, %[[C:.*]]: tensor<3x8xf32>, %[[P:.*]]: tensor<2x1xi1>, %[[Q:.*]]: tensor<2x3xi1>) {
// CHECK-NEXT: %{{.*}} = graph.concat %[[A]], %[[B]], %[[C]] {axis = 0} : tensor<1x8xf32>, tensor<2x8xf32>, tensor<3x8xf32> -> tensor<6x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.concat %[[P]], %[[Q]], %[[P]] {axis = 1} : tensor<2x1xi1>, tensor<2x3xi1>, tensor<2x1xi1> -> tensor<2x5xi1>{{$}}
// CHECK-NEXT: %{{.*}} = graph.concat %[[B]] {axis = 1} : tensor<2x8xf32>{{$}}
// CHECK-NEXT: func.return
func.func @concat(%a: tensor<1x8xf32>, %b: tensor<2x8xf32>, %c: tensor<3x8xf32>, %p: tensor<2x1xi1>, %q: tensor<2x3xi1>) {
  %0 = graph.concat %a, %b, %c {axis = 0} : tensor<1x8xf32>, tensor<2x8xf32>, tensor<3x8xf32> -> tensor<6x8xf32>
  %1 = graph.concat %p, %q, %p {axis = 1} : tensor<2x1xi1>, tensor<2x3xi1>, tensor<2x1xi1> -> tensor<2x5xi1>
  %2 = graph.concat %b {axis = 1} : tensor<2x8xf32>
  func.return
}


// split into several results (the `-> (R1, R2, R3)` form) of unequal sizes, into pieces
// of size 0, into a single piece (the one-type form), and a size-0 dim into no pieces.
// CHECK-LABEL: func.func @split
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[I:.*]]: tensor<6xi64>, %[[E:.*]]: tensor<4x0xf32>) -> (tensor<4x2xf32>, tensor<4x4xf32>) {
// CHECK-NEXT: %[[P0:.*]], %[[P1:.*]], %[[P2:.*]] = graph.split %[[X]] {axis = 1} : tensor<4x8xf32> -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x4xf32>){{$}}
// CHECK-NEXT: %{{.*}}, %{{.*}} = graph.split %[[I]] {axis = 0} : tensor<6xi64> -> (tensor<0xi64>, tensor<6xi64>){{$}}
// CHECK-NEXT: %{{.*}} = graph.split %[[I]] {axis = 0} : tensor<6xi64>{{$}}
// CHECK-NEXT: graph.split %[[E]] {axis = 1} : tensor<4x0xf32> -> (){{$}}
// CHECK-NEXT: func.return %[[P1]], %[[P2]] : tensor<4x2xf32>, tensor<4x4xf32>{{$}}
func.func @split(%x: tensor<4x8xf32>, %i: tensor<6xi64>, %e: tensor<4x0xf32>) -> (tensor<4x2xf32>, tensor<4x4xf32>) {
  %parts:3 = graph.split %x {axis = 1} : tensor<4x8xf32> -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x4xf32>)
  %halves:2 = graph.split %i {axis = 0} : tensor<6xi64> -> (tensor<0xi64>, tensor<6xi64>)
  %whole = graph.split %i {axis = 0} : tensor<6xi64>
  graph.split %e {axis = 1} : tensor<4x0xf32> -> ()
  func.return %parts#1, %parts#2 : tensor<4x2xf32>, tensor<4x4xf32>
}


// gather: an embedding lookup (axis 0, i32 ids), i64 indices on axis 1, a 0-d index
// (the gathered dim disappears).
// CHECK-LABEL: func.func @gather
// CHECK-SAME: (%[[TABLE:.*]]: tensor<100x16xf32>, %[[IDS:.*]]: tensor<4x8xi32>, %[[X:.*]]: tensor<3x5xbf16>, %[[IDX:.*]]: tensor<2xi64>, %[[S:.*]]: tensor<i64>) {
// CHECK-NEXT: %{{.*}} = graph.gather %[[TABLE]], %[[IDS]] {axis = 0} : tensor<100x16xf32>, tensor<4x8xi32> -> tensor<4x8x16xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.gather %[[X]], %[[IDX]] {axis = 1} : tensor<3x5xbf16>, tensor<2xi64> -> tensor<3x2xbf16>{{$}}
// CHECK-NEXT: %{{.*}} = graph.gather %[[X]], %[[S]] {axis = 0} : tensor<3x5xbf16>, tensor<i64> -> tensor<5xbf16>{{$}}
// CHECK-NEXT: func.return
func.func @gather(%table: tensor<100x16xf32>, %ids: tensor<4x8xi32>, %x: tensor<3x5xbf16>, %idx: tensor<2xi64>, %s: tensor<i64>) {
  %0 = graph.gather %table, %ids {axis = 0} : tensor<100x16xf32>, tensor<4x8xi32> -> tensor<4x8x16xf32>
  %1 = graph.gather %x, %idx {axis = 1} : tensor<3x5xbf16>, tensor<2xi64> -> tensor<3x2xbf16>
  %2 = graph.gather %x, %s {axis = 0} : tensor<3x5xbf16>, tensor<i64> -> tensor<5xbf16>
  func.return
}



// attention: q, k, v (k and v with half of q's heads: grouped-query attention), the
// optional i32 position offsets of a causal block; two results (the output and the
// f32 log-sum-exp per query row; f64 for f64 inputs). Its backward takes the output's
// cotangent, lse and delta = rowsum(do * o), and gives q's, k's and v's types.
// CHECK-LABEL: func.func @attention
// CHECK-SAME: (%[[Q:.*]]: tensor<2x4x16x8xf32>, %[[K:.*]]: tensor<2x2x24x8xf32>, %[[V:.*]]: tensor<2x2x24x16xf32>, %[[Q0:.*]]: tensor<i32>, %[[K0:.*]]: tensor<i32>, %[[D:.*]]: tensor<5x4xf64>, %[[DO:.*]]: tensor<2x4x16x16xf32>, %[[L:.*]]: tensor<2x4x16xf32>) {
// CHECK-NEXT: %{{.*}}, %{{.*}} = graph.attention %[[Q]], %[[K]], %[[V]] {causal = false, scale = 0.125} : tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32> -> (tensor<2x4x16x16xf32>, tensor<2x4x16xf32>){{$}}
// CHECK-NEXT: %{{.*}}, %{{.*}} = graph.attention %[[Q]], %[[K]], %[[V]], %[[Q0]], %[[K0]] {causal = true, scale = 0.35} : tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x16xf32>, tensor<2x4x16xf32>){{$}}
// CHECK-NEXT: %{{.*}}, %{{.*}} = graph.attention %[[D]], %[[D]], %[[D]] {causal = true, scale = 1.0} : tensor<5x4xf64>, tensor<5x4xf64>, tensor<5x4xf64> -> (tensor<5x4xf64>, tensor<5xf64>){{$}}
// CHECK-NEXT: %{{.*}}, %{{.*}}, %{{.*}} = graph.attention_backward %[[Q]], %[[K]], %[[V]], %[[DO]], %[[L]], %[[L]], %[[Q0]], %[[K0]] {causal = true, scale = 0.35} : tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32>, tensor<2x4x16x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32>){{$}}
// CHECK-NEXT: func.return
func.func @attention(%q: tensor<2x4x16x8xf32>, %k: tensor<2x2x24x8xf32>, %v: tensor<2x2x24x16xf32>, %q0: tensor<i32>, %k0: tensor<i32>, %d: tensor<5x4xf64>, %do: tensor<2x4x16x16xf32>, %lse: tensor<2x4x16xf32>) {
  %o, %l = graph.attention %q, %k, %v {causal = false, scale = 0.125} : tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32> -> (tensor<2x4x16x16xf32>, tensor<2x4x16xf32>)
  %o1, %l1 = graph.attention %q, %k, %v, %q0, %k0 {causal = true, scale = 0.35} : tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x16xf32>, tensor<2x4x16xf32>)
  %o2, %l2 = graph.attention %d, %d, %d {causal = true, scale = 1.0} : tensor<5x4xf64>, tensor<5x4xf64>, tensor<5x4xf64> -> (tensor<5x4xf64>, tensor<5xf64>)
  %dq, %dk, %dv = graph.attention_backward %q, %k, %v, %do, %lse, %lse, %q0, %k0 {causal = true, scale = 0.35} : tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32>, tensor<2x4x16x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<i32>, tensor<i32> -> (tensor<2x4x16x8xf32>, tensor<2x2x24x8xf32>, tensor<2x2x24x16xf32>)
  func.return
}

// The fp8 quantisers: fp8_quantize (a value and its scalar scale), fp8_grad (identity,
// its cotangent quantised) and fp8_grad_delayed (with a given scale; a probe whose
// cotangent is the cotangent's amax), each with its format; a matmul of fp8 values.
// CHECK-LABEL: func.func @fp8
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[S:.*]]: tensor<f32>) {
// CHECK-NEXT: %[[Q:.*]] = graph.fp8_quantize %[[X]], %[[S]] {format = e4m3} : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.fp8_grad %[[Q]] {format = e5m2} : tensor<4x8xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.fp8_grad_delayed %[[Q]], %[[S]], %[[S]] {format = e5m2} : tensor<4x8xf32>, tensor<f32>, tensor<f32> -> tensor<4x8xf32>{{$}}
// CHECK-NEXT: %[[T:.*]] = graph.transpose %[[Q]] {perm = [1, 0]} : tensor<4x8xf32> -> tensor<8x4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.matmul %[[Q]], %[[T]] {fp8 = e4m3} : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>{{$}}
// CHECK-NEXT: func.return
func.func @fp8(%x: tensor<4x8xf32>, %s: tensor<f32>) {
  %q = graph.fp8_quantize %x, %s {format = e4m3} : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  %g = graph.fp8_grad %q {format = e5m2} : tensor<4x8xf32>
  %d = graph.fp8_grad_delayed %q, %s, %s {format = e5m2} : tensor<4x8xf32>, tensor<f32>, tensor<f32> -> tensor<4x8xf32>
  %t = graph.transpose %q {perm = [1, 0]} : tensor<4x8xf32> -> tensor<8x4xf32>
  %m = graph.matmul %q, %t {fp8 = e4m3} : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
  func.return
}

// Discardable attributes print after the properties with the `attributes` keyword
// (before the value for a constant) and survive both round trips.
// CHECK-LABEL: func.func @discardable_attributes
// CHECK-SAME: (%[[X:.*]]: tensor<4xf32>) {
// CHECK-NEXT: %{{.*}} = graph.neg %[[X]] attributes {tag = "n"} : tensor<4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.gelu %[[X]] {approximate = none} attributes {tag = 1 : i64} : tensor<4xf32>{{$}}
// CHECK-NEXT: %{{.*}} = graph.constant attributes {tag} dense<1.000000e+00> : tensor<4xf32>{{$}}
// CHECK-NEXT: func.return
func.func @discardable_attributes(%x: tensor<4xf32>) {
  %0 = graph.neg %x attributes {tag = "n"} : tensor<4xf32>
  %1 = graph.gelu %x {approximate = none} attributes {tag = 1 : i64} : tensor<4xf32>
  %2 = graph.constant attributes {tag} dense<1.0> : tensor<4xf32>
  func.return
}
