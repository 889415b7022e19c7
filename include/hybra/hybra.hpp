#pragma once
// hybra: NumPy/NDArray-style tensors whose expressions are fused at compile
// time, and Gluon-style blocks that run eagerly or as captured, optimised
// graphs, trained with autograd. Include this one header and link the CMake
// target hybra::hybra (training across processes adds hybra/parallel/mpi.hpp
// and the target hybra::mpi).
//
// hybra's loops are marked `omp simd`. Where one calls a function clang has
// no vector form of (tanh without a vector math library, a loop of integer
// pow, a search that exits early), clang keeps it scalar, which is correct,
// and says so (-Wpass-failed) in every program that includes hybra: that
// note is for hybra's authors, so it is silenced here (where the loop has a
// source location, as with -g; the CMake target hybra::hybra adds
// -Wno-pass-failed for builds without one).
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpass-failed"
#endif
#include "core/version.hpp"
#include "eager.hpp"
#include "autograd/backward.hpp"
#include "graph/graph.hpp"
#include "graph/passes.hpp"
#include "graph/symbol.hpp"
#include "jit/plan.hpp"
#include "expr/cuda_elementwise.hpp"
#include "backend/cuda/driver.hpp"
#include "nn/block.hpp"
#include "nn/conv_layers.hpp"
#include "nn/init.hpp"
#include "nn/layers.hpp"
#include "nn/parameter.hpp"
#include "nn/loss.hpp"
#include "nn/metric.hpp"
#include "nn/summary.hpp"
#include "nn/symbol_block.hpp"
#include "nn/transformer.hpp"
#include "nn/model_zoo/resnet.hpp"
#include "data.hpp"
#include "optim/adam.hpp"
#include "optim/clip.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/progress.hpp"
#include "optim/sgd.hpp"
#include "optim/trainer.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/split.hpp"
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
