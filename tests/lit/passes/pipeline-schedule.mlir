// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=gpipe microbatches=2}' | filecheck %s --check-prefix=GPIPE
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=1f1b microbatches=4}' | filecheck %s --check-prefix=ONEF
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=interleaved microbatches=2 virtual=2}' | filecheck %s --check-prefix=INTER
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=zb-h1 microbatches=3}' | filecheck %s --check-prefix=ZB

// Round trips: the custom and the generic form parse back to the same schedule.
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=1f1b microbatches=4}' | tessera-opt --split-input-file | filecheck %s --check-prefix=ONEF
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=gpipe microbatches=2}' --print-op-generic | tessera-opt --split-input-file | filecheck %s --check-prefix=GPIPE

// Running the pass again (in one pipeline, or on its own output) replaces the schedule.
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=gpipe microbatches=2},pipeline-schedule{kind=zb-h1 microbatches=3}' | filecheck %s --check-prefix=ZB
// RUN: tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=zb-h1 microbatches=3}' | tessera-opt --split-input-file -p 'pipeline-schedule{kind=1f1b microbatches=4}' | filecheck %s --check-prefix=ONEF

// Bad options and inputs: one error line, no traceback.
// RUN: not tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=pipedream}' 2>&1 | filecheck %s --check-prefix=KIND
// RUN: not tessera-opt %s --split-input-file -p 'pipeline-schedule{microbatches=0}' 2>&1 | filecheck %s --check-prefix=MICRO
// RUN: not tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=interleaved virtual=3}' 2>&1 | filecheck %s --check-prefix=VIRTUAL
// RUN: not tessera-opt %s --split-input-file -p 'pipeline-schedule{kind=1f1b virtual=2}' 2>&1 | filecheck %s --check-prefix=GENERATOR
// RUN: echo 'func.func @mixed() { schedule.stage {index = 0, count = 2} { schedule.yield } schedule.stage {index = 1, count = 4} { schedule.yield } func.return }' | not tessera-opt -p pipeline-schedule 2>&1 | filecheck %s --check-prefix=MIXED

// KIND:           tessera-opt: error: invalid options for pass 'pipeline-schedule': unknown kind 'pipedream'; known: gpipe, 1f1b, interleaved, zb-h1
// KIND-NOT:       Traceback
// MICRO:          tessera-opt: error: invalid options for pass 'pipeline-schedule': microbatches must be >= 1, found 0
// MICRO-NOT:      Traceback
// VIRTUAL:        pipeline-schedule.mlir:{{[0-9]+}}:1: error: pipeline-schedule: @two_stages: the 2 stages do not divide into virtual = 3 stages per rank
// VIRTUAL-NOT:    Traceback
// GENERATOR:      pipeline-schedule.mlir:{{[0-9]+}}:1: error: pipeline-schedule: @two_stages: pipeline schedule '1f1b': virtual must be 1
// GENERATOR-NOT:  Traceback
// MIXED:          stdin:1:1: error: pipeline-schedule: @mixed: expected one stage count for all schedule.stage ops, found [2, 4]
// MIXED-NOT:      Traceback

// Two stages on two ranks. GPipe runs every forward, then every backward; the schedule
// goes just before the return, after the stages.
// GPIPE-LABEL: func.func @two_stages
// GPIPE:         %[[O:.*]] = schedule.stage {index = 1, count = 2} -> tensor<8xf32> {
// GPIPE-NEXT:      schedule.yield
// GPIPE-NEXT:    }
// GPIPE-NEXT:    schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 2, virtual = 1} {
// GPIPE-NEXT:      schedule.pipeline_rank {index = 0} {
// GPIPE-NEXT:        schedule.action forward {microbatch = 0, stage = 0}
// GPIPE-NEXT:        schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
// GPIPE-NEXT:        schedule.action forward {microbatch = 1, stage = 0}
// GPIPE-NEXT:        schedule.action send_activation {microbatch = 1, stage = 0, peer = 1}
// GPIPE-NEXT:        schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
// GPIPE-NEXT:        schedule.action backward {microbatch = 0, stage = 0}
// GPIPE-NEXT:        schedule.action recv_grad {microbatch = 1, stage = 0, peer = 1}
// GPIPE-NEXT:        schedule.action backward {microbatch = 1, stage = 0}
// GPIPE-NEXT:      }
// GPIPE-NEXT:      schedule.pipeline_rank {index = 1} {
// GPIPE-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
// GPIPE-NEXT:        schedule.action forward {microbatch = 0, stage = 1}
// GPIPE-NEXT:        schedule.action recv_activation {microbatch = 1, stage = 1, peer = 0}
// GPIPE-NEXT:        schedule.action forward {microbatch = 1, stage = 1}
// GPIPE-NEXT:        schedule.action backward {microbatch = 0, stage = 1}
// GPIPE-NEXT:        schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
// GPIPE-NEXT:        schedule.action backward {microbatch = 1, stage = 1}
// GPIPE-NEXT:        schedule.action send_grad {microbatch = 1, stage = 1, peer = 0}
// GPIPE-NEXT:      }
// GPIPE-NEXT:    }
// GPIPE-NEXT:    func.return %[[O]] : tensor<8xf32>

