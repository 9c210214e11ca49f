// RUN: tessera-opt %s | filecheck %s
// RUN: tessera-opt %s | tessera-opt | filecheck %s
// RUN: tessera-opt %s --print-op-generic | tessera-opt | filecheck %s
// RUN: tessera-opt %s -p choose-collective-algorithms | filecheck %s --check-prefix=NVL72
// RUN: tessera-opt %s -p 'choose-collective-algorithms{topology=dgx_h100x9}' | filecheck %s --check-prefix=DGX

// The mesh's machine round-trips on its symbol; choose-collective-algorithms prices the
// mesh's topology unless its topology option names another: a 256 KiB all-reduce over 72
// ranks runs NVLink SHARP in one NVL72 rack, hierarchically across 9 DGX H100 nodes.
// CHECK: graph.mesh @mesh axes = [tp = 72] topology = "gb200_nvl72"
// NVL72: graph.mesh @mesh axes = [tp = 72] topology = "gb200_nvl72"
// NVL72: schedule.start all_reduce %x {axes = [tp], kind = sum, algorithm = nvls} :
// DGX:   schedule.start all_reduce %x {axes = [tp], kind = sum, algorithm = hierarchical, domain = 8} :
graph.mesh @mesh axes = [tp = 72] topology = "gb200_nvl72"
func.func @all_reduce(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %h = schedule.start all_reduce %x {axes = [tp], kind = sum} : tensor<256x256xf32> -> !schedule.handle<tensor<256x256xf32>>
  %r = schedule.wait %h : !schedule.handle<tensor<256x256xf32>> -> tensor<256x256xf32>
  func.return %r : tensor<256x256xf32>
}
