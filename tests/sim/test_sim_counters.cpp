// The counter registry: a tree named after the module hierarchy, each counter with unit and
// description; duplicate or conflicting names are rejected; reset and dump (also as growth since
// a snapshot) are functions of the registry.
#include <catch2/catch.hpp>

#include "common/error.h"
#include "sim/counters/counters.h"

using namespace npusim;

TEST_CASE("counters form a tree of {value, unit, desc} leaves") {
  CounterRegistry reg;
  CounterGroup chip(reg, "chip");
  Counter& busy = chip.sub("aic0").sub("mte2").add("busy_cycles", "cycles", "busy", 1000);
  Counter& hits = chip.add("l2.hits", "lines", "L2 hits");
  busy.add(2500);  // 2.5 cycles in picoseconds: reported rounded to nearest, 3
  hits.add(7);
  nlohmann::json t = reg.dump();
  CHECK(t["chip"]["aic0"]["mte2"]["busy_cycles"] ==
        nlohmann::json({{"value", 3}, {"unit", "cycles"}, {"desc", "busy"}}));
  CHECK(t["chip"]["l2"]["hits"]["value"] == 7);
  CHECK(reg.size() == 2);
  CHECK(reg.find("chip.l2.hits") == &hits);
  CHECK(reg.find("chip.l2") == nullptr);
}

TEST_CASE("duplicate and conflicting names are rejected") {
  CounterRegistry reg;
  reg.add("chip.l2.hits", "lines", "");
  CHECK_THROWS_AS(reg.add("chip.l2.hits", "lines", ""), Error);
  CHECK_THROWS_AS(reg.add("chip.l2", "x", ""), Error);            // would contain a counter
  CHECK_THROWS_AS(reg.add("chip.l2.hits.more", "x", ""), Error);  // inside a counter
  CHECK_THROWS_AS(reg.add("chip..x", "x", ""), Error);
  CHECK_THROWS_AS(reg.add("", "x", ""), Error);
  CHECK_NOTHROW(reg.add("chip.l2.hitsx", "lines", ""));  // a sibling sharing a prefix is fine
  CounterGroup g(reg, "chip");
  Counter& a = g.get_or_add("hbm.read_bytes", "bytes", "");
  CHECK(&g.get_or_add("hbm.read_bytes", "bytes", "") == &a);
}

TEST_CASE("dump_since reports growth after a snapshot; reset zeroes") {
  CounterRegistry reg;
  Counter& c = reg.add("chip.launches", "launches", "");
  c.add(5);
  auto base = reg.snapshot();
  c.add(2);
  Counter& later = reg.add("chip.new", "x", "");  // registered after the snapshot
  later.add(4);
  nlohmann::json d = reg.dump_since(base);
  CHECK(d["chip"]["launches"]["value"] == 2);
  CHECK(d["chip"]["new"]["value"] == 4);
  CHECK(reg.dump()["chip"]["launches"]["value"] == 7);
  reg.reset();
  CHECK(reg.dump()["chip"]["launches"]["value"] == 0);
  CHECK(reg.dump_since(base)["chip"]["launches"]["value"] == 0);
}

