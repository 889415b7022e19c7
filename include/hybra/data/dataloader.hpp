#pragma once
// Batches of a dataset for training, as Gluon's DataLoader:
//
//   data::DataLoader loader(data::FashionMNIST(), 256, {.shuffle = true, .seed = 1});
//   for (auto& [X, y] : loader) { ... }  // one epoch; iterating again starts the next
//
// Each batch is a pair of fresh contiguous tensors: an ArrayDataset's rows
// copied out of its tensors, or any dataset's samples, each through the
// options' transform, stacked. Background threads (`workers`) make the next
// `prefetch` batches while the consumer computes on the current one. The
// dataset's tensors must not be written while an epoch is being iterated.
#include <algorithm>
#include <array>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "../core/random.hpp"
#include "dataset.hpp"
#include "transforms.hpp"

namespace hybra::data {

struct DataLoaderOptions {
  // Visit the samples in a new order every epoch, rather than in the dataset's.
  bool shuffle = false;
  // The shuffled order of epoch k depends on seed and k alone; so do the
  // random numbers of each sample's transform.
  std::uint64_t seed = 0;
  // Leave out an epoch's last batch when it has fewer than batch_size samples.
  bool drop_last = false;
  // How many batches the workers make ahead of the consumer; with 0 each
  // batch is made on the consumer's thread when the loop reaches it.
  std::size_t prefetch = 2;
  // Threads that make batches, each a whole batch, delivered in order; 0:
  // the consumer's thread, as prefetch 0.
  std::size_t workers = 1;
  // Applied to each sample's input before batching (Gluon's transform_first),
  // by the worker making the batch: transforms.hpp's, or a user's.
  Transform transform = {};
};

// A batch of inputs and their labels.
using Batch = std::pair<Tensor, Tensor>;

namespace detail {

// Fisher-Yates over Philox counter blocks (epoch << 32) + j under the key
// `seed`: the same order on every machine, a different one every epoch.
// Blocks of two epochs would overlap beyond 2^33 samples (the loader refuses
// to shuffle so many).
inline std::vector<std::int64_t> shuffled_order(std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), std::int64_t{0});
  const Generator generator(seed);
  std::array<std::uint32_t, 4> words{};
  for (std::size_t i = n, step = 0; i-- > 1; ++step) {
    if (step % 2 == 0) words = generator.block((epoch << 32) + step / 2);
    const std::uint64_t random = (std::uint64_t{words[2 * (step % 2)]} << 32) | words[2 * (step % 2) + 1];
    // Uniform in [0, i] up to a bias below (i + 1) / 2^64.
    std::swap(order[i], order[random % (i + 1)]);
  }
  return order;
}

