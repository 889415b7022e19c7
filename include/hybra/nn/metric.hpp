#pragma once
// Evaluation metrics, as Gluon's gluon.metric: a metric accumulates over the
// batches given to update(labels, preds) and get() reports its name and
// value so far; reset() starts over. Labels are class indices (N) of any
// dtype holding whole numbers; preds are scores or probabilities (N, C),
// on any device (the metric reads them on the host, which waits for them).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/tensor.hpp"

namespace hybra::nn {

class EvalMetric {
 public:
  virtual ~EvalMetric() = default;

  void update(const Tensor& labels, const Tensor& preds) {
    const Batch b = batch(labels, preds);
    for (std::int64_t i = 0; i < b.rows; ++i) add(b.scores.data() + i * b.classes, b.classes, b.labels[i]);
    count_ += b.rows;
  }
  // {name, value}; value is NaN before any update, as Gluon's.
  std::pair<std::string, double> get() const {
    return {name_, count_ ? total_ / static_cast<double>(count_) : std::numeric_limits<double>::quiet_NaN()};
  }
  void reset() { total_ = 0, count_ = 0; }
  const std::string& name() const { return name_; }

 protected:
  explicit EvalMetric(std::string name) : name_(std::move(name)) {}
  // Adds one sample's share of the total: its row of C scores and its label.
  virtual void add(const double* scores, std::int64_t classes, std::int64_t label) = 0;
  double total_ = 0;

 private:
  struct Batch {
    std::int64_t rows, classes;
    std::vector<double> scores;
    std::vector<std::int64_t> labels;
  };
  Batch batch(const Tensor& labels, const Tensor& preds) const {
    if (preds.ndim() != 2 || labels.ndim() != 1 || labels.shape()[0] != preds.shape()[0])
      fail<ShapeError>(name_, ": labels must be (N) and preds (N, C), not labels ", to_string(labels.shape()),
                       " and preds ", to_string(preds.shape()));
    Batch b{preds.shape()[0], preds.shape()[1], preds.to_vector<double>(), {}};
    const std::vector<double> given = labels.to_vector<double>();
    b.labels.reserve(given.size());
    for (std::size_t i = 0; i < given.size(); ++i) {
      const double l = given[i];
      if (!(l >= 0 && l < static_cast<double>(b.classes)) || l != std::floor(l))
        fail<ValueError>(name_, ": label ", l, " of sample ", i, " is not a class index in [0, ", b.classes, ")");
      b.labels.push_back(static_cast<std::int64_t>(l));
    }
    return b;
  }

  std::string name_;
  std::int64_t count_ = 0;
};

// The share of samples whose label has one of the k highest scores: fewer
// than k other classes score higher (a score equal to the label's does not;
// a NaN does, and a NaN score of the label is a miss). k = 1 is Accuracy.
class TopKAccuracy : public EvalMetric {
 public:
  explicit TopKAccuracy(std::int64_t k)
      : EvalMetric(k == 1 ? "accuracy" : hybra::detail::concat("top_k_accuracy_", k)), k_(k) {
    if (k < 1) fail<ValueError>("TopKAccuracy: k must be >= 1, not ", k);
  }

 private:
  void add(const double* scores, std::int64_t classes, std::int64_t label) override {
    const double mine = scores[label];
    if (std::isnan(mine)) return;
    std::int64_t higher = 0;
    for (std::int64_t c = 0; c < classes; ++c) higher += !(scores[c] <= mine);
    total_ += higher < k_;
  }
  std::int64_t k_;
};

class Accuracy final : public TopKAccuracy {
 public:
  Accuracy() : TopKAccuracy(1) {}
};

// The mean of -log(p + eps) of each sample's label's probability p.
class CrossEntropy final : public EvalMetric {
 public:
  explicit CrossEntropy(double eps = 1e-12) : EvalMetric("cross-entropy"), eps_(eps) {}

 private:
  void add(const double* probabilities, std::int64_t, std::int64_t label) override {
    total_ -= std::log(probabilities[label] + eps_);
  }
  double eps_;
};

}  // namespace hybra::nn
