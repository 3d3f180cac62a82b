// The offline model (.om) reader on arbitrary bytes, as they are and with the payload size and
// checksum made right (else nearly every mutation stops at the checksum and the header's reader
// is never reached). An accepted model must serialise to a file that reads back and serialises
// to the same bytes.
#include "adapter/graph/model.h"
#include "fuzz/fuzz_util.h"

using namespace npusim;

namespace {

void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = uint8_t(v >> (8 * i));
}

void check(const std::vector<uint8_t>& bytes) {
  graph::OmModel m;
  if (!fuzz::accepted([&] { m = graph::parse_om(bytes, "fuzz.om"); })) return;
  std::vector<uint8_t> out;
  fuzz::fuzz_require(fuzz::accepted([&] { out = graph::serialize_om(m); }),
                     "a loaded model does not serialise");
  const graph::OmModel back = graph::parse_om(out, "fuzz.om");
  fuzz::fuzz_require(graph::serialize_om(back) == out, "the .om round trip changes the bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  check(bytes);
  if (bytes.size() >= 32) {
    put_u64(bytes, 16, bytes.size() - 32);
    put_u64(bytes, 24, graph::om_checksum(bytes.data() + 32, bytes.size() - 32));
    check(bytes);
  }
  return 0;
}
