// This thread's current tpu device (tpu_ext.cpp owns the state; docs/DEVICES.md).
#pragma once

#include <c10/core/Device.h>

namespace torch_tpu {

extern bool g_multi;               // several local devices driven by this one process
extern c10::DeviceIndex g_count;   // the process's devices (or the launcher's local world)
c10::DeviceIndex current_index();  // this thread's current device index
c10::Device own_device();          // ... as a device
extern bool g_other_devices;       // a device other than tpu:0 was made current (ever)

// The current device for a scope: an allocation on a given device, an op on its inputs'
// device (kernel.cpp). Only several devices per process switch it; -1 keeps it.
struct DeviceScope {
  explicit DeviceScope(c10::DeviceIndex d);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex prev_;
};

}  // namespace torch_tpu
