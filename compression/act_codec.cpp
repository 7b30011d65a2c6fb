#include "compression/act_codec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <stdexcept>

#include "compression/codecs.h"
#include "compression/options.h"

namespace optcc {

std::vector<torch::ScalarType> ActCodec::wire_dtypes(int64_t numel) const {
  return std::vector<torch::ScalarType>(wire_shapes(numel).size(), wire_dtype());
}

Payload ActCodec::encode(const torch::Tensor& x) {
  if (!x.defined() || x.dim() != 1 || x.scalar_type() != torch::kFloat) {
    throw std::invalid_argument(fmt::format(
        "{} codec: encode() takes a flat fp32 tensor, got {}", name(),
        x.defined() ? fmt::format("{} of shape {}", c10::toString(x.scalar_type()),
                                  fmt::join(x.sizes(), "x"))
                    : std::string("an undefined tensor")));
  }
  torch::NoGradGuard no_grad;
  Payload p = encode_impl(x);
  last_x_ = x;
  last_x_version_ = x._version();
  last_payload_ = p;
  return p;
}

torch::Tensor ActCodec::last_error() const {
  if (!last_x_.defined()) {
    throw std::logic_error(fmt::format("{} codec: last_error() before any encode()", name()));
  }
  if (last_x_._version() != last_x_version_) {
    throw std::logic_error(fmt::format(
        "{} codec: the tensor given to the last encode() was modified in place since; call "
        "last_error() before changing it (or encode a copy)", name()));
  }
  torch::NoGradGuard no_grad;
  return last_x_ - decode(last_payload_, last_x_.numel());
}

torch::Tensor ActCodec::output_buffer(int64_t numel, const torch::Device& device) const {
  // use_count 1 on both the TensorImpl and the storage: no tensor or view outside this object
  // (a view of out_ would hold another reference to the storage).
  const bool free = out_.defined() && out_.use_count() == 1 && out_.storage().use_count() == 1;
  if (!free || out_.numel() != numel || out_.device() != device) {
    out_ = torch::empty({numel}, torch::dtype(torch::kFloat).device(device));
  }
  return out_;
}

torch::Tensor ActCodec::decode(const Payload& p, int64_t numel) const {
  check_payload(p, numel);
  torch::NoGradGuard no_grad;
  if (auto same = decode_alias(p); same.defined()) return same;
  auto out = output_buffer(numel, p.parts[0].device());
  decode_impl(p, out);
  return out;
}

void ActCodec::decode_into(const Payload& p, int64_t numel, torch::Tensor& out) const {
  check_payload(p, numel);
  if (!out.defined() || out.dim() != 1 || out.numel() != numel || out.scalar_type() != torch::kFloat ||
      !out.is_contiguous() || out.device() != p.parts[0].device()) {
    throw std::invalid_argument(fmt::format(
        "{} codec: decode_into() needs a contiguous fp32 [{}] tensor on {}, got {}", name(), numel,
        p.parts[0].device().str(),
        out.defined() ? fmt::format("{} [{}] on {}", c10::toString(out.scalar_type()),
                                    fmt::join(out.sizes(), ", "), out.device().str())
                      : std::string("an undefined tensor")));
  }
  torch::NoGradGuard no_grad;
  decode_impl(p, out);
}

int64_t ActCodec::payload_bytes(int64_t numel) const {
  const auto shapes = wire_shapes(numel);
  const auto dtypes = wire_dtypes(numel);
  int64_t bytes = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    bytes += n * static_cast<int64_t>(c10::elementSize(dtypes[i]));
  }
  return bytes;
}

void ActCodec::check_payload(const Payload& p, int64_t numel) const {
  const auto shapes = wire_shapes(numel);
  const auto dtypes = wire_dtypes(numel);
  if (p.parts.size() != shapes.size()) {
    throw std::invalid_argument(fmt::format("{} codec: payload has {} parts, expected {} for {} "
                                            "elements", name(), p.parts.size(), shapes.size(),
                                            numel));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& t = p.parts[i];
    if (!t.defined() || t.sizes() != at::IntArrayRef(shapes[i]) || t.scalar_type() != dtypes[i]) {
      throw std::invalid_argument(fmt::format(
          "{} codec: payload part {} is {} [{}], expected {} [{}] for {} elements", name(), i,
          t.defined() ? c10::toString(t.scalar_type()) : "undefined",
          t.defined() ? fmt::format("{}", fmt::join(t.sizes(), ", ")) : "",
          c10::toString(dtypes[i]), fmt::join(shapes[i], ", "), numel));
    }
  }
}

