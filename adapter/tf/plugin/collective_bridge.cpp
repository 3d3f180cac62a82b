#include "adapter/tf/plugin/collective_bridge.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "adapter/runtime/device.h"
#include "adapter/tf/plugin/kernel.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {
namespace {

// The collectives being formed: which call of its key each rank is at, and the groups some
// ranks have joined but not all.
struct GroupRegistry {
  std::mutex mutex;
  std::map<std::string, std::vector<uint64_t>> calls;  // group_key -> per rank: calls so far
  struct Forming {
    std::shared_ptr<rt::CollectiveGroup> group;
    int missing = 0;  // ranks yet to join
  };
  std::map<std::string, Forming> forming;  // "<group_key>#<call>#<tensor>" -> group
  std::map<int, rt::Stream> hccl_streams;  // chip -> its collective stream (hccl_stream)
};

GroupRegistry& registry() {
  static GroupRegistry* r = new GroupRegistry();  // never destroyed, like the devices
  return *r;
}

rt::Status collective_kind(const CollectiveSpec& spec, CollectiveCall* call) {
  return rt::guard("NpuCollective", [&] {
    call->kind = collective_from_name(spec.collective);
    if (call->kind != CollectiveKind::all_reduce && call->kind != CollectiveKind::broadcast)
      return rt::Status(rt::StatusCode::unsupported,
                        "collective '" + spec.collective +
                            "' is not available from TensorFlow (all_reduce, broadcast)");
    if (call->kind == CollectiveKind::all_reduce) call->op = reduce_op_from_name(spec.reduction);
    call->root = spec.root;
    return rt::ok_status();
  });
}

// The group of tensor `index` of this rank's `call`-th collective under the spec's key: created
// by the first rank to get there, forgotten once every rank has it.
std::shared_ptr<rt::CollectiveGroup> group_for(const CollectiveSpec& spec, uint64_t call_index,
                                               size_t index, const CollectiveCall& call) {
  GroupRegistry& reg = registry();
  const std::string key = fmt::format("{}#{}#{}", spec.group_key, call_index, index);
  GroupRegistry::Forming& f = reg.forming[key];  // (caller holds reg.mutex)
  if (!f.group) {
    f.group = std::make_shared<rt::CollectiveGroup>(call, spec.group_size,
                                                    fmt::format("{}#{}", spec.group_key, index));
    f.group->stream_errors = false;
    f.missing = spec.group_size;
  }
  std::shared_ptr<rt::CollectiveGroup> g = f.group;
  if (--f.missing == 0) reg.forming.erase(key);
  return g;
}

// The chip's stream for collectives, created on first use and kept for the process (as HCCL
// runs a communicator's tasks on a stream of their own). A rank's part must not sit on the
// stream TensorFlow runs the op on: until every rank has joined, it holds back what is queued
// behind it there, and that may be what another rank waits for (the copy to NPU:1 of a tensor
// chip 0 computed after queueing its part, which NPU:1's replica reads before its own part).
rt::Status hccl_stream(GroupRegistry& reg, rt::Device& device, rt::Stream* out) {
  const auto it = reg.hccl_streams.find(device.chip());  // (caller holds reg.mutex)
  if (it != reg.hccl_streams.end()) {
    *out = it->second;
    return rt::ok_status();
  }
  rt::Status st = device.create_stream(out);
  if (st.ok()) reg.hccl_streams[device.chip()] = *out;
  return st;
}

DenseUpdateStatus to_update_status(const rt::Status& st) {
  if (st.ok()) return {};
  return {tf_code(st.code()), st.message()};
}

}  // namespace

