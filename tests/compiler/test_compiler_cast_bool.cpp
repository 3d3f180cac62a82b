// Cast bool -> int8 / uint8 (ops/cast.cpp): a byte copy (bool bytes are 0 / 1, the values TF's
// Cast gives), where a vconv between two 8-bit types is refused by the vector unit. Reference:
// the bool value as 0 / 1 in the target type. Exact.
#include <catch2/catch.hpp>

#include <random>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

TEST_CASE("Cast bool -> s8 / u8 runs on the chip and gives 0 / 1") {
  std::mt19937 rng(11);
  // Odd sizes, one element, a tile's worth and more (several blocks), an empty tensor.
  for (std::vector<int64_t> shape : {std::vector<int64_t>{1}, {3, 7}, {5, 1000}, {0, 4}}) {
    HostTensor x{TensorDesc{DataType::BOOL, shape}, {}};
    for (int64_t i = 0; i < x.desc.num_elements(); ++i) x.values.push_back(rng() % 2);
    for (DataType dst : {DataType::S8, DataType::U8}) {
      INFO(compiler::data_type_name(dst) << " " << compiler::shape_str(shape));
      OpDesc op = make_op("Cast", {x.desc}, {{"SrcT", std::string("bool")},
                                             {"DstT", std::string(compiler::data_type_name(dst))}});
      CompiledKernel k = compiler::compile(op, test_sim().config());
      REQUIRE(k.outputs[0] == TensorDesc{dst, shape});
      if (x.desc.num_elements() == 0) {
        CHECK(k.launches.empty());
        continue;
      }
      RunResult r = run_compiled(test_sim(), k, {x});
      CHECK(r.outputs[0].values == x.values);
    }
  }
}
