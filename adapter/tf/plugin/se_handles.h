// The plugin's definitions of the StreamExecutor C API's opaque handles (declared, not defined,
// by tensorflow/c/experimental/stream_executor/stream_executor.h): a stream or event is a
// runtime handle; a timer is two events. Kernels reach their stream through TF_GetStream.
#pragma once

#include "adapter/runtime/device.h"
#include "adapter/runtime/stream.h"
#include "tensorflow/c/experimental/stream_executor/stream_executor.h"

struct SP_Stream_st {
  npusim::rt::Stream stream;
  int chip = 0;  // the chip (NPU ordinal) whose device created it
};

struct SP_Event_st {
  npusim::rt::Event event;
};

// An interval timer: device time between two event records.
struct SP_Timer_st {
  npusim::rt::Device* device = nullptr;
  npusim::rt::Event start, stop;
};
