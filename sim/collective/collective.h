// The collective engine, as HCCL has it: all-reduce, all-gather, reduce-scatter, broadcast,
// all-to-all and send/receive between device buffers of the chips of a SystemSimulator. A call
// names its communicator (the chips, rank r being chips[r]), each rank's send and receive
// buffer (device addresses on its chip), the element count, type and reduction, and the
// algorithm (HCCL_ALGO's choice; automatic picks as HCCL does by topology).
//
// An algorithm is a sequence of steps; in a step every rank sends blocks to peers over the links
// (the Fabric: concurrent transfers share the channels they cross) and the receivers reduce
// them. The data really moves: inputs are read from the send buffers, blocks pass between the
// ranks' communication buffers (HCCL's CCL buffers, not in device memory here), reductions are
// computed element by element in the dtype (f16/bf16 rounded per operation), and the results
// are written to the receive buffers. Reduction time: where HCCL does it inline in the DMA
// (SDMA inline reduce: sum, max, min of f32/f16/bf16/s32/s16/s8) it costs no time beyond the
// transfer; otherwise (prod) each receiving chip runs a vector reduce kernel on its AI vector
// cores, timed from the chip config (docs/multichip.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "sim/system/system_simulator.h"

namespace npusim {

enum class CollectiveKind {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  all_to_all,
  send_recv
};
enum class ReduceOp { sum, prod, max, min };
// Flat algorithms run over all ranks alike: mesh (inside one full-mesh server), ring,
// halving_doubling (a power-of-two number of ranks). The hierarchical ones are all_reduce over
// several full-mesh servers, as many ranks in each (HCCL's level 0 mesh inside servers, level 1
// between them, as HCCL_ALGO="level0:NA;level1:ring|H-D" selects): mesh_ring,
// mesh_halving_doubling (a power-of-two number of servers). automatic picks as HCCL does by
// topology: mesh inside one full-mesh server, mesh_ring for all_reduce across such servers, ring
// otherwise; all_to_all is always pairwise and send_recv direct.
enum class CollectiveAlgo {
  automatic,
  mesh,
  ring,
  halving_doubling,
  mesh_ring,
  mesh_halving_doubling
};

const char* collective_name(CollectiveKind k);
const char* reduce_op_name(ReduceOp op);
const char* collective_algo_name(CollectiveAlgo a);
// Parse names ("all_reduce", "sum", "ring", "hd" or "halving_doubling", "mesh_hd" or
// "mesh_halving_doubling", "auto"); throw
// npusim::Error listing the valid names.
CollectiveKind collective_from_name(const std::string& s);
ReduceOp reduce_op_from_name(const std::string& s);
CollectiveAlgo collective_algo_from_name(const std::string& s);

// A range of a rank's buffer on its chip (CollectiveCall::send_pieces), bytes.
struct CollectivePiece {
  uint64_t addr = 0, bytes = 0;
};

struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::all_reduce;
  std::vector<int> chips;      // the communicator: rank r is chip chips[r] (distinct chips)
  std::vector<uint64_t> send;  // per rank: the input buffer on its chip
  std::vector<uint64_t> recv;  // per rank: the output buffer on its chip
  // Elements: all_reduce, broadcast, send_recv: of each buffer; all_gather: of each rank's
  // input (outputs hold ranks x count); reduce_scatter: of each rank's output (inputs hold
  // ranks x count); all_to_all: of each block (a buffer holds ranks blocks, block j for rank j).
  uint64_t count = 0;
  // Optional: the element count of each rank's tensor as its caller has it (a TensorFlow
  // replica's shape). Given, they must all equal `count`, or the call fails naming the ranks.
  std::vector<uint64_t> rank_counts;
  isa::Dtype dtype = isa::Dtype::F32;
  ReduceOp op = ReduceOp::sum;  // all_reduce, reduce_scatter
  int root = 0;                 // broadcast: the rank that sends; send_recv: rank 0 sends to 1
  CollectiveAlgo algo = CollectiveAlgo::automatic;
  // Optional, all_reduce and broadcast only: a rank's buffer made of pieces, read (written) one
  // after the other as one buffer of `count` elements: HCCL's fused gradient segment, several
  // tensors that GE allocates in one contiguous buffer. When send_pieces[r] (recv_pieces[r]) is
  // given and not empty it replaces send[r] (recv[r]); its bytes must add up to the buffer's.
  // The time is the same as for one buffer (collectives are zero-copy in this model).
  std::vector<std::vector<CollectivePiece>> send_pieces, recv_pieces;
};

// One step of a collective as it ran: its transfers between chips (all at once over the links)
// and, for a reduction not done inline, the vector reduce kernels after them.
struct CollectiveStepTransfer {
  int src_chip = 0, dst_chip = 0;
  uint64_t bytes = 0;
  uint64_t cycles = 0;  // from the step's start until its last byte arrived
};
struct CollectiveStep {
  uint64_t start_cycle = 0;
  uint64_t cycles = 0;         // transfers and reduce kernels
  uint64_t reduce_cycles = 0;  // of `cycles`: the vector reduce kernels
  std::vector<CollectiveStepTransfer> transfers;
};

struct CollectiveResult {
  std::string algorithm;  // the one that ran: mesh, ring, halving_doubling, pairwise, direct
  uint64_t start_cycle = 0;
  uint64_t cycles = 0;
  double time_us = 0;
  int steps = 0;
  uint64_t link_bytes = 0;     // bytes sent over links, all ranks together
  uint64_t reduce_cycles = 0;  // of `cycles`: vector reduce kernels (not inline in the DMA)
  bool inline_reduce = false;  // the reduction (if any) ran in the DMA
  std::vector<CollectiveStep> step_records;  // every step, in order (reports draw them)
};

// Runs the collective to completion. Throws npusim::Error for a malformed call (naming what is
// wrong: a chip that does not exist, a repeated chip, buffer lists of the wrong length, a
// buffer outside device memory, an algorithm this communicator cannot run, a dtype that cannot
// be reduced).
CollectiveResult run_collective(SystemSimulator& sys, const CollectiveCall& call);

// n elements of type t whose reduction by `op` is exact in every order (so any algorithm's
// result equals any reference's bit for bit): integers -8..8 for sum, max and min; +-1, +-2 and
// +-0.5 for prod (+-1, +-2 for integers). Deterministic in `seed`. Throws npusim::Error for a
// type that is not f32, f16, bf16, s32, s16 or s8.
std::vector<uint8_t> exact_reduction_inputs(isa::Dtype t, ReduceOp op, uint64_t n, uint32_t seed);

// Bytes of one rank's input and output buffers for the call (for callers that allocate them).
uint64_t collective_send_bytes(const CollectiveCall& call);
uint64_t collective_recv_bytes(const CollectiveCall& call);

}  // namespace npusim
