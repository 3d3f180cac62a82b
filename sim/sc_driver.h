// Driving SystemC from outside the simulation, shared by Simulator (one chip) and
// SystemSimulator (several): the once-per-process elaboration guard and the sc_start() wrappers.
#pragma once

#include <cstdint>

#include <systemc>

namespace npusim::sc_driver {

inline constexpr uint64_t kPsPerCycle = 1000;  // one AI-core cycle is 1 ns of simulated time
inline uint64_t ceil_cycles(uint64_t ps) { return (ps + kPsPerCycle - 1) / kPsPerCycle; }

// Claims SystemC's one elaboration of this process and sets the time resolution to 1 ps.
// Throws npusim::Error if a simulator was already constructed in this process.
void begin_elaboration();
// sc_start() until nothing is left to do; SystemC errors become npusim::Error.
void run_to_quiescence();
// The same, but stops before kSimTimeLimitPs (sim/core/core_env.h): false if something was
// still to do then.
bool run_to_quiescence_or_limit();
// sc_start(t) for a fixed span of simulated time.
void run_for(const sc_core::sc_time& t);
// Every item of the device timeline (a launch, a host-link copy) starts on an AI-core clock
// edge: what is left of the cycle in which the item before it ended (ends are in ps, e.g. a
// copy's bytes over the link's bandwidth) passes first. So an item's timing never depends on
// the phase at which the timeline reached it, and the timeline's length (each item ceil(its
// duration) cycles) does not depend on the order in which TensorFlow issued independent ops.
void start_on_clock_edge();

}  // namespace npusim::sc_driver
