#!/bin/bash
set -u
REPO=$PWD; D=$(cd "$(dirname "$0")" && pwd); R=$OUT
{
date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv; nvcc --version | tail -2
mkdir -p /tmp/w && cd /tmp/w && tar -xzf "$D/llama.cpp-src.tar.gz" && cd llama.cpp || exit 2
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF > "$R/cmake-configure.txt" 2>&1 || exit 2
timeout 420 cmake --build build --target llama-server -j 16 > /tmp/w/build.txt 2>&1; rc=$?
t1=$(date +%s); echo "cuda build rc=$rc wall_s=$((t1-t0)) (16 cores, sm_90 only)"
[ $rc -eq 0 ] || { tail -30 /tmp/w/build.txt; exit 3; }
./build/bin/llama-server --version
cd "$D" && PYTHONPATH=$REPO timeout 150 python3 gpu_probe.py /tmp/w/llama.cpp/build/bin/llama-server "$D/gguf" "$R" "$((t1-t0))"
} > "$R/device-log.txt" 2>&1
cat "$R/device-log.txt"
