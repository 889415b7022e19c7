"""Writes this directory's NumPy files (numpy 1.23.5): tests/unit/test_data.cpp reads them with hybra::io."""
import numpy as np

np.save("float32_2x3.npy", np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
np.save("int64_4.npy", np.array([-3, 0, 7, 2**40], dtype=np.int64))
np.save("float64_fortran_2x3.npy", np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3) + 0.5))
np.save("int32_big_endian_3.npy", np.array([1, -2, 65536], dtype=">i4"))
np.save("bool_2x2.npy", np.array([[True, False], [False, True]]))
np.save("float64_scalar.npy", np.float64(2.25))
np.save("uint8_0x3.npy", np.zeros((0, 3), dtype=np.uint8))
np.save("int16_2.npy", np.array([1, 2], dtype=np.int16))
np.save("float16_4.npy", np.array([1, 0.1, -65504, np.inf], dtype=np.float16))
np.savez("arrays.npz", x=np.arange(4, dtype=np.float32).reshape(2, 2), y=np.array([5, 6, 7], dtype=np.int32))
np.savez_compressed("arrays_compressed.npz", x=np.arange(4, dtype=np.float32).reshape(2, 2),
                    y=np.array([5, 6, 7], dtype=np.int32))
