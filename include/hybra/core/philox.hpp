#pragma once
// The arithmetic of hybra's random numbers, in one place for both devices:
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3"), its words made uniform doubles, and the pair of values a uniform or
// normal draw makes of one counter block. core/random.hpp's Generator and
// the CPU's fills call it; NVRTC compiles it into the GPU's fills
// (kernels/random.cuh), so a GPU draws the numbers the CPU draws: the same
// uniforms, and normals that differ only by how the two math libraries
// round log, cos and sin (a few units in the last place).
//
// The conversions are written out rather than left to std:: distributions,
// whose results differ between standard libraries. NVRTC has no host
// standard library: there the device's math functions stand in for <cmath>.
#ifndef __CUDACC_RTC__
#include <cmath>
#endif
#include "macros.hpp"

namespace hybra::philox {

// The 4 random words of counter block `counter` under key (key0, key1).
struct Words {
  unsigned int w[4];
};

HYBRA_HD inline Words block(unsigned long long counter, unsigned int key0, unsigned int key1) {
  unsigned int c[4] = {static_cast<unsigned int>(counter), static_cast<unsigned int>(counter >> 32), 0, 0};
  for (int round = 0; round < 10; ++round) {
    const unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];
    const unsigned int next[4] = {static_cast<unsigned int>(p1 >> 32) ^ c[1] ^ key0, static_cast<unsigned int>(p1),
                                  static_cast<unsigned int>(p0 >> 32) ^ c[3] ^ key1, static_cast<unsigned int>(p0)};
    for (int i = 0; i < 4; ++i) c[i] = next[i];
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  return Words{{c[0], c[1], c[2], c[3]}};
}

// Uniform in [0, 1) from 53 random bits.
HYBRA_HD inline double to_double(unsigned int hi, unsigned int lo) {
  return static_cast<double>(((static_cast<unsigned long long>(hi) << 32) | lo) >> 11) * 0x1.0p-53;
}

// a + b x, each operation rounded on its own: a GPU compiler would otherwise
// fuse it into one multiply-add and round differently from the CPU.
HYBRA_HD inline double affine(double a, double b, double x) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, __dmul_rn(b, x));
#else
  return a + b * x;
#endif
}

#ifdef __CUDACC_RTC__
HYBRA_HD inline double square_root(double v) { return ::sqrt(v); }
HYBRA_HD inline double log_1p(double v) { return ::log1p(v); }
HYBRA_HD inline double cosine(double v) { return ::cos(v); }
HYBRA_HD inline double sine(double v) { return ::sin(v); }
HYBRA_HD inline float next_toward(float from, float to) { return ::nextafterf(from, to); }
HYBRA_HD inline double next_toward(double from, double to) { return ::nextafter(from, to); }
#else
HYBRA_HD inline double square_root(double v) { return std::sqrt(v); }
HYBRA_HD inline double log_1p(double v) { return std::log1p(v); }
HYBRA_HD inline double cosine(double v) { return std::cos(v); }
HYBRA_HD inline double sine(double v) { return std::sin(v); }
template <class T>
HYBRA_HD T next_toward(T from, T to) {
  return std::nextafter(from, to);
}
#endif

// A standard normal pair by Box-Muller from two uniforms in [0, 1).
HYBRA_HD inline void normal_pair(double u1, double u2, double& z0, double& z1) {
  const double r = square_root(-2.0 * log_1p(-u1));
  const double a = 2.0 * 3.141592653589793 * u2;
  z0 = r * cosine(a);
  z1 = r * sine(a);
}

// The two values of type T a draw makes of counter block `words`: uniform
// in [a, b) (normal: false), or normal of mean a and standard deviation b.
template <class T>
HYBRA_HD void draw_pair(bool normal, double a, double b, Words words, T& v0, T& v1) {
  const double u1 = to_double(words.w[0], words.w[1]), u2 = to_double(words.w[2], words.w[3]);
  if (normal) {
    double z0, z1;
    normal_pair(u1, u2, z0, z1);
    v0 = static_cast<T>(affine(a, b, z0));
    v1 = static_cast<T>(affine(a, b, z1));
  } else {
    // Clamped because rounding to T could otherwise produce b itself.
    const T top = next_toward(static_cast<T>(b), static_cast<T>(a));
    v0 = static_cast<T>(affine(a, b - a, u1));
    v1 = static_cast<T>(affine(a, b - a, u2));
    v0 = v0 < top ? v0 : top;
    v1 = v1 < top ? v1 : top;
  }
}

}  // namespace hybra::philox
