#pragma once
// The training program of the examples that train on Fashion-MNIST
// (train_lenet, train_resnet): D2L's "multi-GPU" and "concise multi-GPU"
// chapters on hybra's CPU devices, GPUs or a mix. A main() gives the model and
// its defaults; this runs the rest: the command line (PROGRAM --help lists
// it), data, Trainer over split_and_load, hybra::Progress's bar and learning
// curve, and training across processes under mpirun where the program links
// hybra::mpi.
//
// Each epoch prints a progress bar (samples/s, loss, time left), then a line
// of the epoch's loss, training and test accuracy, seconds, and the mean time
// of a training step after the first; the same columns go to the CSV file and
// the accuracies and loss to an SVG plot next to it, both rewritten after
// every epoch. --save writes the weights and the Trainer's state after every
// epoch (PREFIX.params, PREFIX.states); --resume reads them and runs the
// epochs after theirs up to --epochs, ending where the uninterrupted run
// would, with the earlier epochs' rows kept in the CSV.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <hybra/data.hpp>
#include <hybra/hybra.hpp>
#include <hybra/nn/loss.hpp>
#include <hybra/optim/progress.hpp>
#include <hybra/optim/sgd.hpp>
#include <hybra/optim/trainer.hpp>
#include <hybra/parallel/split.hpp>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>
#ifdef HYBRA_WITH_MPI
#include <hybra/parallel/mpi.hpp>
#endif

#include "command_line.hpp"

namespace example {

namespace nn = hybra::nn;
using hybra::Tensor;

struct Options {
  std::vector<hybra::Device> devices{hybra::cpu(0)};
  int epochs = 10;
  std::int64_t batch_size = 256;
  double lr = 0.1;
  bool hybridize = true;
  std::int64_t train_size = 0, test_size = 0;  // 0: the whole set
  std::string csv, svg;
  std::string data = "/usr/share/datasets/fashion-mnist";
  bool smoke = false;
  std::uint64_t seed = 7;     // the initial weights'; the data's order takes seed + 35
  std::string save, resume;   // file prefixes: PREFIX.params and PREFIX.states
};

// What a program trains and how: its name, what --help says of it, the
// defaults of its options, its --smoke run, and its own options, which its
// model builder reads from the parsed command line.
struct Program {
  std::string name, model, about;
  Options defaults;
  Options smoke;                 // the smoke run's devices, epochs, batch size, lr, train and test sizes
  double smoke_accuracy = 0.5;   // the test accuracy a smoke run must reach
  std::function<void(po::options_description&)> model_options;
};

// "cpu0,cuda1" as devices; a mistake is a command-line error.
inline std::vector<hybra::Device> device_list(const std::string& program, const std::string& list) {
  std::vector<hybra::Device> devices;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string d = list.substr(at, comma - at);
    const std::size_t digits = d.rfind("cpu", 0) == 0 ? 3 : d.rfind("cuda", 0) == 0 ? 4 : 0;
    if (digits == 0 || d.size() == digits || d.size() > digits + 2 ||
        d.find_first_not_of("0123456789", digits) != std::string::npos)
      bad_command_line(program, "device '" + d + "' is not cpuN or cudaN");
    const int id = std::stoi(d.substr(digits));
    devices.push_back(digits == 3 ? hybra::cpu(id) : hybra::cuda(id));
    at = comma + 1;
  }
  return devices;
}

// Devices as device_list reads them.
inline std::string device_text(const std::vector<hybra::Device>& devices) {
  std::string text;
  for (const auto& d : devices)
    text += (text.empty() ? "" : ",") + std::string(d.kind == hybra::DeviceKind::cuda ? "cuda" : "cpu") +
            std::to_string(d.id);
  return text;
}

inline std::string shortest(double v) {
  std::ostringstream text;
  text << v;
  return text.str();
}

