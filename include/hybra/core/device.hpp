#pragma once
#include <compare>
#include <ostream>
#include <vector>

#include "../backend/cuda/driver.hpp"

namespace hybra {

enum class DeviceKind : unsigned char { cpu, cuda, meta };

// A device tag. cpu(i) names a logical CPU device: all share the host's
// memory, and each has its own queue in the engine, so independent work on
// cpu(0) and cpu(1) runs side by side (engine/). cuda(i) is a GPU.
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int id = 0;
  // == spelled out: nvcc's front end drops the one a defaulted <=> implies.
  friend constexpr bool operator==(const Device&, const Device&) = default;
  friend constexpr auto operator<=>(const Device&, const Device&) = default;
};

constexpr Device cpu(int id = 0) { return {DeviceKind::cpu, id}; }
constexpr Device cuda(int id = 0) { return {DeviceKind::cuda, id}; }
constexpr Device meta() { return {DeviceKind::meta, 0}; }

// The logical CPU devices that may be named: cpu(0) .. cpu(max_cpu_devices - 1).
inline constexpr int max_cpu_devices = 64;
// The GPUs a process can use: cuda(0) .. cuda(max_gpu_devices - 1), of those the driver sees.
inline constexpr int max_gpu_devices = 16;

// The devices that exist: cpu(0), standing for the host (which any cpu(i)
// shares), then each GPU the CUDA driver sees (none without a driver:
// backend::cuda::driver_status() says why).
inline std::vector<Device> devices() {
  std::vector<Device> all{cpu(0)};
  for (int i = 0; i < static_cast<int>(backend::cuda::driver_status().gpus.size()); ++i) all.push_back(cuda(i));
  return all;
}

inline std::ostream& operator<<(std::ostream& os, Device d) {
  if (d.kind == DeviceKind::meta) return os << "meta";
  return os << (d.kind == DeviceKind::cpu ? "cpu(" : "cuda(") << d.id << ')';
}

}  // namespace hybra