// One epoch's batches: the dataset's samples in `order`, batch_size at a
// time. With prefetch > 0 and workers > 0, worker threads make them, each
// batch by one worker, at most `prefetch` ahead of the consumer, who takes
// them in order; the destructor stops the workers and joins them.
class EpochBatches {
 public:
  EpochBatches(std::shared_ptr<const Dataset> dataset, std::vector<std::int64_t> order, std::size_t batch_size,
               std::size_t batches, const DataLoaderOptions& options, std::uint64_t epoch)
      : dataset_(std::move(dataset)),
        rows_(dynamic_cast<const ArrayDataset*>(dataset_.get())),
        order_(std::move(order)),
        batch_size_(batch_size),
        batches_(batches),
        prefetch_(options.workers == 0 ? 0 : options.prefetch),
        transform_(options.transform),
        seed_(options.seed),
        epoch_(epoch) {
    if (prefetch_ == 0) return;
    const std::size_t workers = std::min(options.workers, batches_);
    for (std::size_t w = 0; w < workers; ++w) workers_.emplace_back([this] { produce(); });
  }
  EpochBatches(const EpochBatches&) = delete;
  EpochBatches& operator=(const EpochBatches&) = delete;
  ~EpochBatches() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (std::thread& w : workers_) w.join();
  }

  Batch& current() { return current_; }

  // Makes the next batch current; false once the epoch is over. A failure
  // while making a batch is thrown here, after the batches before it.
  bool advance() {
    if (taken_ == batches_) return false;
    if (prefetch_ == 0) {
      current_ = make(taken_++);
      return true;
    }
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ready_.contains(taken_) || failures_.contains(taken_); });
    if (const auto failed = failures_.find(taken_); failed != failures_.end()) std::rethrow_exception(failed->second);
    const auto made = ready_.find(taken_);
    current_ = std::move(made->second);
    ready_.erase(made);
    ++taken_;
    lock.unlock();
    changed_.notify_all();
    return true;
  }

 private:
  Batch make(std::size_t index) const {
    const std::size_t first = index * batch_size_;
    const std::span<const std::int64_t> rows(order_.data() + first, std::min(batch_size_, order_.size() - first));
    if (rows_ && !transform_) {
      // The dataset's tensors may be futures; rows are read only once they are computed.
      rows_->data().wait_to_read();
      rows_->labels().wait_to_read();
      return {gather(rows_->data(), rows), gather(rows_->labels(), rows)};
    }
    std::vector<Tensor> inputs, labels;
    for (const std::int64_t r : rows) {
      auto [input, label] = dataset_->item(static_cast<std::size_t>(r));
      for (const Tensor* t : {&input, &label}) {
        t->require("DataLoader");
        if (t->device().kind != DeviceKind::cpu)
          fail<DeviceError>("DataLoader: sample ", r, " lives on ", t->device(), "; datasets' samples must be on a CPU device");
      }
      if (transform_) {
        SampleRandom random(seed_, epoch_, static_cast<std::uint64_t>(r));
        input = transform_(detail::packed(input), random);
      }
      inputs.push_back(std::move(input));
      labels.push_back(std::move(label));
    }
    return {stack(inputs, rows, "input"), stack(labels, rows, "label")};
  }

  // The rows of `from` (contiguous, on a CPU) in a new batch.
  static Tensor gather(const Tensor& from, std::span<const std::int64_t> rows) {
    Shape shape = from.shape();
    const std::size_t row_bytes = static_cast<std::size_t>(from.size() / shape[0]) * size_of(from.dtype());
    shape[0] = static_cast<std::int64_t>(rows.size());
    Tensor batch(shape, from.dtype(), from.device());
    // A new tensor no op knows yet, as in the creation functions.
    const auto* source = static_cast<const char*>(from.raw_data());
    auto* target = static_cast<char*>(batch.raw_data());
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::memcpy(target + i * row_bytes, source + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
    return batch;
  }

  // Samples of one shape and dtype as the rows of a new batch.
  static Tensor stack(const std::vector<Tensor>& samples, std::span<const std::int64_t> rows, const char* what) {
    const Tensor& first = samples.front();
    Shape shape{static_cast<std::int64_t>(samples.size())};
    shape.insert(shape.end(), first.shape().begin(), first.shape().end());
    Tensor batch(shape, first.dtype());
    const std::size_t row_bytes = static_cast<std::size_t>(first.size()) * size_of(first.dtype());
    auto* target = static_cast<char*>(batch.raw_data());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (samples[i].shape() != first.shape() || samples[i].dtype() != first.dtype())
        fail<ShapeError>("DataLoader: the ", what, " of sample ", rows[i], " is ", to_string(samples[i].shape()), ' ',
                         name(samples[i].dtype()), ", that of sample ", rows[0], " in the same batch ",
                         to_string(first.shape()), ' ', name(first.dtype()), ": a batch stacks samples of one shape");
      const Tensor row = detail::packed(samples[i]);
      std::memcpy(target + i * row_bytes, row.raw_data(), row_bytes);
    }
    return batch;
  }

  // A worker: takes the next batch to make while fewer than `prefetch` wait
  // for the consumer, makes it, and hands it (or its failure) over.
  void produce() {
    for (;;) {
      std::size_t index;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || next_ == batches_ || next_ < taken_ + prefetch_; });
        if (stopping_ || next_ == batches_) return;
        index = next_++;
      }
      Batch batch;
      std::exception_ptr failure;
      try {
        batch = make(index);
      } catch (...) {
        failure = std::current_exception();
      }
      {
        const std::lock_guard lock(mutex_);
        if (failure) failures_.emplace(index, failure);
        else ready_.emplace(index, std::move(batch));
      }
      changed_.notify_all();
    }
  }

  const std::shared_ptr<const Dataset> dataset_;
  const ArrayDataset* const rows_;  // the dataset, where its samples are rows of two tensors
  const std::vector<std::int64_t> order_;
  const std::size_t batch_size_;
  const std::size_t batches_;
  const std::size_t prefetch_;
  const Transform transform_;
  const std::uint64_t seed_;
  const std::uint64_t epoch_;
  Batch current_;

  // Shared with the workers.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t taken_ = 0;  // batches the consumer has taken
  std::size_t next_ = 0;   // the next batch a worker makes
  std::map<std::size_t, Batch> ready_;
  std::map<std::size_t, std::exception_ptr> failures_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace detail

