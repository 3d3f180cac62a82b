#include "sim/sc_driver.h"

#include <cstdlib>
#include <string>

#include "common/error.h"
#include "sim/core/core_env.h"

namespace npusim::sc_driver {

using sc_core::sc_time;
using sc_core::sc_time_stamp;

namespace {

bool g_elaborated = false;  // SystemC elaborates once per process

// sc_start(args...), turning SystemC errors into npusim::Error.
template <typename... Args>
void start_checked(const Args&... args) {
  try {
    sc_core::sc_start(args...);
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("SystemC: ") + e.what());
  }
}

}  // namespace

void begin_elaboration() {
  if (g_elaborated)
    throw Error(
        "a Simulator was already constructed in this process; SystemC elaborates one "
        "chip per process (run another configuration in another process)");
  g_elaborated = true;
  setenv("SYSTEMC_DISABLE_COPYRIGHT_MESSAGE", "1", 0);
  try {
    // One AI-core cycle is 1 ns; 1 ps resolution keeps fractional cycles of shared bandwidth.
    sc_core::sc_set_time_resolution(1, sc_core::SC_PS);
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("cannot set the SystemC time resolution to 1 ps: ") + e.what());
  }
  if (sc_core::sc_get_time_resolution() != sc_time(1, sc_core::SC_PS))
    throw Error("the SystemC time resolution is not 1 ps");
}

void run_to_quiescence() { start_checked(); }

bool run_to_quiescence_or_limit() {
  const uint64_t now = time_ps(sc_time_stamp());
  if (now < kSimTimeLimitPs)
    start_checked(sc_time::from_value(kSimTimeLimitPs - now), sc_core::SC_EXIT_ON_STARVATION);
  return !sc_core::sc_pending_activity();
}

void run_for(const sc_time& t) { start_checked(t); }

void start_on_clock_edge() {
  if (const uint64_t phase_ps = time_ps(sc_time_stamp()) % kPsPerCycle; phase_ps != 0)
    start_checked(sc_time(static_cast<double>(kPsPerCycle - phase_ps), sc_core::SC_PS));
}

}  // namespace npusim::sc_driver
