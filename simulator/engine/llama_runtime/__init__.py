"""Programs of the llama.cpp release (copied into the tarball as ``scripts/ci/musa/m1000_llama``)."""
