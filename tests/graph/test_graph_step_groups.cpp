// The group schedule of a task list's steps (graph::schedule_step_groups) on the tiny chip (2
// cube cores, 4 vector cores), against groups derived by hand from the dependences and the
// cores: the list scheduler runs first the steps on the longest chains and pairs a filter
// gradient with a later ready vector step; a chain stays one step a group; steps that launch nothing pass their predecessors
// on and take their latest predecessor's position; steps alone stay alone; a step with more
// blocks than the chip's cores of its kind takes them all and others join it on other cores; a
// step joins only where all its blocks find free cores; a step that is not after an earlier
// step is an error.
#include <catch2/catch.hpp>

#include "adapter/graph/step_groups.h"
#include "isa/assembler.h"

using namespace npusim;
using namespace npusim::graph;
using Groups = std::vector<std::vector<size_t>>;

namespace {

const ChipConfig& tiny() {
  static const ChipConfig cfg = load_chip_config("tiny");
  return cfg;
}

const isa::Program* program(const char* section) {
  static const isa::Program cube = isa::assemble(".kernel c\n.section aic\n    end\n", "c.s");
  static const isa::Program vector = isa::assemble(".kernel v\n.section aiv\n    end\n", "v.s");
  return std::string(section) == "aic" ? &cube : &vector;
}

GroupStep cube(std::vector<size_t> after, int blocks = 2) {
  return {std::move(after), program("aic"), blocks, false};
}
GroupStep vec(std::vector<size_t> after, int blocks = 4) {
  return {std::move(after), program("aiv"), blocks, false};
}
GroupStep nothing(std::vector<size_t> after) { return {std::move(after), nullptr, 1, false}; }

}  // namespace

TEST_CASE("the steps later steps wait for go first; a filter gradient fills a group beside them") {
  // A backward pass in miniature, in an order TensorFlow may give: 0 the filter gradient of
  // layer L (cube, nothing after it), 1 its data gradient (cube), 2 and 3 the batch-norm
  // gradients of layer L-1 (vector) reading it, 4 the data gradient of layer L-1.
  const std::vector<GroupStep> steps = {cube({}), cube({}), vec({1}), vec({2}), cube({3})};
  const StepGroups g = schedule_step_groups(steps, tiny());
  // 1 heads the longest chain (1, 2, 3, 4); step 0 fits beside 2, the first vector step ready
  // after 1. In task order 0 would open the first group alone and nothing would pair.
  CHECK(g.groups == Groups{{1}, {0, 2}, {3}, {4}});
  CHECK(g.position == std::vector<int>{1, 0, 1, 2, 3});
}

TEST_CASE("steps share a group while their cores fit; dependent steps never do") {
  // Two cube steps of 1 block each fit beside each other and beside a vector step of 4.
  const std::vector<GroupStep> steps = {cube({}, 1), cube({}, 1), vec({}), vec({0}, 1)};
  const StepGroups g = schedule_step_groups(steps, tiny());
  CHECK(g.groups == Groups{{0, 1, 2}, {3}});
}

TEST_CASE("a chain is one step a group, in order") {
  const std::vector<GroupStep> steps = {vec({}), cube({0}), vec({1})};
  const StepGroups g = schedule_step_groups(steps, tiny());
  CHECK(g.groups == Groups{{0}, {1}, {2}});
  CHECK(g.position == std::vector<int>{0, 1, 2});
}

TEST_CASE("steps that launch nothing pass their predecessors on; steps alone stay alone") {
  // 1 a view of 0's output: 2 reads it, so 2 waits for 0. 3 runs alone (several launches);
  // 4 would fit beside it but may not join.
  GroupStep alone = vec({});
  alone.alone = true;
  const std::vector<GroupStep> steps = {cube({}), nothing({0}), vec({1}), alone, vec({})};
  const StepGroups g = schedule_step_groups(steps, tiny());
  CHECK(g.groups == Groups{{0, 4}, {2}, {3}});
  CHECK(g.position == std::vector<int>{0, 0, 1, 2, 0});
}

TEST_CASE("a step with more blocks than the chip's cores of its kind takes them all; others "
          "join beside it on other cores") {
  // 0: 8 vector blocks on the 4 vector cores (its blocks run in waves): it opens the group and
  // takes every vector core; 1 (one vector block) finds none free and waits for the next group;
  // 2 (cube, 2 blocks) takes the 2 cube cores beside 0. 3 (8 vector blocks, ready) can never
  // take 8 cores at once: it joins no group and opens the next after 1, which comes first in task
  // order at the same priority.
  const std::vector<GroupStep> steps = {vec({}, 8), vec({}, 1), cube({}), vec({}, 8)};
  const StepGroups g = schedule_step_groups(steps, tiny());
  CHECK(g.groups == Groups{{0, 2}, {1}, {3}});
  CHECK(g.position == std::vector<int>{0, 1, 0, 2});
}

TEST_CASE("a step joins a group only where all its blocks find free cores") {
  // 0 takes 3 of the 4 vector cores; 1 (2 blocks) would begin on the fourth and take another
  // as 0's blocks end, but it does not join: it opens the next group (its blocks then first
  // served the cores 0 frees). 2 (1 block) takes the fourth core beside 0.
  const std::vector<GroupStep> steps = {vec({}, 3), vec({}, 2), vec({}, 1)};
  const StepGroups g = schedule_step_groups(steps, tiny());
  CHECK(g.groups == Groups{{0, 2}, {1}});
}

TEST_CASE("a step after a later step is an error naming both") {
  const std::vector<GroupStep> steps = {vec({1}), vec({})};
  CHECK_THROWS_WITH(schedule_step_groups(steps, tiny()),
                    Catch::Contains("step 0 comes after step 1"));
}
