// RUN: tessera-opt %s --split-input-file --verify-diagnostics | filecheck %s

// One case per verifier message of the graph dialect: the shape rules of
// tessera/ir/shape_rules.py, the result-type check of GraphOp.verify_, and the IRDL
// constraints (operand and result kinds, property kinds, operand and result counts).

// --- elementwise ---------------------------------------------------------------------

// Transcendental ops need a floating-point operand.
func.func @exp_of_integer(%x: tensor<4x8xi32>) {
  // CHECK: graph.exp: expected a floating-point operand, found tensor<4x8xi32>{{$}}
  %0 = graph.exp %x : tensor<4x8xi32>
  func.return
}

// -----

// gelu's approximation is none or tanh.
func.func @gelu_unknown_approximation(%x: tensor<4xf32>) {
  // CHECK: graph.gelu: approximate must be one of ('none', 'tanh'), found 'erf'{{$}}
  %0 = graph.gelu %x {approximate = erf} : tensor<4xf32>
  func.return
}

// -----

// A declared result type that differs from the inferred one.
func.func @neg_wrong_result_type(%x: tensor<4xf32>) {
  // CHECK: graph.neg: result 0 type mismatch: expected tensor<4xf32>, found tensor<4xf16>{{$}}
  %0 = graph.neg %x : tensor<4xf32> -> tensor<4xf16>
  func.return
}

// -----

// Binary ops do not promote: both operands have one element type.
func.func @add_mixed_dtypes(%a: tensor<4xf32>, %b: tensor<4xf16>) {
  // CHECK: graph.add: expected operands of one element type, found tensor<4xf32>, tensor<4xf16>{{$}}
  %0 = graph.add %a, %b : tensor<4xf32>, tensor<4xf16> -> tensor<4xf32>
  func.return
}

// -----

// Dimensions that are neither equal nor 1 do not broadcast.
func.func @add_no_broadcast(%a: tensor<4x3xf32>, %b: tensor<4x5xf32>) {
  // CHECK: graph.add: shapes [4, 3] and [4, 5] do not broadcast: dimension 1 (aligned right) has sizes [3, 5]{{$}}
  %0 = graph.add %a, %b : tensor<4x3xf32>, tensor<4x5xf32> -> tensor<4x5xf32>
  func.return
}

// -----

// The result of a broadcasting op has the broadcast shape.
func.func @mul_wrong_broadcast_result(%a: tensor<4x1xf32>, %b: tensor<8xf32>) {
  // CHECK: graph.mul: result 0 type mismatch: expected tensor<4x8xf32>, found tensor<4x1xf32>{{$}}
  %0 = graph.mul %a, %b : tensor<4x1xf32>, tensor<8xf32> -> tensor<4x1xf32>
  func.return
}

// -----

// div needs floating-point operands (the tracer casts integers first).
func.func @div_of_integers(%a: tensor<4xi32>, %b: tensor<4xi32>) {
  // CHECK: graph.div: expected a floating-point operand pair, found tensor<4xi32>{{$}}
  %0 = graph.div %a, %b : tensor<4xi32>
  func.return
}

// -----

// numpy and torch reject subtracting and negating bools; torch rejects bool ** bool.
func.func @sub_of_bools(%a: tensor<4xi1>, %b: tensor<4xi1>) {
  // CHECK: graph.sub: bool subtraction is not supported (numpy and torch reject it too), found tensor<4xi1> and tensor<4xi1>; op.not_equal(a, b) is the exclusive or, or cast to an integer first{{$}}
  %0 = graph.sub %a, %b : tensor<4xi1>
  func.return
}

// -----

func.func @neg_of_bool(%a: tensor<4xi1>) {
  // CHECK: graph.neg: negating a bool tensor is not supported (numpy and torch reject it too), found tensor<4xi1>; op.equal(x, False) is the logical not, or cast to an integer first{{$}}
  %0 = graph.neg %a : tensor<4xi1>
  func.return
}

// -----

func.func @pow_of_bools(%a: tensor<4xi1>) {
  // CHECK: graph.pow: bool ** bool is not supported (torch rejects it; numpy's result is int8, which Tessera has no dtype for), found tensor<4xi1> and tensor<4xi1>; cast to an integer first{{$}}
  %0 = graph.pow %a, %a : tensor<4xi1>
  func.return
}

// -----

// A sum of bools is a count: the tracer casts to i64 first.
func.func @sum_of_bools(%a: tensor<4xi1>) {
  // CHECK: graph.sum: a sum of bools is not supported, found tensor<4xi1>; cast to an integer first (op.sum counts bools in int64){{$}}
  %0 = graph.sum %a {axes = [0], keepdims = false} : tensor<4xi1> -> tensor<i1>
  func.return
}