// The options as the command line gives them: a value given wins, then the
// smoke run's where --smoke is given, then the program's default.
inline Options parse(const Program& p, int argc, char** argv, po::variables_map& given) {
  const Options& d = p.defaults;
  po::options_description training("training");
  training.add_options()
      ("devices", po::value<std::string>()->default_value(device_text(d.devices)),
       "where to train: cpu0,cpu1 | cuda0,cuda1 | a mix")
      ("epochs", po::value<int>()->default_value(d.epochs), "epochs to train")
      ("batch-size", po::value<std::int64_t>()->default_value(d.batch_size), "images in a step, over all devices")
      ("lr", po::value<double>()->default_value(d.lr, shortest(d.lr)), "SGD's learning rate (momentum 0.9)")
      ("hybridize", "train the hybridized network (the default)")
      ("no-hybridize", "train eagerly")
      ("train-size", po::value<std::int64_t>()->default_value(0), "train on the first N images (0: all 60000)")
      ("test-size", po::value<std::int64_t>()->default_value(0), "test on the first N images (0: all 10000)")
      ("seed", po::value<std::string>()->default_value(std::to_string(d.seed)),
       "the initial weights' seed (the data's order takes seed + 35)")
      ("save", po::value<std::string>(), "PREFIX: write PREFIX.params and PREFIX.states after every epoch")
      ("resume", po::value<std::string>(), "PREFIX: continue the run whose --save PREFIX wrote them")
      ("csv", po::value<std::string>(), "the learning curve's CSV file (default: PROGRAM.csv)")
      ("svg", po::value<std::string>(), "its plot (default: the CSV's name with .svg)")
      ("data", po::value<std::string>()->default_value(d.data), "Fashion-MNIST's directory")
      ("smoke", "a short run that must learn, as the test suite makes");
  po::options_description all;
  all.add(training);
  if (p.model_options) {
    po::options_description model("model");
    p.model_options(model);
    all.add(model);
  }
  given = command_line(argc, argv, p.about, all);

  Options o = d;
  o.smoke = given.count("smoke") > 0;
  auto chosen = [&](const char* name, auto given_value, auto smoke_value, auto& into) {
    into = o.smoke && given[name].defaulted() ? smoke_value : given_value;
  };
  auto positive = [&](const char* name, double v) {
    if (!(v > 0)) bad_command_line(p.name, std::string("--") + name + " takes a positive number, not " + shortest(v));
  };
  chosen("epochs", given["epochs"].as<int>(), p.smoke.epochs, o.epochs);
  chosen("batch-size", given["batch-size"].as<std::int64_t>(), p.smoke.batch_size, o.batch_size);
  chosen("lr", given["lr"].as<double>(), p.smoke.lr, o.lr);
  chosen("train-size", given["train-size"].as<std::int64_t>(), p.smoke.train_size, o.train_size);
  chosen("test-size", given["test-size"].as<std::int64_t>(), p.smoke.test_size, o.test_size);
  chosen("devices", device_list(p.name, given["devices"].as<std::string>()), p.smoke.devices, o.devices);
  positive("epochs", o.epochs);
  positive("batch-size", static_cast<double>(o.batch_size));
  positive("lr", o.lr);
  if (o.train_size < 0 || o.test_size < 0) bad_command_line(p.name, "--train-size and --test-size take N >= 0");
  if (given.count("hybridize") && given.count("no-hybridize"))
    bad_command_line(p.name, "--hybridize and --no-hybridize are both given");
  o.hybridize = !given.count("no-hybridize");
  const std::string seed = given["seed"].as<std::string>();
  if (seed.empty() || seed.find_first_not_of("0123456789") != std::string::npos || seed.size() > 19)
    bad_command_line(p.name, "--seed takes a whole number, not '" + seed + "'");
  o.seed = std::stoull(seed);
  if (given.count("save")) o.save = given["save"].as<std::string>();
  if (given.count("resume")) o.resume = given["resume"].as<std::string>();
  o.data = given["data"].as<std::string>();
  o.csv = given.count("csv") ? given["csv"].as<std::string>() : p.name + ".csv";
  o.svg = given.count("svg") ? given["svg"].as<std::string>()
                             : std::filesystem::path(o.csv).replace_extension(".svg").string();
  return o;
}

// The first n samples of a dataset.
inline hybra::data::ArrayDataset head(const hybra::data::ArrayDataset& d, std::int64_t n) {
  n = std::min<std::int64_t>(n, static_cast<std::int64_t>(d.size()));
  return {hybra::slice(d.data(), 0, 0, n).copy(), hybra::slice(d.labels(), 0, 0, n).copy()};
}

inline double accuracy(nn::HybridSequential& net, hybra::data::DataLoader& loader, const std::vector<hybra::Device>& devices) {
  std::vector<Tensor> correct;
  std::int64_t seen = 0;
  for (auto& [X, y] : loader) {
    auto xs = hybra::split_and_load(X, devices), ys = hybra::split_and_load(y, devices);
    for (std::size_t k = 0; k < xs.size(); ++k) {
      Tensor hits = hybra::sum(hybra::argmax(net(xs[k]), 1) == ys[k].astype(hybra::DType::int64));
      correct.push_back(hits);
    }
    seen += X.shape()[0];
  }
  double total = 0;
  for (const auto& c : correct) total += c.item<double>();
  return total / static_cast<double>(seen);
}