class DataLoader {
 public:
  // An input iterator over one epoch's batches. It owns the epoch's worker:
  // destroying it mid-epoch (a `break` out of the loop, an exception) stops
  // the worker, and it stays valid if the loader is destroyed first.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using reference = Batch&;
    using pointer = Batch*;

    Batch& operator*() const { return epoch_->current(); }
    Batch* operator->() const { return &epoch_->current(); }
    iterator& operator++() {
      if (!epoch_->advance()) epoch_.reset();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.epoch_ == nullptr; }

   private:
    friend class DataLoader;
    explicit iterator(std::unique_ptr<detail::EpochBatches> epoch) : epoch_(std::move(epoch)) { ++*this; }

    std::unique_ptr<detail::EpochBatches> epoch_;  // null at the end
  };

  DataLoader(ArrayDataset dataset, std::size_t batch_size, DataLoaderOptions options = {})
      : DataLoader(std::make_shared<const ArrayDataset>(std::move(dataset)), batch_size, std::move(options)) {}
  // Any dataset (FunctionDataset, a user's Dataset), kept by the loader.
  template <std::derived_from<Dataset> D>
  DataLoader(D dataset, std::size_t batch_size, DataLoaderOptions options = {})
      : DataLoader(std::make_shared<const D>(std::move(dataset)), batch_size, std::move(options)) {}
  // A dataset shared with its owner (one that cannot be copied).
  DataLoader(std::shared_ptr<const Dataset> dataset, std::size_t batch_size, DataLoaderOptions options = {})
      : dataset_(std::move(dataset)), batch_size_(batch_size), options_(std::move(options)) {
    if (!dataset_) fail<ValueError>("DataLoader: no dataset");
    if (batch_size_ == 0) fail<ValueError>("DataLoader: batch_size must be at least 1");
    if (const auto* rows = dynamic_cast<const ArrayDataset*>(dataset_.get()))
      for (const Tensor* t : {&rows->data(), &rows->labels()})
        if (t->device().kind != DeviceKind::cpu)
          fail<DeviceError>("DataLoader: the dataset lives on ", t->device(),
                            "; the loader copies rows on the host, so it must be on a CPU device");
    if (options_.shuffle && dataset_->size() > (std::size_t{1} << 33))
      fail<ValueError>("DataLoader: cannot shuffle ", dataset_->size(), " samples (at most 2^33)");
  }

  // Batches per epoch.
  std::size_t size() const {
    const std::size_t n = dataset_->size();
    return n / batch_size_ + (n % batch_size_ != 0 && !options_.drop_last ? 1 : 0);
  }
  std::size_t batch_size() const { return batch_size_; }
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // The epoch the next begin() starts: a resumed run's, so that its epochs
  // visit the samples in the orders of an uninterrupted run's.
  void set_next_epoch(std::uint64_t epoch) { next_epoch_ = epoch; }
  std::uint64_t next_epoch() const { return next_epoch_; }

  // Starts the next epoch (the first is epoch 0), also when the previous one
  // was left unfinished.
  iterator begin() {
    const std::uint64_t epoch = next_epoch_++;
    std::vector<std::int64_t> order;
    if (options_.shuffle) {
      order = detail::shuffled_order(dataset_->size(), options_.seed, epoch);
    } else {
      order.resize(dataset_->size());
      std::iota(order.begin(), order.end(), std::int64_t{0});
    }
    return iterator(std::make_unique<detail::EpochBatches>(dataset_, std::move(order), batch_size_, size(), options_, epoch));
  }
  std::default_sentinel_t end() const { return {}; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::size_t batch_size_;
  DataLoaderOptions options_;
  std::uint64_t next_epoch_ = 0;
};

}  // namespace hybra::data
