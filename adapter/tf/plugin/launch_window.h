// A window of the device timeline: the runtime's launch and copy records that fall in it, for
// the reports (python_hooks.cpp) and TensorFlow's profiler (tf_profiler.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "adapter/runtime/device.h"

namespace npusim::tf {

// The launches and copies (copies may be null) that started in [origin_cycle, end_cycle) on the
// device timeline (end_cycle 0: no end), in record order.
void window_records(rt::Device& dev, uint64_t origin_cycle, uint64_t end_cycle,
                    std::vector<rt::LaunchRecord>* launches, std::vector<rt::CopyRecord>* copies);

}  // namespace npusim::tf
