#include "models/sharding.h"

#include <fmt/format.h>

#include <regex>
#include <stdexcept>

namespace optcc {
namespace {

// The split of `parameter` of `module`, asked from the layer type that registered it.
TpSplit split_of(const torch::nn::Module& module, const std::string& parameter) {
  if (dynamic_cast<const ColumnParallelLinearImpl*>(&module)) return ColumnParallelLinearImpl::split_of(parameter);
  if (dynamic_cast<const RowParallelLinearImpl*>(&module)) return RowParallelLinearImpl::split_of(parameter);
  if (dynamic_cast<const VocabParallelEmbeddingImpl*>(&module)) return VocabParallelEmbeddingImpl::split_of(parameter);
  return {};  // LayerNorm, GptModel's own position_embedding: replicated
}

}  // namespace

std::map<std::string, TpSplit> tp_splits(const GptModelImpl& model) {
  std::map<std::string, TpSplit> out;
  for (const auto& p : model.named_parameters(/*recurse=*/false)) out[p.key()] = split_of(model, p.key());
  for (const auto& m : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      out[m.key() + "." + p.key()] = split_of(*m.value(), p.key());
    }
  }
  return out;
}

namespace {

// "blocks.<i>.<rest>": m[1] = i, m[2] = rest.
bool match_block(const std::string& stage_name, std::smatch& m) {
  static const std::regex block(R"(^blocks\.(\d+)\.(.*)$)");
  return std::regex_match(stage_name, m, block);
}

}  // namespace

std::optional<int64_t> whole_model_layer(const std::string& stage_name, const StageRange& stage) {
  std::smatch m;
  if (!match_block(stage_name, m)) return std::nullopt;
  return stage.layer_of(std::stoll(m[1].str()));
}

std::string whole_model_name(const std::string& stage_name, const StageRange& stage) {
  std::smatch m;
  if (!match_block(stage_name, m)) return stage_name;
  return fmt::format("blocks.{}.{}", stage.layer_of(std::stoll(m[1].str())), m[2].str());
}

torch::Tensor merge_tp_shards(const std::vector<torch::Tensor>& shards, const TpSplit& split) {
  if (shards.empty()) throw std::invalid_argument("merge_tp_shards: no shards");
  if (split.dim < 0) return shards[0];
  return torch::cat(shards, split.dim);
}

torch::Tensor fit_vocab_rows(const torch::Tensor& whole, int64_t true_vocab, int64_t padded_rows) {
  if (whole.size(0) < true_vocab || padded_rows < true_vocab) {
    throw std::invalid_argument(fmt::format("fit_vocab_rows: {} rows, true vocabulary {}, padded {}", whole.size(0),
                                            true_vocab, padded_rows));
  }
  std::vector<int64_t> sizes = whole.sizes().vec();
  sizes[0] = padded_rows;
  auto out = torch::zeros(sizes, whole.options());
  out.narrow(0, 0, true_vocab).copy_(whole.narrow(0, 0, true_vocab));
  return out;
}

torch::Tensor tp_shard(const torch::Tensor& whole, const TpSplit& split, int64_t rank, int64_t size) {
  if (split.dim < 0) return whole.clone();
  const int64_t n = whole.size(split.dim);
  if (n % size != 0) {
    throw std::invalid_argument(fmt::format("tp_shard: dim {} of size {} is not divisible by the TP size {}",
                                            split.dim, n, size));
  }
  return whole.narrow(split.dim, rank * (n / size), n / size).contiguous().clone();
}

}  // namespace optcc
