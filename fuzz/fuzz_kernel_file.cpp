// The binary kernel reader on arbitrary bytes. An accepted program must disassemble and write
// back to a binary that reads as the same program.
#include "fuzz/fuzz_util.h"
#include "isa/disassembler.h"
#include "isa/kernel_file.h"

using namespace npusim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  isa::Program p;
  if (!fuzz::accepted([&] { p = isa::read_kernel(bytes, "fuzz.npuk"); })) return 0;
  const std::string text = isa::disassemble(p);
  std::vector<uint8_t> bin;
  fuzz::fuzz_require(fuzz::accepted([&] { bin = isa::write_kernel(p); }),
                     "a loaded program does not serialise");
  isa::Program q = isa::read_kernel(bin, "fuzz.npuk");
  fuzz::fuzz_require(isa::disassemble(q) == text, "binary round trip changes the disassembly");
  return 0;
}
