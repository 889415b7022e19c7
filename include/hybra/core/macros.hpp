#pragma once
// Marks functions that nvcc must compile for both host and device.
#if defined(__CUDACC__)
#define HYBRA_HD __host__ __device__
#else
#define HYBRA_HD
#endif
