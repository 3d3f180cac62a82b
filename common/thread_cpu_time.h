// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), for host-side speed figures: unlike
// wall time it does not grow while a loaded host keeps the thread waiting for a core.
#pragma once

#include <time.h>

#include <cstdint>

namespace npusim {

// CPU time the calling thread has used since it started, in nanoseconds.
inline uint64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

}  // namespace npusim
