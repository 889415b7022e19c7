// Data-parallel training across processes: each of the ranks trains on its
// share of every batch, the Trainer sums gradients over the processes
// (mpi::Communicator::allreduce), and after several steps every rank's
// weights equal those of one process that trained on the whole batches.
#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <hybra/parallel/mpi.hpp>

using namespace hybra;

namespace {

std::shared_ptr<nn::HybridSequential> make_net() {
  auto net = std::make_shared<nn::HybridSequential>();
  net->add(nn::Dense(16, "relu", 6), nn::Dense(4, "", 16));
  seed(11);
  net->initialize(nn::init::Xavier());
  return net;
}

// Steps of SGD with momentum over `batches`, on this process's rows [from, to) of each.
void train(nn::HybridSequential& net, Trainer& trainer, const std::vector<std::pair<Tensor, Tensor>>& batches,
           std::int64_t from, std::int64_t to) {
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  for (const auto& [X, y] : batches) {
    {
      autograd::record rec;
      Tensor loss = loss_fn(net(slice(X, 0, from, to)), slice(y, 0, from, to));
      loss.backward();
    }
    trainer.step(X.shape()[0]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(argc, argv);
  mpi::Communicator world;
  const std::int64_t batch = 12;
  if (batch % world.size() != 0) {
    std::fprintf(stderr, "test_mpi_training: run with a number of processes that divides %lld\n", static_cast<long long>(batch));
    return 1;
  }
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int b = 0; b < 4; ++b) {
    Generator gen(100 + static_cast<std::uint64_t>(b));
    batches.emplace_back(random_normal({batch, 6}, 0, 1, DType::float32, cpu(), gen),
                         random_uniform({batch}, 0, 4, DType::float32, cpu(), gen).astype(DType::int32));
  }
  const std::map<std::string, double> sgd{{"learning_rate", 0.5}, {"momentum", 0.9}};

  auto whole = make_net();
  whole->hybridize();
  Trainer alone(whole->collect_params(), "sgd", sgd);
  train(*whole, alone, batches, 0, batch);

  auto shard = make_net();
  shard->hybridize();
  Trainer together(shard->collect_params(), "sgd", sgd);
  together.set_process_reducer([&world](Tensor& g) { world.allreduce(g); });
  const std::int64_t per_rank = batch / world.size();
  train(*shard, together, batches, world.rank() * per_rank, (world.rank() + 1) * per_rank);

  double worst = 0;
  const auto a = whole->structured_params(), b = shard->structured_params();
  for (std::size_t k = 0; k < a.size(); ++k) {
    const auto u = a[k].second.data().to_vector<double>(), v = b[k].second.data().to_vector<double>();
    for (std::size_t i = 0; i < u.size(); ++i) worst = std::max(worst, std::abs(u[i] - v[i]) / std::max(1.0, std::abs(u[i])));
  }
  // The weights moved: a test that trained nothing would compare equal too.
  const double moved = std::abs(whole->structured_params()[0].second.data().to_vector<double>()[0] -
                                make_net()->structured_params()[0].second.data().to_vector<double>()[0]);
  std::printf("rank %d of %d: max relative difference from one process %.2e (first weight moved by %.2e)\n",
              world.rank(), world.size(), worst, moved);
  return worst < 1e-5 && moved > 1e-4 ? 0 : 1;
}