// --- factory ------------------------------------------------------------------------------------

namespace {

/// Reads options from a YAML map; rejects keys outside `known` (message names the key and the
/// known keys).
class OptionReader {
 public:
  OptionReader(const std::string& codec, const YAML::Node& node, std::set<std::string> known)
      : codec_(codec), node_(node) {
    if (node_.IsNull() || !node_.IsDefined()) return;
    if (!node_.IsMap()) {
      throw std::invalid_argument(fmt::format("{} codec: options must be a map", codec_));
    }
    for (const auto& kv : node_) {
      const auto key = kv.first.as<std::string>();
      if (!known.count(key)) {
        throw std::invalid_argument(fmt::format(
            "{} codec: unknown option '{}' (known: {})", codec_, key,
            known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "))));
      }
    }
  }
  bool has(const std::string& key) const { return node_.IsMap() && node_[key].IsDefined(); }
  template <typename T>
  T get(const std::string& key, T fallback) const {
    return option_value<T>(node_, codec_ + " codec", key, fallback);  // compression/options.h
  }
  template <typename T>
  T require(const std::string& key, const std::string& why) const {
    if (!has(key)) {
      throw std::invalid_argument(fmt::format("{} codec: option '{}' is required ({})", codec_,
                                              key, why));
    }
    return get<T>(key, T{});
  }
  int64_t positive(const std::string& key, int64_t value) const {
    if (value <= 0) {
      throw std::invalid_argument(
          fmt::format("{} codec: option '{}' must be positive, got {}", codec_, key, value));
    }
    return value;
  }

 private:
  std::string codec_;
  YAML::Node node_;
};

// The message sizes each codec reads from the model unless its options set them (act_codec_options).
void fill_size(YAML::Node& o, const char* key, int64_t value) {
  if (!o[key]) o[key] = value;
}

void lowrank_sizes(YAML::Node& o, const MessageShape& m) {
  const std::string view = o["view"] ? o["view"].as<std::string>() : "token_major";
  fill_size(o, "hidden", m.hidden);
  if (view == "reference") {
    fill_size(o, "seq_len", m.seq_len);
    fill_size(o, "micro_batch", m.micro_batch);
  }
}

void quant_sizes(YAML::Node& o, const MessageShape& m) { fill_size(o, "hidden", m.hidden); }

std::unique_ptr<ActCodec> make_lowrank(const YAML::Node& options) {
  OptionReader o("lowrank", options,
                 {"rank", "view", "hidden", "seq_len", "micro_batch", "seed", "orthogonalize"});
  MatrixView view;
  const auto kind = o.get<std::string>("view", "token_major");
  if (kind == "token_major") {
    view.hidden = o.positive("hidden", o.require<int64_t>("hidden", "columns of the token_major "
                                                                    "view"));
  } else if (kind == "reference") {
    view.kind = MatrixView::Kind::kReference;
    view.seq_len = o.positive("seq_len", o.require<int64_t>("seq_len", "reference view"));
    view.micro_batch =
        o.positive("micro_batch", o.require<int64_t>("micro_batch", "reference view"));
    if (view.micro_batch % 8 != 0) {
      throw std::invalid_argument(fmt::format(
          "lowrank codec: view 'reference' uses n = seq_len*(micro_batch/8) and needs micro_batch "
          "% 8 == 0, got micro_batch = {}; use view: token_major", view.micro_batch));
    }
  } else {
    throw std::invalid_argument(fmt::format(
        "lowrank codec: option 'view' is '{}' (known: token_major, reference)", kind));
  }
  const int64_t rank = o.positive("rank", o.get<int64_t>("rank", 16));
  const auto orth = o.get<std::string>("orthogonalize", "mgs");
  if (orth != "mgs" && orth != "qr") {
    throw std::invalid_argument(fmt::format(
        "lowrank codec: option 'orthogonalize' is '{}' (known: mgs, qr)", orth));
  }
  return std::make_unique<LowRankCodec>(view, rank, o.get<uint64_t>("seed", 714), orth == "qr");
}

std::unique_ptr<ActCodec> make_topk(const YAML::Node& options) {
  OptionReader o("topk", options, {"fraction", "count"});
  if (o.has("fraction") == o.has("count")) {
    throw std::invalid_argument("topk codec: give exactly one of 'fraction' (0 < f <= 1) or "
                                "'count' (>= 1)");
  }
  const double fraction = o.get<double>("fraction", 0.0);
  if (o.has("fraction") && !(fraction > 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument(
        fmt::format("topk codec: option 'fraction' must be in (0, 1], got {}", fraction));
  }
  const int64_t count = o.has("count") ? o.positive("count", o.get<int64_t>("count", 0)) : 0;
  return std::make_unique<TopKCodec>(fraction, count);
}

}  // namespace

CommStep ActCodec::encode_arithmetic(int64_t numel, bool with_error) const {
  return arithmetic_step(name(), 0.0, 8.0 * double(numel), "encode");
}

CommStep ActCodec::decode_arithmetic(int64_t numel) const {
  return arithmetic_step(name(), 0.0, 8.0 * double(numel), "decode");
}

void register_builtin_act_codecs(Registry<ActCodec>& registry) {
  const auto cast = [](const char* name, torch::ScalarType dtype) {
    return [name, dtype](const YAML::Node& o) -> std::unique_ptr<ActCodec> {
      OptionReader(name, o, {});
      return std::make_unique<CastCodec>(dtype);
    };
  };
  registry.add("none", "the message itself, uncompressed (in the link's dtype)", cast("none", torch::kFloat));
  registry.add("fp16", "the message cast to fp16 on the wire", cast("fp16", torch::kHalf));
  registry.add("bf16", "the message cast to bf16 on the wire", cast("bf16", torch::kBFloat16));
  registry.add("lowrank",
               "rank-r factors P, Q of the message as a matrix, CB's codec (options: rank, view, hidden, seq_len, "
               "micro_batch, seed, orthogonalize)",
               make_lowrank);
  for (const int bits : {8, 4}) {
    const std::string name = bits == 8 ? "int8" : "int4";
    registry.add(name, fmt::format("{}-bit codes per row of `hidden` elements with fp32 scales (options: hidden)", bits),
                 [name, bits](const YAML::Node& options) -> std::unique_ptr<ActCodec> {
                   OptionReader o(name, options, {"hidden"});
                   const int64_t hidden =
                       o.positive("hidden", o.require<int64_t>("hidden", "row length of the quantisation view"));
                   return std::make_unique<QuantCodec>(bits, hidden);
                 });
  }
  registry.add("hadamard",
               "Walsh-Hadamard rotation of each tile, then 3/4/8-bit codes per tile with fp32 scales (options: "
               "hidden, tile, bits)",
               [](const YAML::Node& options) -> std::unique_ptr<ActCodec> {
                 OptionReader o("hadamard", options, {"hidden", "tile", "bits"});
                 const int64_t hidden =
                     o.positive("hidden", o.require<int64_t>("hidden", "the message's hidden size, cut into tiles"));
                 return std::make_unique<HadamardCodec>(static_cast<int>(o.get<int64_t>("bits", 4)), hidden,
                                                        o.get<int64_t>("tile", 64));
               });
  registry.add("topk", "the k largest entries and their int64 indices (options: fraction or count)", make_topk);
}

YAML::Node act_codec_options(const std::string& name, const YAML::Node& options, const MessageShape& shape) {
  static const std::map<std::string, void (*)(YAML::Node&, const MessageShape&)> sizes = {
      {"lowrank", lowrank_sizes}, {"int8", quant_sizes}, {"int4", quant_sizes}, {"hadamard", quant_sizes}};
  if (options && !options.IsNull() && !options.IsMap()) return options;  // make_act_codec() refuses it
  YAML::Node o = options && options.IsMap() ? YAML::Clone(options) : YAML::Node(YAML::NodeType::Map);
  const auto it = sizes.find(name);
  if (it != sizes.end()) it->second(o, shape);
  return o;
}

const Registry<ActCodec>& act_codec_registry() {
  static const Registry<ActCodec> registry = [] {
    Registry<ActCodec> r("activation codec");
    register_builtin_act_codecs(r);
    return r;
  }();
  return registry;
}

std::vector<std::string> act_codec_names() { return act_codec_registry().names(); }

std::unique_ptr<ActCodec> make_act_codec(const std::string& name, const YAML::Node& options) {
  return act_codec_registry().create(name, options);
}

}  // namespace optcc