DenseUpdateStatus queue_collective(TF_OpKernelContext* tf_ctx, const CollectiveSpec& spec,
                                   const std::vector<CollectiveTensor>& tensors,
                                   std::function<void(DenseUpdateStatus)> done) {
  OpKernelContext ctx(tf_ctx);
  const std::string where =
      fmt::format("{} ({} rank {} of {}, group '{}')", ctx.op_name(), spec.collective, spec.rank,
                  spec.group_size, spec.group_key);
  rt::Status st = rt::guard(where, [&]() -> rt::Status {
    std::shared_ptr<rt::Device> device;
    rt::Stream stream;
    if (rt::Status s = ctx.npu_device(&device); !s.ok()) return s;
    if (rt::Status s = ctx.npu_stream(&stream); !s.ok()) return s;
    if (device->chips() < 2)
      return rt::Status(rt::StatusCode::failed_precondition,
                        "collectives need several NPUs, each a chip of one system "
                        "(npusim.configure(chips=N) or NPUSIM_CHIPS before the first op)");
    if (spec.group_size < 1 || spec.group_size > device->chips() || spec.rank < 0 ||
        spec.rank >= spec.group_size)
      return rt::Status(rt::StatusCode::invalid_argument,
                        fmt::format("rank {} of a group of {} on a system of {} chips", spec.rank,
                                    spec.group_size, device->chips()));
    CollectiveCall call;
    if (rt::Status s = collective_kind(spec, &call); !s.ok()) return s;
    std::vector<std::shared_ptr<rt::CollectiveGroup>> groups;
    rt::Stream hccl;
    {
      GroupRegistry& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mutex);
      if (rt::Status s = hccl_stream(reg, *device, &hccl); !s.ok()) return s;
      std::vector<uint64_t>& calls = reg.calls[spec.group_key];
      calls.resize(std::max(calls.size(), static_cast<size_t>(spec.group_size)), 0);
      const uint64_t call_index = calls[static_cast<size_t>(spec.rank)]++;
      for (size_t i = 0; i < (spec.fuse ? std::min<size_t>(tensors.size(), 1) : tensors.size());
           ++i) {
        auto dt = from_tf_dtype(tensors[i].dtype);
        if (!dt)
          return rt::Status(rt::StatusCode::invalid_argument,
                            "dtype " + tf_dtype_name(tensors[i].dtype) + " cannot live on the NPU");
        call.dtype = compiler::device_dtype(*dt);
        groups.push_back(group_for(spec, call_index, i, call));
        if (groups.back()->call.dtype != call.dtype)
          return rt::Status(
              rt::StatusCode::invalid_argument,
              fmt::format("tensor {} is {}, another rank's is {}", i, isa::dtype_name(call.dtype),
                          isa::dtype_name(groups.back()->call.dtype)));
      }
    }
    // The parts run once what TensorFlow queued on the op's stream before them (the inputs'
    // producers) has run; `done` comes after them, and only then may TensorFlow run the ops
    // that read the outputs, so nothing on the op's stream waits for the other ranks. The wait
    // orders execution only: in simulated time a collective starts when its input was written
    // (as GE's HCCL stream waits for the gradient's producer task), not when the chip has run
    // everything queued before the op, and the chip computes on while it runs (driver.h).
    if (rt::Status s = device->stream_wait_stream(hccl, stream, /*order_only=*/true); !s.ok())
      return s;
    auto elements = [](const CollectiveTensor& t) {
      uint64_t count = 1;
      for (int64_t d : t.shape) count *= static_cast<uint64_t>(d);
      return count;
    };
    if (spec.fuse && !tensors.empty()) {
      const uint64_t size = static_cast<uint64_t>(isa::dtype_size(groups[0]->call.dtype));
      std::vector<CollectivePiece> send, recv;
      uint64_t count = 0;
      for (const CollectiveTensor& t : tensors) {
        const uint64_t n = elements(t);
        if (n == 0) continue;
        send.push_back({t.input, n * size});
        recv.push_back({t.output, n * size});
        count += n;
      }
      if (send.empty()) {  // only empty tensors: one empty collective, as per tensor
        send.push_back({tensors[0].input, 0});
        recv.push_back({tensors[0].output, 0});
      }
      if (rt::Status s = device->collective_async(hccl, groups[0], spec.rank, std::move(send),
                                                  std::move(recv), count);
          !s.ok())
        return s;
    }
    for (size_t i = 0; !spec.fuse && i < tensors.size(); ++i) {
      if (rt::Status s = device->collective_async(hccl, groups[i], spec.rank, tensors[i].input,
                                                  tensors[i].output, elements(tensors[i]));
          !s.ok())
        return s;
    }
    // Behind the parts: hand the outcome to the op from a helper thread (the driver thread runs
    // this callback and must not run TensorFlow's continuation).
    return device->launch_callback(hccl, [groups, done, where]() {
      rt::Status result;
      for (const auto& g : groups)
        if (result.ok() && !g->status.ok()) result = g->status;
      if (!result.ok()) result = rt::Status(result.code(), where + ": " + result.message());
      std::thread([done, result] { done(to_update_status(result)); }).detach();
      return rt::ok_status();
    });
  });
  if (!st.ok() && st.message().rfind(where, 0) != 0)
    st = rt::Status(st.code(), where + ": " + st.message());
  return to_update_status(st);
}

}  // namespace npusim::tf
