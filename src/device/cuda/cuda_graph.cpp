#include "device/cuda/cuda_graph.h"

#include "device/cuda/cuda_check.h"

namespace asynctp::cuda {

struct Graph::Impl {
  cudaStream_t capturing = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}

Graph::~Graph() {
  if (impl_->capturing != nullptr) {  // abandoned mid-capture (an exception): leave capture mode
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(impl_->capturing, &partial);
    if (partial) cudaGraphDestroy(partial);
    (void)cudaGetLastError();
  }
  if (impl_->exec) cudaGraphExecDestroy(impl_->exec);
  if (impl_->graph) cudaGraphDestroy(impl_->graph);
}

void Graph::begin_capture(Stream& stream) {
  ASYNCTP_CHECK(impl_->capturing == nullptr && impl_->exec == nullptr, "graph already captured");
  impl_->capturing = static_cast<cudaStream_t>(stream.native_handle());
  ASYNCTP_CUDA_CHECK(cudaStreamBeginCapture(impl_->capturing, cudaStreamCaptureModeThreadLocal));
}

void Graph::end_capture() {
  ASYNCTP_CHECK(impl_->capturing != nullptr, "end_capture without begin_capture");
  ASYNCTP_CUDA_CHECK(cudaStreamEndCapture(impl_->capturing, &impl_->graph));
  impl_->capturing = nullptr;
  ASYNCTP_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0));
}

void Graph::replay(Stream& stream) {
  ASYNCTP_CHECK(impl_->exec != nullptr, "replay of a graph that was never captured");
  ASYNCTP_CUDA_CHECK(
      cudaGraphLaunch(impl_->exec, static_cast<cudaStream_t>(stream.native_handle())));
}

}  // namespace asynctp::cuda
