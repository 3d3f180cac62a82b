// The memory plan under a budget (graph::plan_memory_within_budget): lifetime extensions
// granted while the plan's peak stays within the budget, against peaks derived by hand from
// the buffers' sizes and lifetimes (every size a multiple of kPlanAlign, so no padding):
// every extension granted where all fit; where they do not, each in order granted only if the
// plan with it stays within the budget; a budget below the plan without extensions is that
// plan's peak; an extension naming no buffer is an error. In every plan the buffers live at
// the same time (with the lifetimes granted) never share a byte.
#include <catch2/catch.hpp>

#include "adapter/graph/memory_plan.h"
#include "common/error.h"

using namespace npusim;
using namespace npusim::graph;

namespace {

constexpr uint64_t kKiB = 1024;

// a [0,1] and b [2,3] may share bytes; c [0,3] lives beside both: 2 KiB without extensions.
std::vector<PlannedBuffer> three() {
  return {{"a", kKiB, 0, 1, 0}, {"b", kKiB, 2, 3, 0}, {"c", kKiB, 0, 3, 0}};
}

// Buffers live at the same time never overlap, and all lie below the peak.
void check_disjoint(const std::vector<PlannedBuffer>& b, uint64_t peak) {
  for (size_t i = 0; i < b.size(); ++i) {
    CHECK(b[i].offset % kPlanAlign == 0);
    CHECK(b[i].offset + b[i].bytes <= peak);
    for (size_t j = i + 1; j < b.size(); ++j)
      if (b[i].first <= b[j].last && b[j].first <= b[i].last)
        CHECK((b[i].offset + b[i].bytes <= b[j].offset || b[j].offset + b[j].bytes <= b[i].offset));
  }
}

}  // namespace

TEST_CASE("memory budget: every extension granted where the plan with all of them fits") {
  std::vector<PlannedBuffer> b = three();
  // a until step 2 (beside b: 3 KiB at step 2), c until step 9 (nothing lives after step 3).
  const std::vector<LifetimeExtension> ext = {{{{0, 2}}}, {{{2, 9}}}};
  std::vector<char> granted;
  const uint64_t peak = plan_memory_within_budget(b, ext, 3 * kKiB, &granted);
  CHECK(peak == 3 * kKiB);
  CHECK(granted == std::vector<char>{1, 1});
  CHECK(b[0].last == 2);
  CHECK(b[2].last == 9);
  check_disjoint(b, peak);
}

TEST_CASE("memory budget: an extension that would pass the budget is refused, the others kept") {
  std::vector<PlannedBuffer> b = three();
  // The first would put a beside b (3 KiB), the second lengthens c where nothing else lives,
  // the third keeps b one step longer, also where it lies beside c alone.
  const std::vector<LifetimeExtension> ext = {{{{0, 2}}}, {{{2, 9}}}, {{{1, 4}}}};
  std::vector<char> granted;
  const uint64_t peak = plan_memory_within_budget(b, ext, 2 * kKiB, &granted);
  CHECK(peak == 2 * kKiB);
  CHECK(granted == std::vector<char>{0, 1, 1});
  CHECK(b[0].last == 1);  // as given
  CHECK(b[1].last == 4);
  CHECK(b[2].last == 9);
  check_disjoint(b, peak);
  // The same budget with the extensions in the other order: a's comes last and is refused.
  b = three();
  const std::vector<LifetimeExtension> reversed = {ext[2], ext[1], ext[0]};
  CHECK(plan_memory_within_budget(b, reversed, 2 * kKiB, &granted) == 2 * kKiB);
  CHECK(granted == std::vector<char>{1, 1, 0});
}

TEST_CASE("memory budget: below the plan without extensions, that plan's peak is the limit") {
  std::vector<PlannedBuffer> b = three();
  const std::vector<LifetimeExtension> ext = {{{{0, 2}}}, {{{2, 9}}}};
  std::vector<char> granted;
  // 1 KiB cannot be met: c lives beside a and b. Extensions that keep 2 KiB are granted.
  CHECK(plan_memory_within_budget(b, ext, kKiB, &granted) == 2 * kKiB);
  CHECK(granted == std::vector<char>{0, 1});
  check_disjoint(b, 2 * kKiB);
  // An extension that lengthens nothing is granted as it is.
  b = three();
  CHECK(plan_memory_within_budget(b, {{{{0, 1}, {1, 0}}}}, 2 * kKiB, &granted) == 2 * kKiB);
  CHECK(granted == std::vector<char>{1});
  CHECK((b[0].last == 1 && b[1].last == 3));
}

TEST_CASE("memory budget: an extension naming no buffer is an error naming it") {
  std::vector<PlannedBuffer> b = three();
  std::vector<char> granted;
  CHECK_THROWS_WITH(plan_memory_within_budget(b, {{}, {{{3, 5}}}}, 2 * kKiB, &granted),
                    Catch::Matchers::Contains("extension 1 names buffer 3, the plan has 3"));
}
