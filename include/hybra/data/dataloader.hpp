#pragma once
// Batches of an in-memory dataset for training, as Gluon's DataLoader:
//
//   data::DataLoader loader(data::FashionMNIST(), 256, {.shuffle = true, .seed = 1});
//   for (auto& [X, y] : loader) { ... }  // one epoch; iterating again starts the next
//
// Each batch is a pair of fresh contiguous tensors whose rows are copied out
// of the dataset's. A background thread makes the next `prefetch` batches
// while the consumer computes on the current one. The dataset's tensors must
// not be written while an epoch is being iterated.
#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "../core/random.hpp"
#include "dataset.hpp"

namespace hybra::data {

struct DataLoaderOptions {
  // Visit the samples in a new order every epoch, rather than in the dataset's.
  bool shuffle = false;
  // The shuffled order of epoch k depends on seed and k alone.
  std::uint64_t seed = 0;
  // Leave out an epoch's last batch when it has fewer than batch_size samples.
  bool drop_last = false;
  // How many batches a background thread makes ahead of the consumer; with 0
  // each batch is made on the consumer's thread when the loop reaches it.
  std::size_t prefetch = 2;
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

// One epoch's batches: the dataset's rows in `order`, batch_size at a time.
// With prefetch > 0 a worker thread makes them into a queue holding at most
// `prefetch`; the destructor stops the worker and joins it.
class EpochBatches {
 public:
  EpochBatches(const ArrayDataset& dataset, std::vector<std::int64_t> order, std::size_t batch_size,
               std::size_t batches, std::size_t prefetch)
      : dataset_(dataset), order_(std::move(order)), batch_size_(batch_size), batches_(batches), prefetch_(prefetch) {
    if (prefetch_ == 0)
      wait_for_dataset();
    else if (batches_ > 0)
      worker_ = std::thread([this] { produce(); });
  }
  EpochBatches(const EpochBatches&) = delete;
  EpochBatches& operator=(const EpochBatches&) = delete;
  ~EpochBatches() {
    if (!worker_.joinable()) return;
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_one();
    worker_.join();
  }

  Batch& current() { return current_; }

  // Makes the next batch current; false once the epoch is over. A failure of
  // the worker is thrown here, after the batches made before it.
  bool advance() {
    if (taken_ == batches_) return false;
    if (prefetch_ == 0) {
      current_ = make(taken_++);
      return true;
    }
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty() || failure_; });
    if (ready_.empty()) std::rethrow_exception(failure_);
    current_ = std::move(ready_.front());
    ready_.pop_front();
    ++taken_;
    lock.unlock();
    changed_.notify_one();
    return true;
  }

 private:
  // The dataset's tensors may be futures; rows are read only once they are computed.
  void wait_for_dataset() const {
    dataset_.data().wait_to_read();
    dataset_.labels().wait_to_read();
  }

  Batch make(std::size_t index) const {
    const std::size_t first = index * batch_size_;
    const std::span<const std::int64_t> rows(order_.data() + first, std::min(batch_size_, order_.size() - first));
    return {gather(dataset_.data(), rows), gather(dataset_.labels(), rows)};
  }

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

  // The worker: one batch at a time, waiting while the queue is full.
  void produce() {
    try {
      wait_for_dataset();
      for (std::size_t index = 0; index < batches_; ++index) {
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [&] { return stopping_ || ready_.size() < prefetch_; });
          if (stopping_) return;
        }
        Batch batch = make(index);
        const std::lock_guard lock(mutex_);
        ready_.push_back(std::move(batch));
        changed_.notify_one();
      }
    } catch (...) {
      const std::lock_guard lock(mutex_);
      failure_ = std::current_exception();
      changed_.notify_one();
    }
  }

  const ArrayDataset dataset_;
  const std::vector<std::int64_t> order_;
  const std::size_t batch_size_;
  const std::size_t batches_;
  const std::size_t prefetch_;
  std::size_t taken_ = 0;
  Batch current_;

  // Shared with the worker. Only two threads wait on `changed_`, never both
  // at once (the consumer on an empty queue, the worker on a full one), so
  // notify_one always wakes the one that waits.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread worker_;
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
      : dataset_(std::move(dataset)), batch_size_(batch_size), options_(options) {
    if (batch_size_ == 0) fail<ValueError>("DataLoader: batch_size must be at least 1");
    for (const Tensor* t : {&dataset_.data(), &dataset_.labels()})
      if (t->device().kind != DeviceKind::cpu)
        fail<DeviceError>("DataLoader: the dataset lives on ", t->device(),
                          "; the loader copies rows on the host, so it must be on a CPU device");
    if (options_.shuffle && dataset_.size() > (std::size_t{1} << 33))
      fail<ValueError>("DataLoader: cannot shuffle ", dataset_.size(), " samples (at most 2^33)");
  }

  // Batches per epoch.
  std::size_t size() const {
    const std::size_t n = dataset_.size();
    return n / batch_size_ + (n % batch_size_ != 0 && !options_.drop_last ? 1 : 0);
  }
  std::size_t batch_size() const { return batch_size_; }
  const DataLoaderOptions& options() const { return options_; }
  const ArrayDataset& dataset() const { return dataset_; }

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
      order = detail::shuffled_order(dataset_.size(), options_.seed, epoch);
    } else {
      order.resize(dataset_.size());
      std::iota(order.begin(), order.end(), std::int64_t{0});
    }
    return iterator(
        std::make_unique<detail::EpochBatches>(dataset_, std::move(order), batch_size_, size(), options_.prefetch));
  }
  std::default_sentinel_t end() const { return {}; }

 private:
  ArrayDataset dataset_;
  std::size_t batch_size_;
  DataLoaderOptions options_;
  std::uint64_t next_epoch_ = 0;
};

}  // namespace hybra::data
