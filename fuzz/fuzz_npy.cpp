// The .npy parser on arbitrary bytes. An accepted array must serialise and parse back equal.
#include "common/npy.h"
#include "fuzz/fuzz_util.h"

using namespace npusim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  NpyArray a;
  if (!fuzz::accepted([&] { a = parse_npy(bytes, "fuzz.npy"); })) return 0;
  fuzz::fuzz_require(a.data.size() == static_cast<uint64_t>(a.elements()) * a.item_size(),
                     "data size disagrees with shape and dtype");
  isa_dtype_of_npy(a.dtype);
  const NpyArray b = parse_npy(serialize_npy(a), "fuzz.npy");
  fuzz::fuzz_require(b.dtype == a.dtype && b.shape == a.shape && b.data == a.data,
                     "serialise/parse round trip changes the array");
  return 0;
}