// -----

// So is a product of bools (op.prod multiplies them in i64).
func.func @prod_of_bools(%a: tensor<4xi1>) {
  // CHECK: graph.prod: a product of bools is not supported, found tensor<4xi1>; cast to an integer first (op.prod multiplies bools in int64){{$}}
  %0 = graph.prod %a {axes = [0], keepdims = false} : tensor<4xi1> -> tensor<i1>
  func.return
}

// -----

// --- matmul --------------------------------------------------------------------------

// matmul needs matrices; the tracer reshapes vectors first.
func.func @matmul_of_vector(%a: tensor<8xf32>, %b: tensor<8x4xf32>) {
  // CHECK: graph.matmul: expected operands of rank >= 2, found tensor<8xf32> and tensor<8x4xf32>{{$}}
  %0 = graph.matmul %a, %b : tensor<8xf32>, tensor<8x4xf32> -> tensor<4xf32>
  func.return
}

// -----

// The contracted dimensions differ.
func.func @matmul_contraction_mismatch(%a: tensor<4x8xf32>, %b: tensor<6x5xf32>) {
  // CHECK: graph.matmul: contraction dimension mismatch: lhs tensor<4x8xf32> has k = 8, rhs tensor<6x5xf32> has k = 6{{$}}
  %0 = graph.matmul %a, %b : tensor<4x8xf32>, tensor<6x5xf32> -> tensor<4x5xf32>
  func.return
}

// -----

// Batch dimensions broadcast like elementwise shapes, and here they cannot.
func.func @matmul_batch_mismatch(%a: tensor<2x4x8xf32>, %b: tensor<3x8x5xf32>) {
  // CHECK: graph.matmul: shapes [2] and [3] do not broadcast: dimension 0 (aligned right) has sizes [2, 3]{{$}}
  %0 = graph.matmul %a, %b : tensor<2x4x8xf32>, tensor<3x8x5xf32> -> tensor<2x4x5xf32>
  func.return
}

// -----

// A matmul of bf16 by f32 needs an explicit cast.
func.func @matmul_mixed_dtypes(%a: tensor<4x8xbf16>, %b: tensor<8x5xf32>) {
  // CHECK: graph.matmul: expected operands of one element type, found tensor<4x8xbf16>, tensor<8x5xf32>{{$}}
  %0 = graph.matmul %a, %b : tensor<4x8xbf16>, tensor<8x5xf32> -> tensor<4x5xf32>
  func.return
}

// -----

// --- compare, select, cast ---------------------------------------------------------------

// compare's predicate is one of six names.
func.func @compare_unknown_predicate(%a: tensor<4xf32>) {
  // CHECK: graph.compare: predicate must be one of ('eq', 'ne', 'lt', 'le', 'gt', 'ge'), found 'lte'{{$}}
  %0 = graph.compare %a, %a {predicate = lte} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  func.return
}

// -----

// compare yields i1, not its operands' dtype.
func.func @compare_result_not_i1(%a: tensor<4xf32>) {
  // CHECK: graph.compare: result 0 type mismatch: expected tensor<4xi1>, found tensor<4xf32>{{$}}
  %0 = graph.compare %a, %a {predicate = lt} : tensor<4xf32>
  func.return
}

// -----

// select's condition must be i1 (the tracer compares with 0 first).
func.func @select_integer_condition(%c: tensor<4xi32>, %a: tensor<4xf32>) {
  // CHECK: graph.select: expected an i1 condition, found tensor<4xi32>{{$}}
  %0 = graph.select %c, %a, %a : tensor<4xi32>, tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  func.return
}

// -----

// select's two values share one dtype.
func.func @select_mixed_values(%c: tensor<4xi1>, %a: tensor<4xf32>, %b: tensor<4xi32>) {
  // CHECK: graph.select: expected operands of one element type, found tensor<4xf32>, tensor<4xi32>{{$}}
  %0 = graph.select %c, %a, %b : tensor<4xi1>, tensor<4xf32>, tensor<4xi32> -> tensor<4xf32>
  func.return
}

// -----

// select broadcasts all three operands together.
func.func @select_no_broadcast(%c: tensor<4xi1>, %a: tensor<4xf32>, %b: tensor<5xf32>) {
  // CHECK: graph.select: shapes [4] and [4] and [5] do not broadcast: dimension 0 (aligned right) has sizes [4, 5]{{$}}
  %0 = graph.select %c, %a, %b : tensor<4xi1>, tensor<4xf32>, tensor<5xf32> -> tensor<4xf32>
  func.return
}

