#pragma once
// hybra: NumPy/NDArray-style tensors whose expressions are fused at compile
// time. Include this one header and link the CMake target hybra::hybra.
#include "core/creation.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/random.hpp"
#include "core/shape.hpp"
#include "core/tensor.hpp"
#include "expr/evaluate.hpp"
#include "expr/expression.hpp"
#include "expr/print.hpp"
#include "ops/layout.hpp"
#include "ops/linalg.hpp"
#include "ops/reduce.hpp"
#include "ops/softmax.hpp"
