#pragma once
// Fashion-MNIST (Zalando, https://github.com/zalandoresearch/fashion-mnist),
// as Gluon's gluon.data.vision.FashionMNIST: 60000 training and 10000 test
// images of clothing, 28x28 grey levels, each labelled with one of 10 classes.
// It reads the four gzip-compressed IDX files of the original distribution.
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "dataset.hpp"
#include "idx.hpp"

namespace hybra::data {

class FashionMNIST : public ArrayDataset {
 public:
  static constexpr std::int64_t image_side = 28;
  // The class names, by label.
  static constexpr std::array<std::string_view, 10> text_labels = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

  // The training set (train-*-ubyte.gz) or the test set (t10k-*-ubyte.gz)
  // from the directory `root`.
  explicit FashionMNIST(bool train = true, const std::filesystem::path& root = "/usr/share/datasets/fashion-mnist")
      : ArrayDataset(load(train, root)) {}

  // float32 (N, 1, 28, 28): the files' grey levels 0..255 scaled to [0, 1].
  const Tensor& images() const { return data(); }
  // labels(): int32 (N), 0 to 9, indexing text_labels.

 private:
  static ArrayDataset load(bool train, const std::filesystem::path& root) {
    const std::string set = train ? "train" : "t10k";
    const std::filesystem::path image_file = root / (set + "-images-idx3-ubyte.gz");
    const std::filesystem::path label_file = root / (set + "-labels-idx1-ubyte.gz");
    auto read = [&](const std::filesystem::path& file) {
      try {
        return read_idx(file);
      } catch (const io::FileError& e) {
        fail<io::FileError>("FashionMNIST: ", e.what(), " (the dataset is looked for in '", root.string(),
                            "'; pass the directory that holds its files as `root`)");
      }
    };
    const Tensor pixels = read(image_file), classes = read(label_file);

    auto fail_files = [&](auto&&... parts) {
      fail<io::FormatError>("FashionMNIST: images '", image_file.string(), "', labels '", label_file.string(),
                            "': ", parts...);
    };
    const Shape& image_shape = pixels.shape();
    if (pixels.dtype() != DType::uint8 || image_shape.size() != 3 || image_shape[1] != image_side ||
        image_shape[2] != image_side)
      fail_files("the images file holds a ", to_string(image_shape), ' ', name(pixels.dtype()),
                 " array, not (N, 28, 28) uint8");
    if (classes.dtype() != DType::uint8 || classes.ndim() != 1)
      fail_files("the labels file holds a ", to_string(classes.shape()), ' ', name(classes.dtype()),
                 " array, not (N,) uint8");
    const std::int64_t n = image_shape[0];
    if (classes.shape()[0] != n) fail_files(n, " images but ", classes.shape()[0], " labels");

    // Both were just parsed on this thread, so no op is writing them.
    const auto* label_bytes = static_cast<const std::uint8_t*>(classes.raw_data());
    Tensor labels(Shape{n}, DType::int32);
    auto* label_values = static_cast<std::int32_t*>(labels.raw_data());
    for (std::int64_t i = 0; i < n; ++i) {
      if (label_bytes[i] >= text_labels.size())
        fail_files("label ", i, " is ", int{label_bytes[i]}, "; Fashion-MNIST's classes are 0 to 9");
      label_values[i] = label_bytes[i];
    }
    const auto* grey = static_cast<const std::uint8_t*>(pixels.raw_data());
    Tensor images(Shape{n, 1, image_side, image_side}, DType::float32);
    auto* scaled = static_cast<float*>(images.raw_data());
    const std::int64_t values = images.size();
    for (std::int64_t i = 0; i < values; ++i) scaled[i] = static_cast<float>(grey[i]) / 255.0f;
    return {images, labels};
  }
};

}  // namespace hybra::data
