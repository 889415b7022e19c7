#pragma once
// hybra's eager half: tensors, fused expressions, the ops and the engine,
// without symbols, graphs and blocks. hybra.hpp includes it; code that never
// builds a graph may include just this, and compiles faster. It lists each
// op's header, not the op table (ops/table.hpp): nvcc compiles it too
// (examples/cuda_fusion), and the gradient-only ops' CPU kernels
// (conv_backward.hpp) use GCC vector code nvcc's front end does not read.
#include "core/creation.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/mode.hpp"
#include "core/random.hpp"
#include "core/shape.hpp"
#include "core/tensor.hpp"
#include "expr/evaluate.hpp"
#include "expr/expression.hpp"
#include "expr/print.hpp"
#include "expr/cuda_eager.hpp"
#include "backend/cuda/random.hpp"
#include "expr/elementwise_op.hpp"
#include "ops/batch_norm.hpp"
#include "ops/batch_norm_training.hpp"
#include "ops/conv.hpp"
#include "ops/cumsum.hpp"
#include "ops/embedding.hpp"
#include "ops/layout.hpp"
#include "ops/linalg.hpp"
#include "ops/nn.hpp"
#include "ops/pool.hpp"
#include "ops/reduce.hpp"
#include "ops/softmax.hpp"
