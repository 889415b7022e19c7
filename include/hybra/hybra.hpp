#pragma once
// hybra: NumPy/NDArray-style tensors whose expressions are fused at compile
// time, and Gluon-style blocks that run eagerly or as captured, optimised
// graphs. Include this one header and link the CMake target hybra::hybra.
#include "eager.hpp"
#include "graph/graph.hpp"
#include "graph/passes.hpp"
#include "graph/symbol.hpp"
#include "jit/cpu_plan.hpp"
#include "nn/block.hpp"
#include "nn/conv_layers.hpp"
#include "nn/init.hpp"
#include "nn/layers.hpp"
#include "nn/parameter.hpp"
#include "nn/symbol_block.hpp"