// zb-h1 splits each backward into backward_input (B), which sends the gradient on at
// once, and backward_weight (W), which fills the bubbles; no whole backward is left.
// ZB-LABEL:    func.func @two_stages
// ZB-NOT:        schedule.pipeline {kind = gpipe
// ZB:            schedule.pipeline {kind = "zb-h1", ranks = 2, microbatches = 3, virtual = 1} {
// ZB-NEXT:         schedule.pipeline_rank {index = 0} {
// ZB-NOT:            schedule.action backward {
// ZB:                schedule.action backward_input {microbatch = 0, stage = 0}
// ZB:                schedule.action backward_weight {microbatch = 0, stage = 0}
// ZB:              schedule.pipeline_rank {index = 1} {
// ZB-NEXT:           schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
// ZB-NEXT:           schedule.action forward {microbatch = 0, stage = 1}
// ZB-NEXT:           schedule.action backward_input {microbatch = 0, stage = 1}
// ZB-NEXT:           schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
// ZB-NOT:            schedule.action backward {
// ZB:                schedule.action backward_weight {microbatch = 0, stage = 1}
// ZB-NOT:            schedule.pipeline {
// ZB:            func.return

// 1F1B with 4 microbatches puts the schedule here too (unchecked).
// ONEF-LABEL: func.func @two_stages
// ONEF:         schedule.pipeline {kind = "1f1b", ranks = 2, microbatches = 4, virtual = 1}
// ONEF-NOT:     schedule.pipeline {
// ONEF:         func.return

// Interleaved with virtual = 2: one rank runs both stages, one microbatch at a time
// (microbatches go in groups of ranks = 1 per chunk); the transfers between its stages
// stay in the list.
// INTER-LABEL: func.func @two_stages
// INTER:         schedule.pipeline {kind = interleaved, ranks = 1, microbatches = 2, virtual = 2} {
// INTER-NEXT:      schedule.pipeline_rank {index = 0} {
// INTER-NEXT:        schedule.action forward {microbatch = 0, stage = 0}
// INTER-NEXT:        schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
// INTER-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
// INTER-NEXT:        schedule.action forward {microbatch = 0, stage = 1}
// INTER-NEXT:        schedule.action backward {microbatch = 0, stage = 1}
// INTER-NEXT:        schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
func.func @two_stages(%x: tensor<8xf32>) -> tensor<8xf32> {
  schedule.stage {index = 0, count = 2} {
    schedule.yield
  }
  %o = schedule.stage {index = 1, count = 2} -> tensor<8xf32> {
    schedule.yield %x : tensor<8xf32>
  }
  func.return %o : tensor<8xf32>
}

// -----

