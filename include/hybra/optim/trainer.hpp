#pragma once
// Trainer, as Gluon's: applies an optimiser to a block's parameters after
// backward. With parameters on several devices (data parallelism), step()
// first sums each parameter's gradients over its copies (an allreduce over
// the device pool), so every copy takes the same update and the copies stay
// equal; across processes, a reducer (parallel/mpi.hpp) sums them further.
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../nn/parameter.hpp"
#include "../parallel/allreduce.hpp"
#include "clip.hpp"
#include "lr_scheduler.hpp"
#include "optimizer.hpp"

namespace hybra {

class Trainer {
 public:
  // `optimizer` by name ("sgd", "adam") with Gluon's option names
  // ({"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 1e-4}, ...).
  Trainer(nn::ParameterDict params, std::string_view optimizer, const std::map<std::string, double>& options = {})
      : Trainer(std::move(params), optim::create(optimizer, options)) {}
  Trainer(nn::ParameterDict params, std::unique_ptr<optim::Optimizer> optimizer)
      : params_(std::move(params)), optimizer_(std::move(optimizer)) {
    if (!optimizer_) fail<ValueError>("Trainer: no optimizer");
  }

  // Sums gradients over devices (and processes), then updates every copy of
  // every trained parameter with the gradient divided by batch_size: the
  // number of samples the gradients were summed over, across all devices
  // and processes.
  void step(std::int64_t batch_size) {
    allreduce_grads();
    update(batch_size);
  }

  // The first half of step(): for a caller who inspects or clips the summed gradients before updating.
  void allreduce_grads() {
    for (const auto& p : params_) {
      if (p.grad_req() == "null") continue;
      std::vector<Tensor> grads = p.list_grad();
      if (grads.size() > 1) allreduce(grads);
      if (reduce_across_processes_) {
        reduce_across_processes_(grads.front());
        for (std::size_t k = 1; k < grads.size(); ++k) grads.front().copy_to(grads[k]);
      }
    }
  }

  // Between the two halves: clips the summed gradients to a global norm of
  // at most max_norm (optim/clip.hpp), every device's copy by the same
  // factor, and returns their norm before. The copies are equal after
  // allreduce_grads(), so the norm counts each parameter once. A norm that
  // is not finite leaves them as they are: skip update() then.
  double clip_global_norm(double max_norm) {
    std::vector<Tensor> one_copy, every_copy;
    for (const auto& p : params_) {
      if (p.grad_req() == "null") continue;
      const std::vector<Tensor> grads = p.list_grad();
      one_copy.push_back(grads.front());
      every_copy.insert(every_copy.end(), grads.begin(), grads.end());
    }
    optim::detail::check_max_norm(max_norm);
    const double norm = optim::global_norm(one_copy);
    optim::scale_to_norm(every_copy, norm, max_norm);
    return norm;
  }

  // The second half of step(): the update, with gradients already summed.
  void update(std::int64_t batch_size) {
    if (batch_size <= 0) fail<ValueError>("Trainer::step: batch_size must be positive, not ", batch_size);
    optimizer_->set_rescale_grad(1.0 / static_cast<double>(batch_size));
    if (lr_scheduler_) optimizer_->set_learning_rate((*lr_scheduler_)(optimizer_->num_update() + 1));
    std::size_t index = 0;
    for (const auto& p : params_) {
      if (p.grad_req() == "null") continue;
      const auto& copies = p.list_data();
      const std::vector<Tensor> grads = p.list_grad();
      for (std::size_t k = 0; k < copies.size(); ++k, ++index) {
        Tensor weight = copies[k];
        optimizer_->update(index, weight, grads[k]);
      }
    }
  }

  // Sums a tensor in place over all processes (e.g. mpi::Communicator's
  // allreduce): set it and step() trains one model across processes.
  void set_process_reducer(std::function<void(Tensor&)> reduce) { reduce_across_processes_ = std::move(reduce); }

  // The rate of the last update (or of the next, before any).
  double learning_rate() const { return optimizer_->learning_rate(); }
  void set_learning_rate(double lr) {
    if (lr_scheduler_) fail<ValueError>("Trainer::set_learning_rate: a learning-rate scheduler sets it at each step");
    optimizer_->set_learning_rate(lr);
  }
  // Each update's learning rate from now on: scheduler(num_update), the
  // update's number counted over the whole run (optim/lr_scheduler.hpp);
  // nullptr goes back to a fixed rate.
  void set_lr_scheduler(std::shared_ptr<const optim::LRScheduler> scheduler) { lr_scheduler_ = std::move(scheduler); }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const nn::ParameterDict& params() const { return params_; }

 private:
  nn::ParameterDict params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<const optim::LRScheduler> lr_scheduler_;
  std::function<void(Tensor&)> reduce_across_processes_;
};

}  // namespace hybra
