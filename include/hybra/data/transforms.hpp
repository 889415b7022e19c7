#pragma once
// Transforms of one sample's input, as Gluon's vision transforms, which a
// DataLoader's workers run on each sample before batching it
// (DataLoaderOptions::transform). Each is a function of the input and the
// sample's random numbers: SampleRandom draws from Philox blocks set by the
// loader's seed, the epoch and the sample's index, so that a sample is
// cropped and flipped the same whatever the number of workers and whichever
// worker makes it. Inputs are images laid out (channels, height, width) and,
// for ToTensor, (height, width, channels); they run on the host, on the
// worker's thread.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/random.hpp"
#include "../core/tensor.hpp"

namespace hybra::data {

// The random numbers of one sample in one epoch: up to 512 draws from its
// own 256 counter blocks (samples below 2^32 per epoch), so no two samples or
// epochs share one; a transform that draws more is an error, not a repeat.
class SampleRandom {
 public:
  SampleRandom(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample)
      : generator_(seed), first_((epoch << 40) + sample * blocks_per_sample) {}

  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n).
  std::int64_t below(std::int64_t n) { return n <= 1 ? 0 : static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t next() {
    if (used_ == 2 * blocks_per_sample)
      fail<ValueError>("SampleRandom: a sample's transforms drew more than ", 2 * blocks_per_sample, " numbers");
    if (used_ % 2 == 0) words_ = generator_.block(first_ + used_ / 2);
    const std::size_t k = 2 * (used_++ % 2);
    return (std::uint64_t{words_[k]} << 32) | words_[k + 1];
  }

  static constexpr std::uint64_t blocks_per_sample = 256;
  Generator generator_;
  std::uint64_t first_;
  std::uint64_t used_ = 0;
  std::array<std::uint32_t, 4> words_{};
};

using Transform = std::function<Tensor(const Tensor& input, SampleRandom& random)>;

namespace detail {

// t's values, row-major, in a contiguous tensor of its own on t's device
// (t itself when it is contiguous); waits for t.
inline Tensor packed(const Tensor& t) {
  t.wait_to_read();
  if (t.is_contiguous()) return t;
  Tensor out(t.shape(), t.dtype(), t.device());
  const std::size_t width = size_of(t.dtype());
  const auto* from = static_cast<const char*>(t.raw_data());
  auto* to = static_cast<char*>(out.raw_data());
  for_each_offset(t.shape(), t.strides(), [&](std::int64_t at) {
    std::memcpy(to, from + at * static_cast<std::int64_t>(width), width);
    to += width;
  });
  return out;
}

// The (channels, height, width) of an image transform's input.
inline std::array<std::int64_t, 3> image_chw(const Tensor& t, const std::string& transform) {
  if (t.ndim() != 3)
    fail<ShapeError>(transform, ": input of shape ", to_string(t.shape()), " is not an image (channels, height, width)");
  return {t.shape()[0], t.shape()[1], t.shape()[2]};
}

}  // namespace detail

namespace transforms {

// Each transform in order.
inline Transform Compose(std::vector<Transform> steps) {
  return [steps = std::move(steps)](const Tensor& input, SampleRandom& random) {
    Tensor x = input;
    for (const Transform& step : steps) x = step(x, random);
    return x;
  };
}

// (height, width, channels) uint8 to (channels, height, width) float32 in
// [0, 1], as Gluon's ToTensor.
inline Transform ToTensor() {
  return [](const Tensor& input, SampleRandom&) {
    if (input.ndim() != 3 || input.dtype() != DType::uint8)
      fail<ShapeError>("ToTensor: input ", to_string(input.shape()), ' ', name(input.dtype()),
                       " is not an image of uint8 (height, width, channels)");
    const Tensor x = detail::packed(input);
    const std::int64_t h = x.shape()[0], w = x.shape()[1], c = x.shape()[2];
    Tensor out({c, h, w}, DType::float32);
    const auto* from = static_cast<const std::uint8_t*>(x.raw_data());
    auto* to = static_cast<float*>(out.raw_data());
    for (std::int64_t p = 0; p < h * w; ++p)
      for (std::int64_t k = 0; k < c; ++k) to[k * h * w + p] = static_cast<float>(from[p * c + k]) / 255.0f;
    return out;
  };
}

// (x - mean[c]) / std[c] for each channel c of a float image, as Gluon's
// Normalize; one mean and std serve every channel.
inline Transform Normalize(std::vector<double> mean, std::vector<double> stddev) {
  if (mean.empty() || mean.size() != stddev.size())
    fail<ValueError>("Normalize: ", mean.size(), " means and ", stddev.size(),
                     " standard deviations (one of each per channel, or one of each for all)");
  for (double s : stddev)
    if (!(s > 0)) fail<ValueError>("Normalize: a standard deviation of ", s, " (each must be positive)");
  return [mean = std::move(mean), stddev = std::move(stddev)](const Tensor& input, SampleRandom&) {
    const std::array<std::int64_t, 3> chw = detail::image_chw(input, "Normalize");
    const std::int64_t c = chw[0], h = chw[1], w = chw[2];
    if (mean.size() != 1 && static_cast<std::int64_t>(mean.size()) != c)
      fail<ShapeError>("Normalize: ", mean.size(), " means for an image of ", c, " channels");
    if (!is_floating(input.dtype()))
      fail<DTypeError>("Normalize: input of dtype ", name(input.dtype()), " (ToTensor makes a float image)");
    const Tensor x = detail::packed(input);
    Tensor out(x.shape(), x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) {
        const auto* from = static_cast<const T*>(x.raw_data());
        auto* to = static_cast<T*>(out.raw_data());
        for (std::int64_t k = 0; k < c; ++k) {
          const std::size_t j = mean.size() == 1 ? 0 : static_cast<std::size_t>(k);
          const T m = static_cast<T>(mean[j]), s = static_cast<T>(stddev[j]);
          for (std::int64_t p = 0; p < h * w; ++p) to[k * h * w + p] = (from[k * h * w + p] - m) / s;
        }
      }
    });
    return out;
  };
}