// -----

// cast changes the dtype only, never the shape.
func.func @cast_changes_shape(%x: tensor<4xf32>) {
  // CHECK: graph.cast: result 0 type mismatch: expected tensor<4xf16>, found tensor<5xf16>{{$}}
  %0 = graph.cast %x : tensor<4xf32> -> tensor<5xf16>
  func.return
}

// -----

// --- constant ------------------------------------------------------------------------------

// A constant's result type is its value's type (only the generic form can differ).
func.func @constant_wrong_type() {
  // CHECK: graph.constant: result 0 type mismatch: expected tensor<2xf32>, found tensor<3xf32>{{$}}
  %0 = "graph.constant"() <{value = dense<1.0> : tensor<2xf32>}> : () -> tensor<3xf32>
  func.return
}

// -----

// A constant's value is a dense elements attribute, not a scalar.
func.func @constant_scalar_value() {
  // CHECK: 1.000000e+00 : f32 should be of base attribute dense{{$}}
  %0 = "graph.constant"() <{value = 1.0 : f32}> : () -> tensor<f32>
  func.return
}

// -----

// --- reductions and normalisations ------------------------------------------------------

// Reduced axes must be dimensions of the operand (axes are stored normalised: >= 0).
func.func @sum_axis_out_of_range(%x: tensor<4x8xf32>) {
  // CHECK: graph.sum: axes must be in [0, 2) for operand tensor<4x8xf32>, found [2]{{$}}
  %0 = graph.sum %x {axes = [2], keepdims = false} : tensor<4x8xf32> -> tensor<4x8xf32>
  func.return
}

// -----

