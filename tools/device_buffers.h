// Host-side bookkeeping for the command line: places kernel arguments in device memory (a bump
// allocator over the simulated HBM, 512-byte aligned), copies them in and out over the HDC link.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/npy.h"
#include "isa/isa.h"
#include "sim/simulator.h"

namespace npusim::cli {

struct DeviceTensor {
  std::string name;
  uint64_t addr = 0;
  NpyArray host;  // dtype/shape; data filled for inputs, and for outputs after copy-back
};

class DeviceArena {
 public:
  explicit DeviceArena(Simulator& sim) : m_sim(sim) {}
  // Allocates bytes of device memory; throws npusim::Error naming `what` when the HBM is full.
  uint64_t allocate(uint64_t bytes, const std::string& what);
  // Allocates and copies host data to the device over the HDC link; returns the device address.
  uint64_t upload(const NpyArray& a, const std::string& what);
  void download(uint64_t addr, NpyArray& a);
  double hdc_us() const { return m_hdc_us; }

 private:
  Simulator& m_sim;
  uint64_t m_next = 0x10000;  // first allocation; address 0 stays unused
  double m_hdc_us = 0;
};

// Parses "f16:256x256" (dtype name from the ISA, dims separated by x) into an empty array.
NpyArray parse_tensor_spec(const std::string& spec, const std::string& where);

}  // namespace npusim::cli
