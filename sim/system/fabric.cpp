#include "sim/system/fabric.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "sim/core/core_env.h"

namespace npusim {

// Simulated time counts AI-core cycles of 1000 ps each (sim/core/core_env.h), whatever the
// clock: GB/s and microseconds become bytes per cycle and cycles at clock_mhz, as for the host
// link.
double Fabric::bytes_per_ps(double gbps) const { return gbps * 1e3 / m_cfg.chip.clock_mhz / 1e3; }
uint64_t Fabric::us_to_ps(double us) const {
  return static_cast<uint64_t>(std::llround(us * m_cfg.chip.clock_mhz * 1e3));
}

Fabric::Fabric(sc_core::sc_module_name name, const SystemConfig& cfg, CounterRegistry& counters)
    : sc_module(name), m_cfg(cfg), m_prefix(basename()) {
  const int n = cfg.chips();
  m_link.assign(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(n), -1));
  const int per = cfg.chips_per_server;
  for (int a = 0; a < n; ++a) {
    const int base = cfg.server_of(a) * per, i = a - base;
    for (int j = 0; j < per; ++j) {
      const bool neighbour = (j == (i + 1) % per) || (i == (j + 1) % per);
      const bool linked = j != i && (cfg.topology == SystemTopology::full_mesh || neighbour);
      if (linked)
        m_link[a][base + j] =
            add_channel(fmt::format("c{}->c{}", a, base + j), cfg.link.gbps, counters);
    }
  }
  if (cfg.servers > 1)
    for (int a = 0; a < n; ++a) {
      m_nic_out.push_back(add_channel(fmt::format("c{}.nic_out", a), cfg.nic.gbps, counters));
      m_nic_in.push_back(add_channel(fmt::format("c{}.nic_in", a), cfg.nic.gbps, counters));
    }
  SC_THREAD(run);
}

int Fabric::add_channel(const std::string& name, double gbps, CounterRegistry& counters) {
  Channel c;
  c.name = name;
  c.gbps = gbps;
  const CounterGroup g(counters, m_prefix + "." + name);
  c.bytes = &g.add("bytes", "bytes", "bytes moved over this link direction");
  c.busy = &g.add("busy_cycles", "cycles",
                  "cycles at least one transfer was moving bytes over this link direction", 1000);
  m_channels.push_back(c);
  return static_cast<int>(m_channels.size()) - 1;
}

Fabric::Route Fabric::route(int src, int dst) const {
  const int n = m_cfg.chips();
  if (src < 0 || dst < 0 || src >= n || dst >= n || src == dst)
    throw Error(fmt::format("fabric: no route from chip {} to chip {} in system '{}' of {} chips",
                            src, dst, m_cfg.name, n));
  Route r;
  if (m_cfg.server_of(src) != m_cfg.server_of(dst)) {
    r.channels = {m_nic_out[src], m_nic_in[dst]};
    r.latency_us = m_cfg.nic.latency_us + m_cfg.switch_latency_us;
    return r;
  }
  if (m_link[src][dst] >= 0) {
    r.channels = {m_link[src][dst]};
    r.latency_us = m_cfg.link.latency_us;
    return r;
  }
  // A ring: hop by hop the shorter way round.
  const int per = m_cfg.chips_per_server, base = m_cfg.server_of(src) * per;
  const int forward = ((dst - src) % per + per) % per;
  const int step = forward <= per - forward ? 1 : per - 1;
  for (int a = src; a != dst;) {
    const int b = base + (a - base + step) % per;
    r.channels.push_back(m_link[a][b]);
    r.latency_us += m_cfg.link.latency_us;
    a = b;
  }
  return r;
}

void Fabric::submit(Transfer* t) {
  Flow f{t, route(t->src, t->dst), 0, static_cast<double>(t->bytes)};
  t->done = false;
  t->start_ps = now_ps();
  f.ready_ps = t->start_ps + us_to_ps(f.route.latency_us);
  m_waiting.push_back(std::move(f));
  m_submitted.notify(sc_core::SC_ZERO_TIME);
}

void Fabric::admit_ready() {
  const uint64_t now = now_ps();
  for (auto it = m_waiting.begin(); it != m_waiting.end();) {
    if (it->ready_ps > now) {
      ++it;
      continue;
    }
    if (it->remaining <= 0) {
      it->t->end_ps = now;
      it->t->done = true;
    } else {
      for (int c : it->route.channels) ++m_channels[c].active;
      m_moving.push_back(std::move(*it));
    }
    it = m_waiting.erase(it);
  }
}

void Fabric::share() {
  for (Flow& f : m_moving) {
    f.rate = std::numeric_limits<double>::max();
    for (int c : f.route.channels)
      f.rate = std::min(f.rate, bytes_per_ps(m_channels[c].gbps) / m_channels[c].active);
  }
}

uint64_t Fabric::next_event_ps() const {
  const uint64_t now = now_ps();
  uint64_t next = std::numeric_limits<uint64_t>::max();
  for (const Flow& f : m_waiting) next = std::min(next, f.ready_ps - now);
  // The config's ranges keep this within 2^62 ps (system_config.cpp); the clamp keeps the cast
  // defined whatever the rates.
  for (const Flow& f : m_moving)
    next = std::min(
        next, static_cast<uint64_t>(std::clamp(std::ceil(f.remaining / f.rate), 1.0, 0x1p62)));
  return next;
}

void Fabric::advance(uint64_t elapsed_ps) {
  const uint64_t now = now_ps();
  for (Channel& c : m_channels)
    if (c.active > 0) c.busy->add(elapsed_ps);
  for (auto it = m_moving.begin(); it != m_moving.end();) {
    const double moved = std::min(it->remaining, it->rate * static_cast<double>(elapsed_ps));
    it->remaining -= moved;
    if (it->remaining > 1e-6) {
      ++it;
      continue;
    }
    for (int c : it->route.channels) {
      --m_channels[c].active;
      m_channels[c].bytes->add(it->t->bytes);
    }
    it->t->end_ps = now;
    it->t->done = true;
    it = m_moving.erase(it);
  }
}

void Fabric::run() {
  for (;;) {
    admit_ready();
    if (m_waiting.empty() && m_moving.empty()) {
      wait(m_submitted);
      continue;
    }
    share();
    const uint64_t start = now_ps();
    wait(sc_core::sc_time::from_value(next_event_ps()), m_submitted);
    advance(now_ps() - start);
  }
}

}  // namespace npusim
