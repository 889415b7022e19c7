#pragma once
// A dataset held in memory, as Gluon's ArrayDataset(data, label): sample i is
// row i (along the first axis) of the inputs and of the labels.
#include <cstddef>
#include <utility>

#include "../core/tensor.hpp"

namespace hybra::data {

class ArrayDataset {
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

  std::size_t size() const { return static_cast<std::size_t>(data_.shape()[0]); }
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

  Tensor data_;
  Tensor labels_;
};

}  // namespace hybra::data
