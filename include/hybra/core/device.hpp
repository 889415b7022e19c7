#pragma once
#include <compare>
#include <ostream>

namespace hybra {

enum class DeviceKind : unsigned char { cpu, cuda };

// A device tag: cpu(i) now; cuda(i) is reserved for the CUDA backend.
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int id = 0;
  friend constexpr auto operator<=>(const Device&, const Device&) = default;
};

constexpr Device cpu(int id = 0) { return {DeviceKind::cpu, id}; }
constexpr Device cuda(int id = 0) { return {DeviceKind::cuda, id}; }

inline std::ostream& operator<<(std::ostream& os, Device d) {
  return os << (d.kind == DeviceKind::cpu ? "cpu(" : "cuda(") << d.id << ')';
}

}  // namespace hybra
