// RUN: tessera-opt %s -p shard-propagate,insert-collectives | filecheck %s --check-prefix=BYTES
// RUN: tessera-opt %s -p 'shard-propagate{topology=dgx_h100},insert-collectives{topology=dgx_h100}' | filecheck %s --check-prefix=NAMED

// The sharding clock's machine. A mesh naming no topology is priced without link
// latency: the sum of rows split over tp = 4 is partial and all-reduced (96 bytes
// received per rank, against 384 for gathering the rows). With the passes' topology
// option (what `schedule.options(topology=...)` gives them) the mesh is priced on a DGX
// H100 with its 3 us steps: a tree all-reduce takes 4 of them, the gather 3, so the rows
// are gathered and summed whole.
// BYTES-LABEL: func.func @sum_of_split_rows
// BYTES-NEXT:    %[[S:.*]] = graph.sum %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = sum[tp]>}
// BYTES-NEXT:    %[[R:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum}
// BYTES-NEXT:    func.return %[[R]]
// NAMED-LABEL: func.func @sum_of_split_rows
// NAMED-NEXT:    %[[G:.*]] = graph.all_gather %{{.*}} {axes = [tp], dim = 0}
// NAMED-NEXT:    %[[S:.*]] = graph.sum %[[G]] {{.*}}#graph.sharding<@mesh, {{\[\[}}]]>}
// NAMED-NEXT:    func.return %[[S]]
graph.mesh @mesh axes = [tp = 4]
func.func @sum_of_split_rows(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> (tensor<16xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) {
  %s = graph.sum %x {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  func.return %s : tensor<16xf32>
}

// A sum of two such sums (a tied weight's two gradient terms, each a contraction over
// the rows split over tp): alone, each would be gathered (3 steps each, 6 in all), but
// the add takes both terms partial, so they are reduced once after it (4 steps), as
// GSPMD reduces partial sums. With no latency the single all-reduce wins anyway.
// BYTES-LABEL: func.func @sum_of_two_split_sums
// BYTES-NEXT:    %[[A:.*]] = graph.sum %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = sum[tp]>}
// BYTES-NEXT:    %[[B:.*]] = graph.sum %{{.*}} attributes {graph.sharding = #graph.sharding<@mesh, {{\[\[}}]], partial = sum[tp]>}
// BYTES-NEXT:    %[[S:.*]] = graph.add %[[A]], %[[B]] {{.*}}partial = sum[tp]>}
// BYTES-NEXT:    %[[R:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum}
// BYTES-NEXT:    func.return %[[R]]
// NAMED-LABEL: func.func @sum_of_two_split_sums
// NAMED-NOT:     graph.all_gather
// NAMED:         %[[S:.*]] = graph.add %{{.*}}, %{{.*}} {{.*}}partial = sum[tp]>}
// NAMED-NEXT:    %[[R:.*]] = graph.all_reduce %[[S]] {axes = [tp], kind = sum}
// NAMED-NEXT:    func.return %[[R]]
func.func @sum_of_two_split_sums(%x: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}, %y: tensor<8x16xf32> {graph.sharding = #graph.sharding<@mesh, [[tp], []]>}) -> (tensor<16xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) {
  %a = graph.sum %x {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  %b = graph.sum %y {axes = [0], keepdims = false} : tensor<8x16xf32> -> tensor<16xf32>
  %s = graph.add %a, %b : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  func.return %s : tensor<16xf32>
}
