#pragma once
// Trainer, as Gluon's: applies an optimiser to a block's parameters after
// backward. With parameters on several devices (data parallelism), step()
// first sums each parameter's gradients over its copies (an allreduce over
// the device pool), so every copy takes the same update and the copies stay
// equal; across processes, a reducer (parallel/mpi.hpp) sums them further.
// With multi_precision (Gluon's option), a float16 or bfloat16 parameter is
// updated through a float32 master copy the trainer keeps (and saves with
// its states), so that updates smaller than the 16-bit float's resolution
// still add up; step(batch_size, scaler) is the mixed-precision step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/creation.hpp"
#include "../io/ndarray_list.hpp"
#include "../nn/parameter.hpp"
#include "../parallel/allreduce.hpp"
#include "clip.hpp"
#include "loss_scaler.hpp"
#include "lr_scheduler.hpp"
#include "optimizer.hpp"

namespace hybra {

class Trainer {
 public:
  // `optimizer` by name ("sgd", "adam") with Gluon's option names
  // ({"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 1e-4}, ...).
  // ({"multi_precision", 1}: float32 master weights for the 16-bit floats).
  Trainer(nn::ParameterDict params, std::string_view optimizer, std::map<std::string, double> options = {})
      : Trainer(std::move(params), optim::create(optimizer, without_multi_precision(options))) {
    multi_precision_ = options.contains("multi_precision") && options.at("multi_precision") != 0;
  }
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