// This process's place among the processes training together (one, without MPI).
struct Processes {
#ifdef HYBRA_WITH_MPI
  hybra::mpi::Environment env;
  hybra::mpi::Communicator world;
  Processes(int& argc, char**& argv) : env(argc, argv) {}
  int rank() const { return world.rank(); }
  int size() const { return world.size(); }
  void sum(const Tensor& t) const { world.allreduce(t); }
#else
  Processes(int&, char**&) {}
  int rank() const { return 0; }
  int size() const { return 1; }
  void sum(const Tensor&) const {}
#endif
};

// Trains the model `build` makes (from the options and the parsed command
// line, which holds the program's own options) as the options say; returns
// main()'s status.
using Builder = std::function<nn::HybridSequential(const Options&, const po::variables_map&)>;
inline int train(int argc, char** argv, const Program& program, const Builder& build) try {
  Processes processes(argc, argv);
  po::variables_map given;
  const Options o = parse(program, argc, argv, given);
  const bool leader = processes.rank() == 0;
  hybra::data::FashionMNIST train_set(true, o.data), test_set(false, o.data);
  hybra::data::ArrayDataset train = train_set, test = test_set;
  if (o.train_size) train = head(train, o.train_size);
  if (o.test_size) test = head(test, o.test_size);
  hybra::data::DataLoader train_loader(train, static_cast<std::size_t>(o.batch_size),
                                       {.shuffle = true, .seed = o.seed + 35});
  hybra::data::DataLoader test_loader(test, 1000);

  hybra::seed(o.seed);
  nn::HybridSequential net = build(o, given);
  net.initialize(nn::init::Xavier(), o.devices);
  // Deferred shapes: one predict-mode call per device completes every
  // parameter, on every device, before a resumed run's values replace them.
  for (auto d : o.devices) net(hybra::zeros({1, 1, 28, 28}, hybra::DType::float32, d));
  if (!o.resume.empty()) net.load_parameters(o.resume + ".params");
  if (o.hybridize) net.hybridize();
  hybra::Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", o.lr}, {"momentum", 0.9}});
  if (processes.size() > 1) trainer.set_process_reducer([&processes](Tensor& g) { processes.sum(g); });
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  // A resumed run continues after the epochs its files hold, with the data
  // in the orders the uninterrupted run would have seen.
  int first_epoch = 1;
  if (!o.resume.empty()) {
    trainer.load_states(o.resume + ".states");
    const auto steps = static_cast<std::size_t>(trainer.optimizer().num_update());
    if (steps % train_loader.size() != 0)
      throw hybra::ValueError("--resume " + o.resume + ": its " + std::to_string(steps) + " steps are not whole epochs of " +
                              std::to_string(train_loader.size()) + " batches (another batch size or training set?)");
    first_epoch = static_cast<int>(steps / train_loader.size()) + 1;
    if (first_epoch > o.epochs)
      throw hybra::ValueError("--resume " + o.resume + " holds " + std::to_string(first_epoch - 1) +
                              " epochs already; --epochs " + std::to_string(o.epochs) + " leaves none to run");
    train_loader.set_next_epoch(static_cast<std::uint64_t>(first_epoch - 1));
  }

  if (leader) {
    std::printf("%s on Fashion-MNIST: %zu training / %zu test images, %s, batch %lld on", program.model.c_str(),
                train.size(), test.size(), o.hybridize ? "hybridized" : "eager", static_cast<long long>(o.batch_size));
    for (auto d : o.devices) std::cout << ' ' << d;
    if (processes.size() > 1) std::printf(" in each of %d processes", processes.size());
    std::printf(", lr %g", o.lr);
    if (first_epoch > 1) std::printf(", resumed after epoch %d of %s", first_epoch - 1, o.resume.c_str());
    std::printf("\n");
  }
  hybra::Progress progress({.epochs = o.epochs, .batches = train_loader.size(),
                            .columns = {{"loss"}, {"train_acc"}, {"test_acc"}, {"seconds", false}, {"step_ms", false}},
                            .csv = leader ? o.csv : "", .svg = leader ? o.svg : "", .first_epoch = first_epoch,
                            .out = leader ? stdout : nullptr});
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    progress.begin_epoch(epoch);
    std::vector<Tensor> loss_sums, hit_sums;
    std::vector<std::size_t> step_losses;  // where each step's losses start in loss_sums
    std::int64_t samples = 0, local_samples = 0;
    std::size_t batch = 0;
    // Over this process's devices, then, at the end of the epoch, over the
    // processes: the progress bar is the leader's alone, and a collective
    // that only the leader joined would never return.
    auto total = [&](const std::vector<Tensor>& parts, bool all_processes) {
      Tensor s = hybra::zeros({}, hybra::DType::float64);
      for (const auto& t : parts) s = s + t.to(hybra::cpu(0)).astype(hybra::DType::float64);
      if (all_processes) processes.sum(s);
      return s.item<double>();
    };
    auto report = [&](bool last) {
      const double loss = total(loss_sums, last) / static_cast<double>(last ? samples : local_samples);
      if (std::isnan(loss))
        throw hybra::ValueError("training diverged: the loss is NaN in epoch " + std::to_string(epoch) + " (batch " +
                                std::to_string(batch) + "); lower the learning rate (--lr)");
      progress.update(batch, samples, loss);
      return loss;
    };
    // The steps' pace: from the end of the first step (which captures and
    // compiles, hybridized) to the end of the last, waited for. Each step is
    // pushed while the ones before it run, so a step's own time is not seen.
    std::chrono::steady_clock::time_point after_first;
    for (auto& [batch_X, batch_y] : train_loader) {
      // At most one step ahead of the engine: each step pushed holds its
      // activations until it runs, so an unbounded lead held the whole
      // epoch's (7 GB for 32 steps of the book's ResNet-18 at batch 64).
      if (batch >= 2) loss_sums[step_losses[batch - 2]].wait_to_read();
      // This process's share of the batch (all of it without MPI).
      const std::int64_t rows = batch_X.shape()[0], from = rows * processes.rank() / processes.size(),
                         to = rows * (processes.rank() + 1) / processes.size();
      const Tensor X = hybra::slice(batch_X, 0, from, to), y = hybra::slice(batch_y, 0, from, to);
      auto xs = hybra::split_and_load(X, o.devices), ys = hybra::split_and_load(y, o.devices);
      std::vector<Tensor> losses, outs;
      {
        hybra::autograd::record rec;
        for (std::size_t k = 0; k < xs.size(); ++k) {
          outs.push_back(net(xs[k]));
          losses.push_back(loss_fn(outs.back(), ys[k]));
        }
      }
      for (auto& l : losses) l.backward();
      trainer.step(rows);
      step_losses.push_back(loss_sums.size());
      for (std::size_t k = 0; k < xs.size(); ++k) {
        loss_sums.push_back(hybra::sum(losses[k]));
        hit_sums.push_back(hybra::sum(hybra::argmax(outs[k], 1) == ys[k].astype(hybra::DType::int64)));
      }
      samples += rows;
      local_samples += X.shape()[0];
      ++batch;
      if (batch == 1) {
        hybra::waitall();
        after_first = std::chrono::steady_clock::now();
      }
      if (progress.redraws() && batch % 20 == 0 && batch < train_loader.size()) report(false);
    }
    hybra::waitall();
    const double step_ms = batch > 1 ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                               after_first).count() /
                                           static_cast<double>(batch - 1)
                                     : 0;
    const double loss = report(true);
    const double train_acc = total(hit_sums, true) / static_cast<double>(samples);
    // Each process has the same weights, so each measures the whole test set; one prints it.
    const double epoch_seconds = progress.epoch_seconds();
    const double test_acc = accuracy(net, test_loader, o.devices);
    progress.end_epoch({loss, train_acc, test_acc, epoch_seconds, step_ms});
    if (leader && !o.save.empty()) {
      net.save_parameters(o.save + ".params");
      trainer.save_states(o.save + ".states");
    }
  }

  if (!leader) return 0;
  std::printf("learning curve: %s, %s\n", o.csv.c_str(), o.svg.c_str());
  const double test_acc = progress.curve().back().values[2];
  if (o.smoke && test_acc < program.smoke_accuracy) {
    std::fprintf(stderr, "%s: test accuracy %.3f after the smoke run: it did not learn (at least %.2f expected)\n",
                 program.name.c_str(), test_acc, program.smoke_accuracy);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", program.name.c_str(), e.what());
  return 1;
}

}  // namespace example