TEST_CASE("delta_since holds the changed counters flat; its tree is dump_since's") {
  CounterRegistry reg;
  Counter& busy = reg.add("chip.aic0.mte2.busy_cycles", "cycles", "busy", 1000);
  Counter& idle = reg.add("chip.aic1.mte2.busy_cycles", "cycles", "busy", 1000);
  Counter& tiny = reg.add("chip.aic0.m.busy_cycles", "cycles", "busy", 1000);
  Counter& hwm =
      reg.add("chip.aic0.buffer.ub.high_water", "bytes", "hwm", 1, CounterKind::kHighWater);
  Counter& launches = reg.add("chip.launches", "launches", "launches");
  busy.add(1000);
  idle.add(3000);
  hwm.raise_to(512);
  std::vector<uint64_t> base;
  reg.snapshot(base);
  CHECK(base == std::vector<uint64_t>{1000, 3000, 0, 512, 0});
  busy.add(2500);     // 2.5 cycles: reported 3
  tiny.add(400);      // 0.4 cycles: reported 0, so left out like an unchanged counter
  hwm.raise_to(256);  // the window since the snapshot: 256
  launches.inc();
  Counter& later = reg.add("chip.hbm.read_bytes", "bytes", "read");  // after the snapshot
  later.add(64);
  const CounterDelta d = reg.delta_since(base);
  CHECK(d.size() == 4);  // busy, hwm, launches, later; not idle (unchanged) nor tiny (0)
  const nlohmann::json expected = {
      {"chip",
       {{"aic0",
         {{"mte2", {{"busy_cycles", {{"value", 3}, {"unit", "cycles"}, {"desc", "busy"}}}}},
          {"buffer",
           {{"ub", {{"high_water", {{"value", 256}, {"unit", "bytes"}, {"desc", "hwm"}}}}}}}}},
        {"launches", {{"value", 1}, {"unit", "launches"}, {"desc", "launches"}}},
        {"hbm", {{"read_bytes", {{"value", 64}, {"unit", "bytes"}, {"desc", "read"}}}}}}}};
  CHECK(d.tree() == expected);
  CHECK(reg.dump_since(base, /*changed_only=*/true) == expected);
}

TEST_CASE("equal deltas share one copy of their values") {
  CounterRegistry reg;
  Counter& busy = reg.add("chip.aic0.mte2.busy_cycles", "cycles", "busy", 1000);
  Counter& launches = reg.add("chip.launches", "launches", "launches");
  std::vector<uint64_t> base;
  auto launch = [&](uint64_t busy_ps) {
    reg.snapshot(base);
    busy.add(busy_ps);
    launches.inc();
    return reg.delta_since(base);
  };
  const CounterDelta first = launch(2000), again = launch(2000), other = launch(3000);
  CHECK(first.tree() == again.tree());
  CHECK(first.shares_values(again));
  CHECK_FALSE(first.shares_values(other));
  CHECK(other.tree()["chip"]["aic0"]["mte2"]["busy_cycles"]["value"] == 3);
  // delta_of a raw delta with the same growth: the same values, shared too.
  reg.snapshot(base);
  busy.add(2000);
  launches.inc();
  const CounterRegistry::RawDelta raw = reg.raw_delta_since(base);
  CHECK(reg.delta_of(raw).shares_values(first));
  // Once every delta holding some values is gone, equal growth builds them afresh (the table
  // keeps no values alive by itself).
  CounterDelta gone = launch(7000);
  gone = CounterDelta();
  const CounterDelta fresh = launch(7000);
  CHECK(fresh.tree()["chip"]["aic0"]["mte2"]["busy_cycles"]["value"] == 7);
  CHECK(fresh.size() == 2);
}

TEST_CASE("a delta outlives its registry") {
  CounterDelta kept;
  {
    CounterRegistry scoped;
    Counter& c = scoped.add("chip.launches", "launches", "launches run");
    const auto base = scoped.snapshot();
    c.inc();
    kept = scoped.delta_since(base);
  }
  CHECK(kept.tree() ==
        nlohmann::json({{"chip",
                         {{"launches",
                           {{"value", 1}, {"unit", "launches"}, {"desc", "launches run"}}}}}}));
}

TEST_CASE("a delta's root group is present even when nothing changed") {
  CounterRegistry reg;
  reg.add("chip.launches", "launches", "");
  const auto base = reg.snapshot();
  CounterDelta d = reg.delta_since(base);
  CHECK(d.size() == 0);
  CHECK(d.tree() == nlohmann::json::object());
  d.set_root("chip");
  CHECK(d.tree() == nlohmann::json({{"chip", nlohmann::json::object()}}));
  // A delta made from a ready tree returns it as is.
  const nlohmann::json t = {{"chip", {{"x", 1}}}};
  CHECK(CounterDelta(t).tree() == t);
}