  // The mixed-precision step: sums the gradients, and updates with the
  // loss scale divided out when they are all finite; otherwise skips the
  // update. Either way the scaler learns the outcome (optim/loss_scaler.hpp).
  // Returns whether the update ran.
  bool step(std::int64_t batch_size, optim::LossScaler& scaler) {
    allreduce_grads();
    std::vector<Tensor> one_copy;
    for (const auto& p : trained()) one_copy.push_back(p.list_grad().front());
    const double scale = scaler.loss_scale();
    if (!scaler.update(std::isfinite(optim::global_norm(one_copy)))) return false;
    update(batch_size, scale);
    return true;
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

  // The second half of step(): the update, with gradients already summed
  // (and multiplied by loss_scale, which is divided out).
  void update(std::int64_t batch_size, double loss_scale = 1) {
    if (batch_size <= 0) fail<ValueError>("Trainer::step: batch_size must be positive, not ", batch_size);
    optimizer_->set_rescale_grad(1.0 / (static_cast<double>(batch_size) * loss_scale));
    if (lr_scheduler_) optimizer_->set_learning_rate((*lr_scheduler_)(optimizer_->num_update() + 1));
    std::size_t index = 0;
    for (const auto& p : params_) {
      if (p.grad_req() == "null") continue;
      const auto& copies = p.list_data();
      const std::vector<Tensor> grads = p.list_grad();
      for (std::size_t k = 0; k < copies.size(); ++k, ++index) {
        Tensor weight = copies[k];
        if (!has_master(weight)) {
          optimizer_->update(index, weight, grads[k]);
          continue;
        }
        Tensor& master = master_weight(index, weight);
        optimizer_->update(index, master, grads[k].astype(DType::float32));
        weight.assign(master);
      }
    }
  }

  // What resuming needs besides the parameters' values (save_parameters):
  // the optimizer's name, each trained parameter's update count and state
  // tensors, the run's update count and the learning rate, in MXNet's
  // NDArray-list format, written atomically. A parameter's copies on several
  // devices are equal after every step, so one copy is saved. With a loss
  // scaler, its scale and counts too (load it with load_states(file, scaler)).
  void save_states(const std::filesystem::path& file) const { write_states(file, nullptr); }
  void save_states(const std::filesystem::path& file, const optim::LossScaler& scaler) const {
    write_states(file, &scaler);
  }

  // Loads a save_states() file: every copy of each trained parameter gets
  // the saved state on its own device (so a run saved on two GPUs resumes
  // on one CPU, or the reverse), and the next update continues the saved
  // run. The file must come from a trainer of the same optimizer over
  // parameters of the same shapes and dtypes, in the same order, saved with a
  // loss scaler exactly when one is given here: anything else is a ValueError
  // naming the file and the first difference, and leaves this trainer (and
  // the scaler) as they were.
  void load_states(const std::filesystem::path& file) { read_states(file, nullptr); }
  void load_states(const std::filesystem::path& file, optim::LossScaler& scaler) { read_states(file, &scaler); }

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
  void write_states(const std::filesystem::path& file, const optim::LossScaler* scaler) const {
    std::vector<std::pair<std::string, Tensor>> arrays;
    std::string names;
    std::vector<std::int64_t> counts;
    std::size_t index = 0;
    for (const auto& p : trained()) {
      names += p.name() + '\n';
      counts.push_back(optimizer_->update_count(index));
      const std::vector<Tensor> state = optimizer_->state(index);
      const std::vector<std::string> state_names = optimizer_->state_names();
      for (std::size_t s = 0; s < state.size(); ++s)
        arrays.emplace_back(hybra::detail::concat(counts.size() - 1, ':', state_names[s]), state[s]);
      if (auto m = masters_.find(index); m != masters_.end())
        arrays.emplace_back(hybra::detail::concat(counts.size() - 1, ":master"), m->second);
      index += p.list_data().size();
    }
    arrays.emplace_back("trainer:optimizer", text_tensor(optimizer_->name()));
    arrays.emplace_back("trainer:parameters", text_tensor(names));
    arrays.emplace_back("trainer:update_counts", array(counts, Shape{static_cast<std::int64_t>(counts.size())}));
    arrays.emplace_back("trainer:num_update", array(std::vector<std::int64_t>{optimizer_->num_update()}, Shape{1}));
    arrays.emplace_back("trainer:learning_rate", array(std::vector<double>{optimizer_->learning_rate()}, Shape{1}));
    if (scaler)
      arrays.emplace_back("scaler:state", array(std::vector<double>{scaler->loss_scale(),
                                                                    static_cast<double>(scaler->finite_steps()),
                                                                    static_cast<double>(scaler->skipped_steps())},
                                                Shape{3}));
    io::save_ndarray_list(file, arrays);
  }

  void read_states(const std::filesystem::path& file, optim::LossScaler* scaler) {
    const std::string where = "Trainer::load_states: file '" + file.string() + "'";
    std::map<std::string, Tensor> saved;
    for (auto& [key, t] : io::load_ndarray_list(file)) saved.emplace(key, std::move(t));
    const bool scaled = saved.contains("scaler:state");
    if (scaled != (scaler != nullptr))
      fail<ValueError>(where, scaled ? " was saved with a LossScaler: load it with load_states(file, scaler)"
                                     : " was saved without a LossScaler: load it with load_states(file)");
    const auto entry = [&](const std::string& key) -> const Tensor& {
      auto it = saved.find(key);
      if (it == saved.end()) fail<ValueError>(where, " has no '", key, "': it is not a Trainer::save_states file");
      return it->second;
    };
    const std::string optimizer = tensor_text(entry("trainer:optimizer"));
    if (optimizer != optimizer_->name())
      fail<ValueError>(where, " holds the state of optimizer ", optimizer, ", but this trainer's is ",
                       optimizer_->name());
    const std::vector<std::string> saved_names = split_lines(tensor_text(entry("trainer:parameters")));
    const std::vector<std::int64_t> counts = entry("trainer:update_counts").to_vector<std::int64_t>();
    const std::vector<std::int64_t> num_update = entry("trainer:num_update").to_vector<std::int64_t>();
    const std::vector<double> learning_rate = entry("trainer:learning_rate").to_vector<double>();
    const std::vector<nn::Parameter> params = trained();
    if (saved_names.size() != params.size() || counts.size() != params.size())
      fail<ValueError>(where, " holds the state of ", saved_names.size(), " trained parameters, but this trainer has ",
                       params.size());
    if (num_update.size() != 1 || learning_rate.size() != 1 || !std::isfinite(learning_rate[0]) ||
        learning_rate[0] < 0 || num_update[0] != (counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end())))
      fail<ValueError>(where, ": its num_update and learning_rate must be one value each, the rate finite and >= 0, "
                              "and num_update the most updates of any parameter");
    const std::vector<std::string> state_names = optimizer_->state_names();
    std::vector<std::vector<Tensor>> states(params.size());
    std::vector<Tensor> masters(params.size());
    std::size_t used = scaled ? 6 : 5;
    std::vector<double> scaler_state;
    if (scaled) {
      scaler_state = saved.at("scaler:state").to_vector<double>();
      if (scaler_state.size() != 3 || !scaler->valid_state(scaler_state[0], scaler_state[1], scaler_state[2]))
        fail<ValueError>(where, ": its scaler:state must be a scale within this scaler's bounds and two counts");
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (counts[k] < 0) fail<ValueError>(where, ": trained parameter ", k, " has a negative update count");
      if (counts[k] == 0) continue;
      const Tensor& weight = params[k].list_data().front();
      const Tensor like = has_master(weight) ? Tensor(weight.shape(), DType::float32, meta()) : weight;
      if (has_master(weight)) {
        const Tensor& m = entry(hybra::detail::concat(k, ":master"));
        if (m.shape() != weight.shape() || m.dtype() != DType::float32)
          fail<ValueError>(where, ": trained parameter ", k, " has a master weight of shape ", to_string(m.shape()),
                           ", ", hybra::name(m.dtype()), "; '", params[k].name(), "' needs ",
                           to_string(weight.shape()), ", float32");
        masters[k] = m;
        ++used;
      }
      for (const std::string& s : state_names) {
        const Tensor& t = entry(hybra::detail::concat(k, ':', s));
        if (t.shape() != like.shape() || t.dtype() != like.dtype())
          fail<ValueError>(where, ": trained parameter ", k, " was '", saved_names[k], "' with ", s, " of shape ",
                           to_string(t.shape()), ", ", hybra::name(t.dtype()), "; here it is '", params[k].name(),
                           "' of shape ", to_string(like.shape()), ", ", hybra::name(like.dtype()));
        states[k].push_back(t);
        ++used;
      }
    }
    if (used != saved.size())
      fail<ValueError>(where, " holds ", saved.size() - used, " entries that this trainer's ", optimizer_->name(),
                       " does not keep");
    masters_.clear();
    std::size_t index = 0;
    for (std::size_t k = 0; k < params.size(); ++k)
      for (const Tensor& copy : params[k].list_data()) {
        if (masters[k].defined()) masters_[index] = masters[k].to(copy.device()).copy();
        std::vector<Tensor> own;
        for (const Tensor& t : states[k]) {
          Tensor on_device(t.shape(), t.dtype(), copy.device());
          t.copy_to(on_device);
          own.push_back(on_device);
        }
        optimizer_->restore(index++, std::move(own), counts[k]);
      }
    optimizer_->set_learning_rate(learning_rate[0]);
    if (scaler) scaler->restore(scaler_state[0], static_cast<std::int64_t>(scaler_state[1]),
                                static_cast<std::int64_t>(scaler_state[2]));
  }

