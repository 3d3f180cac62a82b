// The kernel cache: one compile per key under concurrent lookups, failures not cached, keys
// that include the chip config. Needs no device.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "adapter/runtime/kernel_cache.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using rt::KernelCache;
using rt::StatusCode;

namespace {

// A compile function that counts its calls and takes long enough for all threads to arrive.
KernelCache::CompileFn counting_compile(std::atomic<int>* calls, const std::string& name) {
  return [calls, name](std::shared_ptr<const isa::Program>* out) {
    calls->fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    *out = test::assemble_text(".kernel " + name + "\n.section aiv\n    end\n", name + ".s");
    return rt::Status();
  };
}

}  // namespace

TEST_CASE("kernel cache: 8 threads asking for one key at once compile it once") {
  KernelCache cache(load_chip_config("tiny"));
  std::atomic<int> calls{0};
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<const isa::Program>> got(kThreads);
  std::vector<rt::Status> status(kThreads);
  std::vector<std::thread> threads;
  const std::string key = "Add|f16,f16,f16|[1024],[1024],[1024]|";
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      status[t] = cache.get_or_compile(key, counting_compile(&calls, "add_1024"), &got[t]);
    });
  for (auto& th : threads) th.join();
  CHECK(calls == 1);
  for (int t = 0; t < kThreads; ++t) {
    CHECK(status[t].ok());
    CHECK(got[t] == got[0]);
  }
  REQUIRE(got[0]);
  CHECK(got[0]->name == "add_1024");
  rt::KernelCacheStats s = cache.stats();
  CHECK(s.misses == 1);
  CHECK(s.hits == kThreads - 1);
  CHECK(s.entries == 1);

  // Another key compiles again; the first is a plain hit now.
  std::shared_ptr<const isa::Program> p;
  REQUIRE(cache.get_or_compile("Add|f16,f16,f16|[2048],[2048],[2048]|",
                               counting_compile(&calls, "add_2048"), &p).ok());
  CHECK(calls == 2);
  REQUIRE(cache.get_or_compile(key, counting_compile(&calls, "add_1024"), &p).ok());
  CHECK(calls == 2);
  CHECK(p == got[0]);
  CHECK(cache.find(key) == got[0]);
  CHECK(cache.find("nothing") == nullptr);
  CHECK(cache.stats().entries == 2);
  cache.clear();
  CHECK(cache.find(key) == nullptr);
}

TEST_CASE("kernel cache: a failed compile returns its status and is retried next time") {
  KernelCache cache(load_chip_config("tiny"));
  int calls = 0;
  auto unsupported = [&](std::shared_ptr<const isa::Program>*) {
    ++calls;
    return rt::Status(StatusCode::unsupported, "op 'Conv2D': data_format 'NCHW' is not supported");
  };
  std::shared_ptr<const isa::Program> p;
  rt::Status st = cache.get_or_compile("Conv2D|f16|[1,3,8,8]|data_format=NCHW", unsupported, &p);
  CHECK(st.code() == StatusCode::unsupported);
  CHECK_THAT(st.message(), Catch::Contains("op 'Conv2D': data_format 'NCHW'"));
  CHECK(p == nullptr);
  st = cache.get_or_compile("Conv2D|f16|[1,3,8,8]|data_format=NCHW", unsupported, &p);
  CHECK(calls == 2);
  CHECK(cache.stats().failed_compiles == 2);
  CHECK(cache.stats().entries == 0);

  // Exceptions from the compiler become statuses naming the key.
  st = cache.get_or_compile("Bad|f16||", [](std::shared_ptr<const isa::Program>* out) {
    *out = test::assemble_text("bogus_mnemonic x1\n", "bad.s");
    return rt::Status();
  }, &p);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("'Bad|f16||'"));
  CHECK_THAT(st.message(), Catch::Contains("bad.s:1"));
  st = cache.get_or_compile("Empty||", [](std::shared_ptr<const isa::Program>*) {
    return rt::Status();
  }, &p);
  CHECK(st.code() == StatusCode::internal);
}

TEST_CASE("kernel cache: keys carry the chip config identity and a canonical op description") {
  const ChipConfig tiny = load_chip_config("tiny");
  const ChipConfig tiny_slow = load_chip_config("tiny", {"clock_mhz=1000"});
  KernelCache a(tiny), b(tiny_slow), c(load_chip_config("tiny"));
  CHECK(a.chip_identity() != b.chip_identity());
  CHECK(a.chip_identity() == c.chip_identity());  // same config, same identity
  CHECK(a.chip_identity().rfind("tiny:", 0) == 0);
  CHECK(a.full_key("k") == a.chip_identity() + "|k");
  CHECK(a.full_key("k") != b.full_key("k"));

  rt::KernelKey key;
  key.op = "MatMul";
  key.dtypes = {"f16", "f16", "f32"};
  key.shapes = {{128, 64}, {64, 32}, {}};
  key.attrs = {{"transpose_b", "true"}, {"transpose_a", "false"}};
  CHECK(key.str() == "MatMul|f16,f16,f32|[128,64],[64,32],[]|transpose_a=false;transpose_b=true");
}

TEST_CASE("kernel cache: the device's cache is keyed on the device's chip config") {
  auto dev = test::tiny_device();
  CHECK(dev->kernel_cache().chip_identity() == dev->chip_identity());
  CHECK(dev->chip_identity() == rt::chip_config_identity(load_chip_config("tiny")));
}