// The image mirrored left to right with probability 1/2, as Gluon's RandomFlipLeftRight.
inline Transform RandomFlipLeftRight() {
  return [](const Tensor& input, SampleRandom& random) {
    const auto [c, h, w] = detail::image_chw(input, "RandomFlipLeftRight");
    if (random.uniform() >= 0.5) return input;
    const Tensor x = detail::packed(input);
    Tensor out(x.shape(), x.dtype());
    const std::size_t width = size_of(x.dtype());
    const auto* from = static_cast<const char*>(x.raw_data());
    auto* to = static_cast<char*>(out.raw_data());
    for (std::int64_t row = 0; row < c * h; ++row)
      for (std::int64_t j = 0; j < w; ++j)
        std::memcpy(to + static_cast<std::size_t>(row * w + j) * width,
                    from + static_cast<std::size_t>(row * w + (w - 1 - j)) * width, width);
    return out;
  };
}

// A (height, width) window at a random place of the image padded with
// `padding` zeros on every side (the CIFAR recipe: 32x32 crops of a
// 4-padded 32x32 image), as Gluon's RandomCrop.
inline Transform RandomCrop(std::int64_t height, std::int64_t width, std::int64_t padding = 0) {
  if (height <= 0 || width <= 0 || padding < 0)
    fail<ValueError>("RandomCrop: size ", height, "x", width, " and padding ", padding,
                     " (the size must be positive, the padding at least 0)");
  return [height, width, padding](const Tensor& input, SampleRandom& random) {
    const auto [c, h, w] = detail::image_chw(input, "RandomCrop");
    if (h + 2 * padding < height || w + 2 * padding < width)
      fail<ShapeError>("RandomCrop: a ", height, "x", width, " window does not fit an image of ", h, "x", w,
                       " padded by ", padding);
    const std::int64_t top = random.below(h + 2 * padding - height + 1) - padding,
                       left = random.below(w + 2 * padding - width + 1) - padding;
    const Tensor x = detail::packed(input);
    Tensor out({c, height, width}, x.dtype());
    const std::size_t bytes = size_of(x.dtype());
    const auto* from = static_cast<const char*>(x.raw_data());
    auto* to = static_cast<char*>(out.raw_data());
    std::memset(to, 0, static_cast<std::size_t>(c * height * width) * bytes);
    for (std::int64_t k = 0; k < c; ++k)
      for (std::int64_t i = 0; i < height; ++i) {
        const std::int64_t y = top + i;
        if (y < 0 || y >= h) continue;
        const std::int64_t first = std::max<std::int64_t>(0, -left), last = std::min(width, w - left);
        if (first >= last) continue;
        std::memcpy(to + static_cast<std::size_t>((k * height + i) * width + first) * bytes,
                    from + static_cast<std::size_t>((k * h + y) * w + left + first) * bytes,
                    static_cast<std::size_t>(last - first) * bytes);
      }
    return out;
  };
}

}  // namespace transforms

}  // namespace hybra::data