  // The parameters the updates reach, in update order.
  std::vector<nn::Parameter> trained() const {
    std::vector<nn::Parameter> out;
    for (const auto& p : params_)
      if (p.grad_req() != "null") out.push_back(p);
    return out;
  }
  static std::map<std::string, double> without_multi_precision(std::map<std::string, double> options) {
    options.erase("multi_precision");
    return options;
  }
  bool has_master(const Tensor& weight) const { return multi_precision_ && is_half(weight.dtype()); }
  // The float32 master of the update at `index`: the weight's value at the first update.
  Tensor& master_weight(std::size_t index, const Tensor& weight) {
    auto it = masters_.find(index);
    if (it == masters_.end()) it = masters_.emplace(index, weight.detach().astype(DType::float32)).first;
    return it->second;
  }

  static Tensor text_tensor(std::string_view text) {
    return array(std::vector<std::uint8_t>(text.begin(), text.end()), Shape{static_cast<std::int64_t>(text.size())});
  }
  static std::string tensor_text(const Tensor& t) {
    if (t.dtype() != DType::uint8 || t.shape().size() != 1)
      fail<ValueError>("Trainer::load_states: a text entry must be 1-d uint8, not ", to_string(t.shape()), " ",
                       hybra::name(t.dtype()));
    const std::vector<std::uint8_t> bytes = t.to_vector<std::uint8_t>();
    return std::string(bytes.begin(), bytes.end());
  }
  static std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    std::size_t start = 0;
    for (std::size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
      lines.push_back(text.substr(start, end - start));
    return lines;
  }

  nn::ParameterDict params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<const optim::LRScheduler> lr_scheduler_;
  std::function<void(Tensor&)> reduce_across_processes_;
  bool multi_precision_ = false;
  std::map<std::size_t, Tensor> masters_;  // by update index
};

}  // namespace hybra
