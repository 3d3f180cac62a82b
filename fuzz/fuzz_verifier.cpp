// The verifier on whatever the assembler or binary reader accepts (a binary is recognised by
// its magic), against a split chip (tiny) and a coupled one (310p).
#include "fuzz/fuzz_util.h"
#include "isa/assembler.h"
#include "isa/kernel_file.h"
#include "sim/config/chip_config.h"
#include "sim/verifier/verifier.h"

using namespace npusim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ChipConfig kSplit = load_chip_config("tiny");
  static const ChipConfig kCoupled = load_chip_config("310p");
  const std::vector<uint8_t> bytes(data, data + size);
  isa::Program p;
  if (!fuzz::accepted([&] {
        p = isa::is_kernel_binary(bytes) ? isa::read_kernel(bytes, "fuzz.npuk")
                                         : isa::assemble(fuzz::as_text(data, size), "fuzz.s");
      }))
    return 0;
  for (const ChipConfig* cfg : {&kSplit, &kCoupled}) {
    const std::vector<isa::VerifyIssue> issues = isa::verify(p, *cfg);
    // verify_or_throw reports exactly when verify finds issues.
    const bool thrown = !fuzz::accepted([&] { isa::verify_or_throw(p, *cfg); });
    fuzz::fuzz_require(thrown == !issues.empty(), "verify and verify_or_throw disagree");
  }
  return 0;
}
