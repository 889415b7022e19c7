#pragma once
// Datasets, as Gluon's: a Dataset has a size and an item(i), a sample (its
// input and its label); the DataLoader batches any of them. ArrayDataset
// holds its samples as the rows of two tensors in memory (Gluon's
// ArrayDataset), FunctionDataset makes each sample with a user's function
// (a file per sample, a generator). A loader's workers call item() from
// several threads at once, so it must be safe to call concurrently.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "../core/tensor.hpp"

namespace hybra::data {

// A sample: its input and its label.
using Sample = std::pair<Tensor, Tensor>;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  // Sample i, 0 <= i < size().
  virtual Sample item(std::size_t i) const = 0;
};

class ArrayDataset : public Dataset {
 public:
  // `data` and `labels` must have the same number of rows. They must be
  // contiguous: loaders copy whole rows out of them with memcpy.
  ArrayDataset(Tensor data, Tensor labels) : data_(std::move(data)), labels_(std::move(labels)) {
    require_rows("data", data_);
    require_rows("labels", labels_);
    if (data_.shape()[0] != labels_.shape()[0])
      fail<ShapeError>("ArrayDataset: data of shape ", to_string(data_.shape()), " has ", data_.shape()[0],
                       " samples but labels of shape ", to_string(labels_.shape()), " have ", labels_.shape()[0]);
  }

  std::size_t size() const override { return static_cast<std::size_t>(data_.shape()[0]); }
  // Row i of the data and of the labels, as views of them.
  Sample item(std::size_t i) const override {
    if (i >= size()) fail<ValueError>("ArrayDataset: sample ", i, " of ", size());
    return {row(data_, i), row(labels_, i)};
  }
  const Tensor& data() const { return data_; }
  const Tensor& labels() const { return labels_; }

 private:
  static void require_rows(const char* what, const Tensor& t) {
    if (!t.defined()) fail<ValueError>("ArrayDataset: ", what, " is an empty tensor (default-constructed or moved-from)");
    if (t.ndim() == 0) fail<ShapeError>("ArrayDataset: ", what, " is 0-d; samples are the rows of the first axis");
    if (!t.is_contiguous())
      fail<ValueError>("ArrayDataset: ", what, " of shape ", to_string(t.shape()),
                       " is a non-contiguous view; call contiguous() first");
  }
  static Tensor row(const Tensor& t, std::size_t i) {
    const Shape shape(t.shape().begin() + 1, t.shape().end());
    const Strides strides(t.strides().begin() + 1, t.strides().end());
    return t.view(shape, strides, t.offset() + static_cast<std::int64_t>(i) * t.strides()[0]);
  }

  Tensor data_;
  Tensor labels_;
};

// A dataset of `size` samples that `make(i)` makes when the loader asks.
class FunctionDataset : public Dataset {
 public:
  FunctionDataset(std::size_t size, std::function<Sample(std::size_t)> make) : size_(size), make_(std::move(make)) {
    if (!make_) fail<ValueError>("FunctionDataset: no function to make samples with");
  }
  std::size_t size() const override { return size_; }
  Sample item(std::size_t i) const override {
    if (i >= size_) fail<ValueError>("FunctionDataset: sample ", i, " of ", size_);
    return make_(i);
  }

 private:
  std::size_t size_;
  std::function<Sample(std::size_t)> make_;
};

}  // namespace hybra::data
