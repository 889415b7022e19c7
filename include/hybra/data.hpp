#pragma once
// hybra's data layer for training: IDX files (read_idx), NumPy's .npy and
// .npz files (io::load_npy, ...), datasets held in memory (ArrayDataset,
// FashionMNIST) and the batching DataLoader. It
// includes only core/ and io/, so code that just loads data compiles quickly.
#include "data/dataloader.hpp"
#include "data/dataset.hpp"
#include "data/fashion_mnist.hpp"
#include "data/idx.hpp"
#include "io/npy.hpp"
