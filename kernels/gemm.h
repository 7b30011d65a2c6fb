// kernels/: the fp32 GEMM that the model's linear layers and the low-rank compressors run on,
// one place to make them fast. Below models/ and compression/, which both use it; includes nothing of optcc.
//
// On CPU every fp32 GEMM here goes through oneDNN's dnnl_sgemm (Debian's libdnnl-dev, found by
// CMake; OPTCC_HAVE_DNNL) when it was found at build time: on this project's shapes (tokens x
// hidden activations against [out, in] weights; tall-skinny low-rank factors) it is 1.2-1.7x
// faster than LibTorch's at::mm on OpenBLAS, one thread (docs/speed.md). Otherwise, on CUDA, or
// for other dtypes: ATen (at::mm / F::linear), the same math within fp32 round-off. The choice is
// made once per process; OPTCC_GEMM=aten in the environment forces ATen (to compare the two).
// oneDNN runs on the OpenMP threads LibTorch's set_num_threads sets (harness/parallel/threads.h).
#pragma once

#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

namespace optcc {

/// The library running CPU fp32 GEMMs in this process: "oneDNN <version>" or
/// "ATen at::mm (LibTorch's BLAS)", with " (OPTCC_GEMM=aten)" when the environment forced ATen.
std::string gemm_library();

/// The CPU's 16-bit float instructions that bf16 GEMMs can use, from /proc/cpuinfo's flags:
/// "AVX512-BF16", "AVX512-BF16 + AMX-BF16", or "none" (then bf16 GEMMs convert to fp32 inside and
/// are no faster than fp32). bf16 GEMMs run through ATen (LibTorch's oneDNN kernels), not mm_f32_out.
std::string cpu_bf16_instructions();

/// The library running the model's CPU GEMMs in `compute` dtype (train.precision's): fp32 ->
/// gemm_library(); bf16 -> "ATen (LibTorch's oneDNN bf16 matmul, <instructions>)" when LibTorch
/// was built with oneDNN (its mkldnn matmul takes bf16 GEMMs), naming cpu_bf16_instructions() or
/// "no bf16 instructions: computed in fp32 inside"; fp16 or no oneDNN -> "ATen". The training log
/// and `bench step` print it.
std::string compute_gemm_library(c10::ScalarType compute);

/// True when CPU fp32 GEMMs go through oneDNN (built with it and not forced to ATen).
bool gemm_uses_onednn();

/// The CPU fp32 GEMM libraries this build can call.
enum class GemmLibrary { kAten, kOneDnn };
/// Its name as gemm_library() prints it ("ATen at::mm (LibTorch's BLAS)", "oneDNN 2.6.3").
std::string gemm_library_name(GemmLibrary lib);
/// The libraries this build has (ATen always; oneDNN when CMake found libdnnl-dev).
std::vector<GemmLibrary> gemm_libraries();
/// mm_f32_out through `lib` whatever the process-wide choice (benchmarks compare them). CPU only;
/// throws std::invalid_argument when `lib` is not in this build.
void mm_f32_out_with(GemmLibrary lib, torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                     float alpha = 1.0f, float beta = 0.0f);

/// out := beta·out + alpha·(a·b) for 2-D fp32 tensors a [m, k], b [k, n], out [m, n] (beta = 0:
/// out is not read). a and b may be transposed views (one unit stride) or anything else (then
/// copied contiguous); out must not overlap a or b. No autograd. Any rank, any thread. Throws
/// c10::Error on shape or dtype mismatch.
void mm_f32_out(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, float alpha = 1.0f,
                float beta = 0.0f);

/// y = x·wᵀ + b, as torch::nn::functional::linear, with autograd: x [.., in], w [out, in],
/// b [out] or undefined; returns [.., out]. fp32 CPU tensors run the forward GEMM, the input
/// gradient (dy·w) and the weight gradient (dyᵀ·x) through mm_f32_out; anything else is
/// F::linear (ATen's GEMMs through the same autograd function while a WeightGradDeferral is
/// alive, below). The model's linear layers (models/tensor_parallel.h) and output layer use it.
torch::Tensor gemm_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {});

/// Weight gradients deferred from the backward pass (zero-bubble schedules split a stage's backward
/// into B, the input gradient, and W, the weight gradients: harness/parallel/pipeline_runner.h).
/// While a WeightGradDeferral is alive on the thread that runs a forward pass, every gemm_linear of
/// that pass is marked: its backward computes only the input gradient dx = dy·w and records the
/// weight gradient's GEMM instead (holding the layer's input x [rows, in] and output gradient dy
/// [rows, out], any dtype and device), with the bias gradient (the sum of dy's rows) when the call
/// has a bias. take() hands over what was recorded since the last take(); run() of those items
/// computes dw = dyᵀ·x (and db) and accumulates them into the gradients of the tensors gemm_linear
/// was given, as the whole backward would have (through autograd when a weight is a cast of the
/// parameter, as under mixed precision). The records of one backward pass are made on whichever
/// thread autograd runs it; the store is locked.
class DeferredWeightGrads {
 public:
  struct Item {
    torch::Tensor x, dy;    // [rows, in], [rows, out]
    torch::Tensor w, b;     // as given to gemm_linear (b undefined without a bias)
  };
  void record(Item item);
  /// The items recorded since the last take(), in record order.
  std::vector<Item> take();
  /// Bytes held by recorded, not yet taken items (their x and dy).
  int64_t held_bytes() const;
  /// dw = dyᵀ·x (and db = Σ_rows dy) of each item, accumulated into its weight's (and bias's)
  /// gradient. Any thread; autograd off for the GEMMs themselves.
  static void run(const std::vector<Item>& items);

 private:
  mutable std::mutex mu_;
  std::vector<Item> items_;
};

/// Marks the gemm_linear forwards of this thread, while alive, as deferring their weight gradients
/// into `store` (which must outlive the backward passes of those forwards). Not nestable.
class WeightGradDeferral {
 public:
  explicit WeightGradDeferral(DeferredWeightGrads& store);
  ~WeightGradDeferral();
  WeightGradDeferral(const WeightGradDeferral&) = delete;
  WeightGradDeferral& operator=(const WeightGradDeferral&) = delete;
};

/// Suspends this thread's WeightGradDeferral while alive (gemm_linear's weight gradients are then
/// computed in the backward as usual), restoring it after; nothing when none is alive. The output
/// layer uses it: deferring its weight gradient would hold the logits' gradient [s·b, V/t] of every
/// micro-batch until its W, more than a layer's activations.
class WeightGradDeferralPause {
 public:
  WeightGradDeferralPause();
  ~WeightGradDeferralPause();
  WeightGradDeferralPause(const WeightGradDeferralPause&) = delete;
  WeightGradDeferralPause& operator=(const WeightGradDeferralPause&) = delete;

 private:
  DeferredWeightGrads* paused_;
};

/// c = a·b over batch dimensions, as torch::matmul for equal batch shapes, with autograd: a
/// [..., m, k], b [..., k, n] (the same leading dimensions, no broadcasting) -> [..., m, n]. fp32
/// CPU tensors run one mm_f32_out per matrix, forward and both gradients, on views (transposed
/// or strided last two dimensions need no copy); anything else is torch::matmul. The attention's
/// two matmuls (models/gpt.cpp) use it.
torch::Tensor gemm_bmm(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace optcc
