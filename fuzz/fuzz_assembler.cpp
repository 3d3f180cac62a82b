// The assembler on arbitrary text. An accepted program must also disassemble, serialise to the
// binary format and read back with the same disassembly.
#include "fuzz/fuzz_util.h"
#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "isa/kernel_file.h"

using namespace npusim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  isa::Program p;
  if (!fuzz::accepted([&] { p = isa::assemble(fuzz::as_text(data, size), "fuzz.s"); })) return 0;
  const std::string text = isa::disassemble(p);
  std::vector<uint8_t> bin;
  // write_kernel rejects only operands that do not fit their fields, which assemble() checked.
  fuzz::fuzz_require(fuzz::accepted([&] { bin = isa::write_kernel(p); }),
                     "an assembled program does not serialise");
  isa::Program q = isa::read_kernel(bin, "fuzz.npuk");
  fuzz::fuzz_require(isa::disassemble(q) == text, "binary round trip changes the disassembly");
  return 0;
}
