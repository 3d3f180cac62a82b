// PipeChannel: one on-chip buffer handed from a producer pipe to a consumer pipe and back, inside
// one core's section (the mix kernels: ops/attention.cpp, ops/quant_matmul.cpp). The producer
// waits until it is free, fills it and publishes it; the consumer takes it, uses it and releases
// it. It starts free (start(), issued once) and drain() consumes the last release before `end`,
// so a kernel ends with no flag set.
#pragma once

#include <string>

#include "adapter/compiler/kernel_builder.h"
#include "isa/isa.h"

namespace npusim::compiler::ops {

struct PipeChannel {
  isa::Pipe prod = isa::Pipe::S, cons = isa::Pipe::S;
  int full = -1, free = -1;
  PipeChannel() = default;
  PipeChannel(KernelBuilder& b, isa::Pipe p, isa::Pipe c, const std::string& what)
      : prod(p), cons(c), full(b.flag(p, c, what + " full")), free(b.flag(c, p, what + " free")) {}
  void start(KernelBuilder& b) const { b.set_flag(cons, prod, free, "buffer free"); }
  void acquire(KernelBuilder& b) const { b.wait_flag(cons, prod, free, "wait: buffer free"); }
  void publish(KernelBuilder& b) const { b.set_flag(prod, cons, full, "buffer filled"); }
  void take(KernelBuilder& b) const { b.wait_flag(prod, cons, full, "wait: buffer filled"); }
  void release(KernelBuilder& b) const { b.set_flag(cons, prod, free, "buffer released"); }
  void drain(KernelBuilder& b) const { acquire(b); }
};

}  // namespace npusim::compiler::ops
