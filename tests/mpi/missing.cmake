# The `mpi` test when MPI or mpirun is missing (tests/CMakeLists.txt): fails, saying which.
message(FATAL_ERROR "${MESSAGE}")
