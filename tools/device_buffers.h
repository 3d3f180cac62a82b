// Host-side bookkeeping for the command line: places kernel arguments in device memory (the
// runtime's HBM allocator over the simulated HBM, adapter/runtime/allocator.h), copies them in
// and out over the HDC link.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapter/runtime/allocator.h"
#include "adapter/runtime/tensor_block.h"
#include "common/npy.h"
#include "isa/isa.h"
#include "sim/simulator.h"

namespace npusim::cli {

struct DeviceTensor {
  std::string name;
  uint64_t addr = 0;
  NpyArray host;  // dtype/shape; data filled for inputs, and for outputs after copy-back
};

// Every buffer is an allocation block of the runtime's allocator (rt::HbmAllocator, aligned as
// rt::Device aligns it): a plain block, as the runtime's malloc gives a kernel launched through
// its API (`npusim run`), or a compiled op's tensor in a block laid out as a TensorFlow tensor's
// (allocate_tensor, `npusim op`). Launches carry the blocks
// (KernelLaunch::gm_blocks): with a cold L2 a launch's lines are filed by block and the L2's page
// rotation counts each block's pages from its first line (sim/chip/l2_placement.h), so a kernel
// launched here files its lines as the same launch from TensorFlow does. Buffers are never freed
// (one command, one launch sequence), so they lie back to back from kBase in allocation order.
class DeviceArena {
 public:
  // First device address handed out (rt::Device::kHbmBase's value): 0 is never a buffer.
  static constexpr uint64_t kBase = 64 * 1024;

  explicit DeviceArena(Simulator& sim);
  // Allocates a block of at least `bytes` of device memory (one alignment unit for 0 bytes, so
  // every buffer has an address of its own); throws npusim::Error naming `what` when the HBM is
  // full.
  uint64_t allocate(uint64_t bytes, const std::string& what);
  // Allocates a block for a compiled op's tensor of `bytes` laid out as the TF plugin lays out
  // every tensor (rt::TensorBlock: a guard line before it, compiler::kDeviceBufferAlign bytes
  // after it) and returns the tensor's address; errors as allocate's.
  uint64_t allocate_tensor(uint64_t bytes, const std::string& what);
  // The arena's blocks as the chip's L2 model looks them up (the allocator's block_of).
  GmBlockLookup blocks() const;
  // A launch of `program` on `block_dim` blocks with `args`, its lines filed by the arena's blocks.
  KernelLaunch launch(const isa::Program& program, std::vector<uint64_t> args, int block_dim) const;
  // Allocates and copies host data to the device over the HDC link; returns the device address.
  uint64_t upload(const NpyArray& a, const std::string& what);
  void download(uint64_t addr, NpyArray& a);
  double hdc_us() const { return m_hdc_us; }

 private:
  Simulator& m_sim;
  std::shared_ptr<rt::HbmAllocator> m_allocator;  // shared with the launches' block lookups
  rt::TensorBlock m_tensor_block;                  // allocate_tensor's layout
  double m_hdc_us = 0;
};

// An element type and shape as the command line writes them: "f16:256x256".
struct TensorSpec {
  isa::Dtype dtype = isa::Dtype::NONE;
  std::vector<int64_t> shape;
};
// Parses "DTYPE:SHAPE" (dtype name from the ISA, dims separated by x); errors start with `where`.
TensorSpec parse_tensor_spec(const std::string& spec, const std::string& where);
// An empty array of that type and shape (bf16 as "u2", common/npy.h).
NpyArray empty_array(const TensorSpec& t);

// A typed kernel argument with its dimensions resolved for one launch: a literal dimension is
// known; one naming a scalar argument is known if that argument was given with --arg.
struct ArgShape {
  isa::ArgInfo arg;
  std::vector<std::optional<int64_t>> dims;  // empty if the argument takes any shape
  bool all_known() const;
  // "f16[M, K] with M=64, K=32" ("f16 of any shape"; unknown dims "(M not given)").
  std::string describe() const;
  // The shape if all_known(), else what is known, e.g. "(M, 32)" (names for unknown dims).
  std::string shape_text() const;
};
ArgShape resolve_arg_shape(const isa::ArgInfo& arg, const std::map<std::string, uint64_t>& scalars);

// Checks an --in array against its typed argument: the .npy dtype must be the argument's element
// type (bf16 as "u2") and, for a shaped argument, the rank and every known dimension must match.
// Throws npusim::Error starting with `where` and naming the argument, the file, what was
// expected and what was found.
void check_input(const ArgShape& s, const NpyArray& a, const std::string& file,
                 const std::string& where);

// The array to allocate for an --out argument. `spec` is the optional ":DTYPE:SHAPE" part
// without its colon ("" if absent). Untyped arguments need the spec; typed ones need it only if
// a dimension is unknown or they take any shape, and a given spec must agree with the type and
// every known dimension. Throws npusim::Error starting with `where` otherwise.
NpyArray output_array(const ArgShape& s, const std::string& spec, const std::string& file,
                      const std::string& where);

}  // namespace npusim::cli