// A negative axis is not normalised in the IR.
func.func @max_negative_axis(%x: tensor<4x8xf32>) {
  // CHECK: graph.max: axes must be in [0, 2) for operand tensor<4x8xf32>, found [-1]{{$}}
  %0 = graph.max %x {axes = [-1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  func.return
}

// -----

// An axis is reduced at most once.
func.func @min_repeated_axis(%x: tensor<4x8xf32>) {
  // CHECK: graph.min: axes must be distinct, found [1, 1]{{$}}
  %0 = graph.min %x {axes = [1, 1], keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  func.return
}

// -----

// mean needs a floating-point operand (the tracer casts integers first).
func.func @mean_of_integers(%x: tensor<4xi32>) {
  // CHECK: graph.mean: expected a floating-point operand, found tensor<4xi32>{{$}}
  %0 = graph.mean %x {axes = [0], keepdims = false} : tensor<4xi32> -> tensor<i32>
  func.return
}

// -----

// keepdims = true keeps reduced dimensions as size 1.
func.func @sum_keepdims_drops_dim(%x: tensor<4x8xf32>) {
  // CHECK: graph.sum: result 0 type mismatch: expected tensor<4x1xf32>, found tensor<4xf32>{{$}}
  %0 = graph.sum %x {axes = [1], keepdims = true} : tensor<4x8xf32> -> tensor<4xf32>
  func.return
}

// -----

// softmax's axis must be a dimension of the operand.
func.func @softmax_axis_out_of_range(%x: tensor<4x8xf32>) {
  // CHECK: graph.softmax: axis must be in [0, 2) for operand tensor<4x8xf32>, found [2]{{$}}
  %0 = graph.softmax %x {axis = 2} : tensor<4x8xf32>
  func.return
}

// -----

// log_softmax needs a floating-point operand.
func.func @log_softmax_of_integers(%x: tensor<4x8xi64>) {
  // CHECK: graph.log_softmax: expected a floating-point operand, found tensor<4x8xi64>{{$}}
  %0 = graph.log_softmax %x {axis = 1} : tensor<4x8xi64>
  func.return
}

// -----

// A normalisation over no axes is meaningless.
func.func @layer_norm_no_axes(%x: tensor<4x8xf32>) {
  // CHECK: graph.layer_norm: expected at least one axis to normalize over, found none{{$}}
  %0 = graph.layer_norm %x {axes = [], eps = 1.0e-05} : tensor<4x8xf32>
  func.return
}

// -----

// eps is added under a square root: it cannot be negative.
func.func @rms_norm_negative_eps(%x: tensor<4x8xf32>) {
  // CHECK: graph.rms_norm: expected eps >= 0, found -1.0{{$}}
  %0 = graph.rms_norm %x {axes = [1], eps = -1.0} : tensor<4x8xf32>
  func.return
}

// -----

// Normalised axes must be dimensions of the operand.
func.func @rms_norm_axis_out_of_range(%x: tensor<4x8xf16>) {
  // CHECK: graph.rms_norm: axes must be in [0, 2) for operand tensor<4x8xf16>, found [1, 3]{{$}}
  %0 = graph.rms_norm %x {axes = [1, 3], eps = 1.0e-06} : tensor<4x8xf16>
  func.return
}

// -----

// --- cross_entropy ---------------------------------------------------------------------------

// Logits are floating point.
func.func @cross_entropy_integer_logits(%logits: tensor<4x10xi32>, %labels: tensor<4xi32>) {
  // CHECK: graph.cross_entropy: expected a floating-point logits tensor, found tensor<4x10xi32>{{$}}
  %0 = graph.cross_entropy %logits, %labels {reduction = mean} : tensor<4x10xi32>, tensor<4xi32> -> tensor<i32>
  func.return
}

// -----

// Labels are class indices: integers.
func.func @cross_entropy_float_labels(%logits: tensor<4x10xf32>, %labels: tensor<4xf32>) {
  // CHECK: graph.cross_entropy: expected integer labels, found tensor<4xf32>{{$}}
  %0 = graph.cross_entropy %logits, %labels {reduction = mean} : tensor<4x10xf32>, tensor<4xf32> -> tensor<f32>
  func.return
}

// -----

// Logits have a class dimension (the last).
func.func @cross_entropy_0d_logits(%logits: tensor<f32>, %labels: tensor<i32>) {
  // CHECK: graph.cross_entropy: expected logits of rank >= 1 (classes last), found tensor<f32>{{$}}
  %0 = graph.cross_entropy %logits, %labels {reduction = mean} : tensor<f32>, tensor<i32> -> tensor<f32>
  func.return
}

// -----

// Labels have the logits' shape without the class dimension.
func.func @cross_entropy_label_shape(%logits: tensor<4x10xf32>, %labels: tensor<5xi64>) {
  // CHECK: graph.cross_entropy: expected labels of shape [4] for logits tensor<4x10xf32>, found tensor<5xi64>{{$}}
  %0 = graph.cross_entropy %logits, %labels {reduction = mean} : tensor<4x10xf32>, tensor<5xi64> -> tensor<f32>
  func.return
}

// -----

// The reduction is none, mean or sum.
func.func @cross_entropy_unknown_reduction(%logits: tensor<4x10xf32>, %labels: tensor<4xi32>) {
  // CHECK: graph.cross_entropy: reduction must be one of ('mean', 'sum', 'none'), found 'avg'{{$}}
  %0 = graph.cross_entropy %logits, %labels {reduction = avg} : tensor<4x10xf32>, tensor<4xi32> -> tensor<f32>
  func.return
}

// -----

// reduction = none gives one loss per label, not a 0-d loss.
func.func @cross_entropy_none_is_per_label(%logits: tensor<4x10xf32>, %labels: tensor<4xi32>) {
  // CHECK: graph.cross_entropy: result 0 type mismatch: expected tensor<4xf32>, found tensor<f32>{{$}}
  %0 = graph.cross_entropy %logits, %labels {reduction = none} : tensor<4x10xf32>, tensor<4xi32> -> tensor<f32>
  func.return
}

// -----

// --- layout ----------------------------------------------------------------------------------

// reshape keeps the number of elements.
func.func @reshape_element_count(%x: tensor<4x8xf32>) {
  // CHECK: graph.reshape: cannot reshape tensor<4x8xf32> (32 elements) to shape [5, 6] (30 elements){{$}}
  %0 = graph.reshape %x : tensor<4x8xf32> -> tensor<5x6xf32>
  func.return
}

// -----

// transpose's perm lists every dimension once.
func.func @transpose_not_a_permutation(%x: tensor<4x8xf32>) {
  // CHECK: graph.transpose: expected a permutation of [0, 1] for tensor<4x8xf32>, found [0, 0]{{$}}
  %0 = graph.transpose %x {perm = [0, 0]} : tensor<4x8xf32>
  func.return
}

// -----

// transpose's perm has one entry per dimension.
func.func @transpose_perm_length(%x: tensor<4x8xf32>) {
  // CHECK: graph.transpose: expected a permutation of [0, 1] for tensor<4x8xf32>, found [1, 0, 2]{{$}}
  %0 = graph.transpose %x {perm = [1, 0, 2]} : tensor<4x8xf32> -> tensor<8x4xf32>
  func.return
}

// -----

// broadcast_to never removes dimensions.
func.func @broadcast_to_fewer_dims(%x: tensor<4x8xf32>) {
  // CHECK: graph.broadcast_to: cannot broadcast tensor<4x8xf32> to shape [8]{{$}}
  %0 = graph.broadcast_to %x : tensor<4x8xf32> -> tensor<8xf32>
  func.return
}

// -----

// broadcast_to never shrinks a dimension to 1.
func.func @broadcast_to_shrinks(%x: tensor<4x8xf32>) {
  // CHECK: graph.broadcast_to: cannot broadcast tensor<4x8xf32> to shape [4, 1]{{$}}
  %0 = graph.broadcast_to %x : tensor<4x8xf32> -> tensor<4x1xf32>
  func.return
}

// -----

// broadcast_to only stretches dimensions of size 1.
func.func @broadcast_to_incompatible(%x: tensor<4x3xf32>) {
  // CHECK: graph.broadcast_to: shapes [4, 3] and [4, 5] do not broadcast: dimension 1 (aligned right) has sizes [3, 5]{{$}}
  %0 = graph.broadcast_to %x : tensor<4x3xf32> -> tensor<4x5xf32>
  func.return
}

// -----

// slice has one start, limit and stride per dimension.
func.func @slice_wrong_count(%x: tensor<4x8xf32>) {
  // CHECK: graph.slice: expected 2 starts, limits and strides for tensor<4x8xf32>, found 2, 2 and 1{{$}}
  %0 = graph.slice %x {starts = [0, 0], limits = [4, 8], strides = [1]} : tensor<4x8xf32>
  func.return
}

// -----

// A slice's limit is within the dimension.
func.func @slice_limit_out_of_range(%x: tensor<4x8xf32>) {
  // CHECK: graph.slice: dimension 1 of tensor<4x8xf32>: expected 0 <= start <= limit <= 8 and stride >= 1, found start 0, limit 9, stride 1{{$}}
  %0 = graph.slice %x {starts = [0, 0], limits = [4, 9], strides = [1, 1]} : tensor<4x8xf32> -> tensor<4x9xf32>
  func.return
}

// -----

// A slice's start is not past its limit (no negative steps).
func.func @slice_start_after_limit(%x: tensor<4x8xf32>) {
  // CHECK: graph.slice: dimension 0 of tensor<4x8xf32>: expected 0 <= start <= limit <= 4 and stride >= 1, found start 3, limit 1, stride 1{{$}}
  %0 = graph.slice %x {starts = [3, 0], limits = [1, 8], strides = [1, 1]} : tensor<4x8xf32> -> tensor<0x8xf32>
  func.return
}

// -----

// A slice's stride is positive.
func.func @slice_zero_stride(%x: tensor<4x8xf32>) {
  // CHECK: graph.slice: dimension 1 of tensor<4x8xf32>: expected 0 <= start <= limit <= 8 and stride >= 1, found start 0, limit 8, stride 0{{$}}
  %0 = graph.slice %x {starts = [0, 0], limits = [4, 8], strides = [1, 0]} : tensor<4x8xf32>
  func.return
}

// -----

// Strided slice sizes round up: ceil((8 - 1) / 2) = 4, not 3.
func.func @slice_strided_size(%x: tensor<4x8xf32>) {
  // CHECK: graph.slice: result 0 type mismatch: expected tensor<4x4xf32>, found tensor<4x3xf32>{{$}}
  %0 = graph.slice %x {starts = [0, 1], limits = [4, 8], strides = [1, 2]} : tensor<4x8xf32> -> tensor<4x3xf32>
  func.return
}

// -----

// concat needs at least one operand.
func.func @concat_nothing() {
  // CHECK: graph.concat: expected at least one operand to concatenate, found none{{$}}
  %0 = graph.concat {axis = 0} : -> tensor<4xf32>
  func.return
}

// -----

// Concatenated operands agree on every dimension but the axis.
func.func @concat_other_dim_differs(%a: tensor<2x8xf32>, %b: tensor<3x4xf32>) {
  // CHECK: graph.concat: expected operands that agree on every dimension but 0, found tensor<2x8xf32> and tensor<3x4xf32>{{$}}
  %0 = graph.concat %a, %b {axis = 0} : tensor<2x8xf32>, tensor<3x4xf32> -> tensor<5x8xf32>
  func.return
}

// -----

// Concatenated operands have one rank.
func.func @concat_rank_differs(%a: tensor<2x8xf32>, %b: tensor<8xf32>) {
  // CHECK: graph.concat: expected operands that agree on every dimension but 0, found tensor<2x8xf32> and tensor<8xf32>{{$}}
  %0 = graph.concat %a, %b {axis = 0} : tensor<2x8xf32>, tensor<8xf32> -> tensor<3x8xf32>
  func.return
}

// -----

// Concatenated operands have one dtype.
func.func @concat_mixed_dtypes(%a: tensor<2xi32>, %b: tensor<2xi64>, %c: tensor<2xi32>) {
  // CHECK: graph.concat: expected operands of one element type, found tensor<2xi32>, tensor<2xi64>, tensor<2xi32>{{$}}
  %0 = graph.concat %a, %b, %c {axis = 0} : tensor<2xi32>, tensor<2xi64>, tensor<2xi32> -> tensor<6xi32>
  func.return
}

// -----

// concat's axis is a dimension of the operands.
func.func @concat_axis_out_of_range(%a: tensor<2x8xf32>) {
  // CHECK: graph.concat: axis must be in [0, 2) for operand tensor<2x8xf32>, found [2]{{$}}
  %0 = graph.concat %a, %a {axis = 2} : tensor<2x8xf32>, tensor<2x8xf32> -> tensor<2x8x2xf32>
  func.return
}

// -----

// split's pieces add up to the split dimension.
func.func @split_sizes_do_not_sum(%x: tensor<4x8xf32>) {
  // CHECK: graph.split: split sizes [2, 2] must be non-negative and sum to dimension 1 of tensor<4x8xf32> (8){{$}}
  %0:2 = graph.split %x {axis = 1} : tensor<4x8xf32> -> (tensor<4x2xf32>, tensor<4x2xf32>)
  func.return
}

// -----

// split's pieces have the operand's rank.
func.func @split_result_rank(%x: tensor<4x8xf32>) {
  // CHECK: graph.split: expected results of rank 2 like the operand, found result 1 of type tensor<4xf32>{{$}}
  %0:2 = graph.split %x {axis = 1} : tensor<4x8xf32> -> (tensor<4x4xf32>, tensor<4xf32>)
  func.return
}

// -----

// split's pieces agree with the operand on every other dimension.
func.func @split_other_dim_differs(%x: tensor<4x8xf32>) {
  // CHECK: graph.split: result 1 type mismatch: expected tensor<4x4xf32>, found tensor<5x4xf32>{{$}}
  %0:2 = graph.split %x {axis = 1} : tensor<4x8xf32> -> (tensor<4x4xf32>, tensor<5x4xf32>)
  func.return
}

// -----

// split's axis is a dimension of the operand.
func.func @split_axis_out_of_range(%x: tensor<4x8xf32>) {
  // CHECK: graph.split: axis must be in [0, 2) for operand tensor<4x8xf32>, found [2]{{$}}
  %0:2 = graph.split %x {axis = 2} : tensor<4x8xf32> -> (tensor<4x4xf32>, tensor<4x4xf32>)
  func.return
}

// -----

// gather's indices are integers (i1 is not an index type).
func.func @gather_bool_indices(%table: tensor<10x4xf32>, %ids: tensor<3xi1>) {
  // CHECK: graph.gather: expected integer indices, found tensor<3xi1>{{$}}
  %0 = graph.gather %table, %ids {axis = 0} : tensor<10x4xf32>, tensor<3xi1> -> tensor<3x4xf32>
  func.return
}

// -----

// gather's axis is a dimension of the operand.
func.func @gather_axis_out_of_range(%table: tensor<10x4xf32>, %ids: tensor<3xi64>) {
  // CHECK: graph.gather: axis must be in [0, 2) for operand tensor<10x4xf32>, found [2]{{$}}
  %0 = graph.gather %table, %ids {axis = 2} : tensor<10x4xf32>, tensor<3xi64> -> tensor<10x4x3xf32>
  func.return
}

// -----

// --- types every graph op rejects ------------------------------------------------------------

// Shapes are static.
func.func @dynamic_operand(%x: tensor<?x8xf32>) {
  // CHECK: graph.neg: expected a static shape, found tensor<?x8xf32>{{$}}
  %0 = graph.neg %x : tensor<?x8xf32>
  func.return
}

// -----

// A target shape given by the result type is static too.
func.func @dynamic_result(%x: tensor<4x8xf32>) {
  // CHECK: graph.reshape: expected a static shape, found tensor<?xf32>{{$}}
  %0 = graph.reshape %x : tensor<4x8xf32> -> tensor<?xf32>
  func.return
}

// -----

// Element types are Tessera's seven dtypes.
func.func @i8_operand(%x: tensor<4xi8>) {
  // CHECK: graph.abs: unsupported element type i8; expected one of [f64, f32, f16, bf16, i32, i64, i1]{{$}}
  %0 = graph.abs %x : tensor<4xi8>
  func.return
}

// -----

// --- IRDL constraints ------------------------------------------------------------------------

// Operands are ranked tensors, not memrefs.
func.func @memref_operand(%x: memref<4xf32>) {
  // CHECK: operand 'input' at position 0 does not verify:
  // CHECK-NEXT: memref<4xf32> should be of base attribute tensor{{$}}
  %0 = graph.neg %x : memref<4xf32> -> tensor<4xf32>
  func.return
}

// -----

// Unranked tensors are not graph values.
func.func @unranked_operand(%x: tensor<*xf32>) {
  // CHECK: operand 'lhs' at position 0 does not verify:
  // CHECK-NEXT: tensor<*xf32> should be of base attribute tensor{{$}}
  %0 = graph.add %x, %x : tensor<*xf32>, tensor<*xf32> -> tensor<4xf32>
  func.return
}

// -----

// Results are tensors.
func.func @memref_result(%x: tensor<4xf32>) {
  // CHECK: result 'result' at position 0 does not verify:
  // CHECK-NEXT: memref<4xf32> should be of base attribute tensor{{$}}
  %0 = graph.exp %x : tensor<4xf32> -> memref<4xf32>
  func.return
}

// -----

// Properties are required.
func.func @missing_property(%x: tensor<4xf32>) {
  // CHECK: property 'approximate' expected in operation 'graph.gelu'{{$}}
  %0 = graph.gelu %x : tensor<4xf32>
  func.return
}

// -----

// Only declared properties are allowed.
func.func @unknown_property(%x: tensor<4xf32>) {
  // CHECK: property 'foo' is not defined by the operation 'graph.neg'.
  %0 = graph.neg %x {foo = 1} : tensor<4xf32>
  func.return
}

// -----

// An integer property is not a list.
func.func @axis_is_a_list(%x: tensor<4x8xf32>) {
  // CHECK: array<i64: 1> should be of base attribute integer{{$}}
  %0 = graph.softmax %x {axis = [1]} : tensor<4x8xf32>
  func.return
}

// -----

// A list property is not an integer.
func.func @axes_is_an_integer(%x: tensor<4x8xf32>) {
  // CHECK: 1 : i64 should be of base attribute array{{$}}
  %0 = graph.sum %x {axes = 1, keepdims = false} : tensor<4x8xf32> -> tensor<4xf32>
  func.return
}

// -----

// keepdims is a boolean, not an integer.
func.func @keepdims_is_an_integer(%x: tensor<4x8xf32>) {
  // CHECK: Expected attribute i1 but got i64{{$}}
  %0 = graph.sum %x {axes = [1], keepdims = 1} : tensor<4x8xf32> -> tensor<4xf32>
  func.return
}

// -----

// eps is a float, not an integer.
func.func @eps_is_an_integer(%x: tensor<4x8xf32>) {
  // CHECK: 1 : i64 should be of base attribute float{{$}}
  %0 = graph.layer_norm %x {axes = [1], eps = 1} : tensor<4x8xf32>
  func.return
}

// -----

// A string property is not a number.
func.func @predicate_is_a_number(%x: tensor<4xf32>) {
  // CHECK: 3 : i64 should be of base attribute string{{$}}
  %0 = graph.compare %x, %x {predicate = 3} : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  func.return
}

// -----

// A unary op has one operand (only the generic form can say otherwise).
func.func @too_many_operands(%x: tensor<4xf32>) {
  // CHECK: Expected 1 operand, but got 2{{$}}
  %0 = "graph.neg"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  func.return
}

// -----

// A single-result op has one result.
func.func @too_many_results(%x: tensor<4xf32>) {
  // CHECK: Expected 1 result, but got 2{{$}}
  %0:2 = "graph.add"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  func.return
}

// -----

// --- attention -----------------------------------------------------------------------

// q and k share the head dim D.
func.func @attention_head_dims_differ(%q: tensor<2x16x8xf32>, %k: tensor<2x16x4xf32>) {
  // CHECK: graph.attention: q and k must have one head dim (D), found tensor<2x16x8xf32> and tensor<2x16x4xf32>{{$}}
  %o, %l = graph.attention %q, %k, %k {causal = false, scale = 1.0} : tensor<2x16x8xf32>, tensor<2x16x4xf32>, tensor<2x16x4xf32> -> (tensor<2x16x4xf32>, tensor<2x16xf32>)
  func.return
}

// -----

// Query heads are a multiple of the key and value heads.
func.func @attention_heads_not_grouped(%q: tensor<3x16x8xf32>, %k: tensor<2x16x8xf32>) {
  // CHECK: graph.attention: the query heads (dim 0: 3) must be a multiple of the key and value heads (2), found q tensor<3x16x8xf32> and k tensor<2x16x8xf32>{{$}}
  %o, %l = graph.attention %q, %k, %k {causal = false, scale = 1.0} : tensor<3x16x8xf32>, tensor<2x16x8xf32>, tensor<2x16x8xf32> -> (tensor<3x16x8xf32>, tensor<3x16xf32>)
  func.return
}

// -----

// k and v have one sequence length.
func.func @attention_kv_lengths_differ(%q: tensor<16x8xf32>, %k: tensor<16x8xf32>, %v: tensor<12x8xf32>) {
  // CHECK: graph.attention: k and v must agree on every dim but the last (batch dims and Tk), found tensor<16x8xf32> and tensor<12x8xf32>{{$}}
  %o, %l = graph.attention %q, %k, %v {causal = false, scale = 1.0} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<12x8xf32> -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return
}

// -----

// Attention computes in floating point.
func.func @attention_of_integers(%q: tensor<16x8xi32>) {
  // CHECK: graph.attention: expected floating-point q, k and v, found tensor<16x8xi32>, tensor<16x8xi32> and tensor<16x8xi32>{{$}}
  %o, %l = graph.attention %q, %q, %q {causal = false, scale = 1.0} : tensor<16x8xi32>, tensor<16x8xi32>, tensor<16x8xi32> -> (tensor<16x8xi32>, tensor<16xf32>)
  func.return
}

// -----

// The position offsets come in a pair.
func.func @attention_one_offset(%q: tensor<16x8xf32>, %q0: tensor<i32>) {
  // CHECK: graph.attention: expected no position offsets or two (the queries' and the keys'), found 1{{$}}
  %o, %l = graph.attention %q, %q, %q, %q0 {causal = true, scale = 1.0} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<i32> -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return
}

// -----

// A position offset is an i32 scalar.
func.func @attention_offset_not_i32(%q: tensor<16x8xf32>, %q0: tensor<i64>) {
  // CHECK: graph.attention: expected the query position offset to be an i32 scalar, found tensor<i64>{{$}}
  %o, %l = graph.attention %q, %q, %q, %q0, %q0 {causal = true, scale = 1.0} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<i64>, tensor<i64> -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return
}

// -----

// The log-sum-exp is f32 for f32 inputs.
func.func @attention_lse_type(%q: tensor<16x8xf32>) {
  // CHECK: graph.attention: result 1 type mismatch: expected tensor<16xf32>, found tensor<16xf16>{{$}}
  %o, %l = graph.attention %q, %q, %q {causal = false, scale = 1.0} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32> -> (tensor<16x8xf32>, tensor<16xf16>)
  func.return
}

// -----

// The backward's output cotangent has the output's type.
func.func @attention_backward_cotangent(%q: tensor<16x8xf32>, %do: tensor<16x4xf32>, %l: tensor<16xf32>) {
  // CHECK: graph.attention_backward: expected the output cotangent to be tensor<16x8xf32>, found tensor<16x4xf32>{{$}}
  %dq, %dk, %dv = graph.attention_backward %q, %q, %q, %do, %l, %l {causal = false, scale = 1.0} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x4xf32>, tensor<16xf32>, tensor<16xf32> -> (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>)
  func.return
}

// -----

// lse and delta have one value per query row.
func.func @attention_backward_statistics(%q: tensor<16x8xf32>, %l: tensor<16xf32>, %d: tensor<8xf32>) {
  // CHECK: graph.attention_backward: expected delta to be tensor<16xf32>, found tensor<8xf32>{{$}}
  %dq, %dk, %dv = graph.attention_backward %q, %q, %q, %q, %l, %d {causal = false, scale = 1.0} : tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<16xf32>, tensor<8xf32> -> (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>)
  func.return
}

// -----

// The scale is finite.
func.func @attention_scale_not_finite(%q: tensor<16x8xf32>) {
  // CHECK: graph.attention: expected a finite scale, found inf{{$}}
  %o, %l = "graph.attention"(%q, %q, %q) <{causal = false, scale = 0x7FF0000000000000 : f64}> : (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16xf32>)
  func.return
}
