#include "adapter/tf/plugin/launch_window.h"

namespace npusim::tf {

void window_records(rt::Device& dev, uint64_t origin_cycle, uint64_t end_cycle,
                    std::vector<rt::LaunchRecord>* launches, std::vector<rt::CopyRecord>* copies) {
  auto inside = [&](uint64_t t) { return t >= origin_cycle && (end_cycle == 0 || t < end_cycle); };
  for (rt::LaunchRecord& r : dev.launch_records())
    if (inside(r.start_cycle)) launches->push_back(std::move(r));
  if (copies)
    for (const rt::CopyRecord& c : dev.copy_records())
      if (inside(c.start_cycle)) copies->push_back(c);
}

}  // namespace npusim::tf