// Four stages. 1F1B on four ranks with four microbatches: rank 0 runs three warm-up
// forwards, then one forward and one backward, then the remaining backwards; the last
// rank alternates from the start.
// ONEF-LABEL: func.func @four_stages
// ONEF:         schedule.pipeline {kind = "1f1b", ranks = 4, microbatches = 4, virtual = 1} {
// ONEF-NEXT:      schedule.pipeline_rank {index = 0} {
// ONEF-NEXT:        schedule.action forward {microbatch = 0, stage = 0}
// ONEF-NEXT:        schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action forward {microbatch = 1, stage = 0}
// ONEF-NEXT:        schedule.action send_activation {microbatch = 1, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action forward {microbatch = 2, stage = 0}
// ONEF-NEXT:        schedule.action send_activation {microbatch = 2, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action forward {microbatch = 3, stage = 0}
// ONEF-NEXT:        schedule.action send_activation {microbatch = 3, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action backward {microbatch = 0, stage = 0}
// ONEF-NEXT:        schedule.action recv_grad {microbatch = 1, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action backward {microbatch = 1, stage = 0}
// ONEF-NEXT:        schedule.action recv_grad {microbatch = 2, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action backward {microbatch = 2, stage = 0}
// ONEF-NEXT:        schedule.action recv_grad {microbatch = 3, stage = 0, peer = 1}
// ONEF-NEXT:        schedule.action backward {microbatch = 3, stage = 0}
// ONEF-NEXT:      }
// ONEF-NEXT:      schedule.pipeline_rank {index = 1} {
// ONEF:           schedule.pipeline_rank {index = 2} {
// ONEF:           schedule.pipeline_rank {index = 3} {
// ONEF-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action forward {microbatch = 0, stage = 3}
// ONEF-NEXT:        schedule.action backward {microbatch = 0, stage = 3}
// ONEF-NEXT:        schedule.action send_grad {microbatch = 0, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action recv_activation {microbatch = 1, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action forward {microbatch = 1, stage = 3}
// ONEF-NEXT:        schedule.action backward {microbatch = 1, stage = 3}
// ONEF-NEXT:        schedule.action send_grad {microbatch = 1, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action recv_activation {microbatch = 2, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action forward {microbatch = 2, stage = 3}
// ONEF-NEXT:        schedule.action backward {microbatch = 2, stage = 3}
// ONEF-NEXT:        schedule.action send_grad {microbatch = 2, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action recv_activation {microbatch = 3, stage = 3, peer = 2}
// ONEF-NEXT:        schedule.action forward {microbatch = 3, stage = 3}
// ONEF-NEXT:        schedule.action backward {microbatch = 3, stage = 3}
// ONEF-NEXT:        schedule.action send_grad {microbatch = 3, stage = 3, peer = 2}
// ONEF-NEXT:      }
// ONEF-NEXT:    }
// ONEF-NEXT:    func.return

// Interleaved: four stages, two per rank (stage s on rank s % 2). Rank 0 runs stage 0,
// then its second chunk, stage 2, for both microbatches before any backward; backwards
// go in reverse chunk order.
// INTER-LABEL: func.func @four_stages
// INTER:         schedule.pipeline {kind = interleaved, ranks = 2, microbatches = 2, virtual = 2} {
// INTER-NEXT:      schedule.pipeline_rank {index = 0} {
// INTER-NEXT:        schedule.action forward {microbatch = 0, stage = 0}
// INTER-NEXT:        schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
// INTER-NEXT:        schedule.action forward {microbatch = 1, stage = 0}
// INTER-NEXT:        schedule.action send_activation {microbatch = 1, stage = 0, peer = 1}
// INTER-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 2, peer = 1}
// INTER-NEXT:        schedule.action forward {microbatch = 0, stage = 2}
// INTER-NEXT:        schedule.action send_activation {microbatch = 0, stage = 2, peer = 3}
// INTER-NEXT:        schedule.action recv_activation {microbatch = 1, stage = 2, peer = 1}
// INTER-NEXT:        schedule.action forward {microbatch = 1, stage = 2}
// INTER-NEXT:        schedule.action send_activation {microbatch = 1, stage = 2, peer = 3}
// INTER-NEXT:        schedule.action recv_grad {microbatch = 0, stage = 2, peer = 3}
// INTER-NEXT:        schedule.action backward {microbatch = 0, stage = 2}
// INTER-NEXT:        schedule.action send_grad {microbatch = 0, stage = 2, peer = 1}
// INTER-NEXT:        schedule.action recv_grad {microbatch = 1, stage = 2, peer = 3}
// INTER-NEXT:        schedule.action backward {microbatch = 1, stage = 2}
// INTER-NEXT:        schedule.action send_grad {microbatch = 1, stage = 2, peer = 1}
// INTER-NEXT:        schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
// INTER-NEXT:        schedule.action backward {microbatch = 0, stage = 0}
// INTER-NEXT:        schedule.action recv_grad {microbatch = 1, stage = 0, peer = 1}
// INTER-NEXT:        schedule.action backward {microbatch = 1, stage = 0}
// INTER-NEXT:      }
// INTER-NEXT:      schedule.pipeline_rank {index = 1} {
// INTER-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
// INTER-NEXT:        schedule.action forward {microbatch = 0, stage = 1}
// INTER-NEXT:        schedule.action send_activation {microbatch = 0, stage = 1, peer = 2}
// INTER-NEXT:        schedule.action recv_activation {microbatch = 1, stage = 1, peer = 0}
// INTER-NEXT:        schedule.action forward {microbatch = 1, stage = 1}
// INTER-NEXT:        schedule.action send_activation {microbatch = 1, stage = 1, peer = 2}
// INTER-NEXT:        schedule.action recv_activation {microbatch = 0, stage = 3, peer = 2}
// INTER-NEXT:        schedule.action forward {microbatch = 0, stage = 3}
// INTER-NEXT:        schedule.action backward {microbatch = 0, stage = 3}
// INTER-NEXT:        schedule.action send_grad {microbatch = 0, stage = 3, peer = 2}
// INTER-NEXT:        schedule.action recv_activation {microbatch = 1, stage = 3, peer = 2}
// INTER-NEXT:        schedule.action forward {microbatch = 1, stage = 3}
// INTER-NEXT:        schedule.action backward {microbatch = 1, stage = 3}
// INTER-NEXT:        schedule.action send_grad {microbatch = 1, stage = 3, peer = 2}
// INTER-NEXT:        schedule.action recv_grad {microbatch = 0, stage = 1, peer = 2}
// INTER-NEXT:        schedule.action backward {microbatch = 0, stage = 1}
// INTER-NEXT:        schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
// INTER-NEXT:        schedule.action recv_grad {microbatch = 1, stage = 1, peer = 2}
// INTER-NEXT:        schedule.action backward {microbatch = 1, stage = 1}
// INTER-NEXT:        schedule.action send_grad {microbatch = 1, stage = 1, peer = 0}
// INTER-NEXT:      }
// INTER-NEXT:    }
// INTER-NEXT:    func.return

