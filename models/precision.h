// Training precision (`train.precision`): the one place that spells the names and maps each to the
// dtype the model computes in. Mixed precision follows Megatron-LM's recipe: the parameters (the
// optimizer's master weights), AdamW's moments, gradients after the cast and every compressor's
// state stay fp32; the linear layers, attention matmuls, residual stream and the activations that
// cross pipeline stages and tensor-parallel all-reduces are in the compute dtype; LayerNorm,
// softmax and the loss run in fp32 (models/gpt.h says where the casts are).
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace optcc {

/// The names `train.precision` accepts, in order: "fp32" (the default), "bf16", "fp16".
const std::vector<std::string>& precision_names();

/// The compute dtype of a precision name: fp32 -> Float, bf16 -> BFloat16, fp16 -> Half. Throws
/// std::invalid_argument naming the value and the accepted names otherwise.
c10::ScalarType precision_dtype(const std::string& name);

/// Bytes of one element in the compute dtype (4 for fp32, 2 for bf16 and fp16): what a pipeline
/// message or TP all-reduce carries per element (`optcc traffic` reads it from here).
int precision_element_bytes(const std::string& name);

}  // namespace optcc