// GPipe on four ranks and zb-h1 here are not checked in detail.
// GPIPE-LABEL: func.func @four_stages
// GPIPE:         schedule.pipeline {kind = gpipe, ranks = 4, microbatches = 2, virtual = 1}
// ZB-LABEL:    func.func @four_stages
// ZB:            schedule.pipeline {kind = "zb-h1", ranks = 4, microbatches = 3, virtual = 1}
func.func @four_stages() {
  schedule.stage {index = 0, count = 4} {
    schedule.yield
  }
  schedule.stage {index = 1, count = 4} {
    schedule.yield
  }
  schedule.stage {index = 2, count = 4} {
    schedule.yield
  }
  schedule.stage {index = 3, count = 4} {
    schedule.yield
  }
  func.return
}

// -----

// A schedule already there is replaced, not added to: a hand-written GPipe of one
// microbatch becomes the schedule asked for.
// GPIPE-LABEL: func.func @rescheduled
// GPIPE:         schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 2, virtual = 1}
// GPIPE-NOT:     schedule.pipeline {
// GPIPE:         func.return
// ONEF-LABEL:  func.func @rescheduled
// ONEF-NEXT:     schedule.stage {index = 0, count = 2}
// ONEF:          schedule.stage {index = 1, count = 2}
// ONEF-NOT:      microbatches = 1
// ONEF:          schedule.pipeline {kind = "1f1b", ranks = 2, microbatches = 4, virtual = 1}
// ONEF-NOT:      schedule.pipeline {
// ONEF:          func.return
func.func @rescheduled() {
  schedule.stage {index = 0, count = 2} {
    schedule.yield
  }
  schedule.stage {index = 1, count = 2} {
    schedule.yield
  }
  schedule.pipeline {kind = gpipe, ranks = 2, microbatches = 1, virtual = 1} {
    schedule.pipeline_rank {index = 0} {
      schedule.action forward {microbatch = 0, stage = 0}
      schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
      schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}
      schedule.action backward {microbatch = 0, stage = 0}
    }
    schedule.pipeline_rank {index = 1} {
      schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}
      schedule.action forward {microbatch = 0, stage = 1}
      schedule.action backward {microbatch = 0, stage = 1}
      schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}
    }
  }
  func.return
}

// -----

// A function without pipeline stages is left as it is.
// GPIPE-LABEL: func.func @no_stages
// GPIPE-NEXT:    func.return
// GPIPE-NEXT:  }
// ONEF-LABEL:  func.func @no_stages
// ONEF-NEXT:     func.return
// ONEF-NEXT:   }
func.func @no_stages() {
  func.return
}
