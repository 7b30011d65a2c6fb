#include "compression/sparse_reducers.h"

#include "compression/options.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace optcc {
namespace {

// ---- options ----------------------------------------------------------------------------------

template <class T>
T option(const YAML::Node& o, const char* who, const char* key, T fallback, const char*) {
  return option_value<T>(o, who, key, fallback);  // strict: compression/options.h
}

template <class T>
void require(bool ok, const char* who, const char* key, T value, const char* rule) {
  if (!ok) throw std::invalid_argument(fmt::format("{}: option '{}' must be {}, got {}", who, key, rule, value));
}

bool has(const YAML::Node& o, const char* key) { return o && o.IsMap() && o[key]; }

// fraction/count of topk and randomk: exclusive in YAML; count > 0 wins in the struct.
template <class Options>
void read_k(const YAML::Node& o, const char* who, Options& p) {
  if (has(o, "fraction") && has(o, "count")) {
    throw std::invalid_argument(fmt::format("{}: options 'fraction' and 'count' exclude each other; give one", who));
  }
  p.fraction = option<double>(o, who, "fraction", p.fraction, "a number");
  p.count = option<int64_t>(o, who, "count", p.count, "an integer");
}

template <class Options>
void validate_k(const Options& p, const char* who) {
  require(p.fraction > 0 && p.fraction <= 1, who, "fraction", p.fraction, "in (0, 1]");
  require(p.count >= 0, who, "count", p.count, ">= 0 (0: use fraction)");
  require(p.min_numel >= 0, who, "min_numel", p.min_numel, ">= 0");
}

int64_t k_of(double fraction, int64_t count, int64_t numel) {
  if (count > 0) return std::min(count, numel);
  return std::clamp<int64_t>(std::llround(fraction * static_cast<double>(numel)), 1, std::max<int64_t>(numel, 1));
}

// ---- randomness: counter-based seeds, identical wherever the same triple is used ---------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A fresh CPU generator for (a, b, c). mt19937 keeps 32 bits of the seed, so two triples share a
// stream with probability 2^-32: harmless for sampling.
at::Generator generator_for(uint64_t a, int64_t b, uint64_t c) {
  const uint64_t s = splitmix64(splitmix64(splitmix64(a) ^ static_cast<uint64_t>(b)) ^ c);
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

// Uniform in [0, bound) without modulo bias.
int64_t uniform_below(at::CPUGeneratorImpl& g, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  uint64_t x;
  do x = g.random64(); while (x < threshold);
  return static_cast<int64_t>(x % bound);
}

// ---- bit and byte packing -----------------------------------------------------------------------

torch::Tensor bit_weights(torch::Device dev) {  // [8] uint8: 1, 2, ..., 128
  return torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, torch::dtype(torch::kByte).device(dev));
}

// bool [N] -> uint8 [⌈N/8⌉], entry j in bit j%8 of byte j/8.
torch::Tensor pack_bits(const torch::Tensor& bits) {
  const int64_t n = bits.numel(), nbytes = (n + 7) / 8;
  auto padded = torch::constant_pad_nd(bits.to(torch::kByte), {0, nbytes * 8 - n}).view({nbytes, 8});
  return padded.mul(bit_weights(bits.device())).sum(1, false, torch::kByte);
}

// uint8 [⌈N/8⌉] -> fp32 [N] of ±1 (set bit: +1).
torch::Tensor unpack_signs(const torch::Tensor& packed, int64_t n) {
  auto bits = packed.unsqueeze(1).bitwise_and(bit_weights(packed.device())).ne(0).view({-1}).narrow(0, 0, n);
  return bits.to(torch::kFloat).mul_(2).sub_(1);
}

// Bytes [at, at+4·count) of a gathered uint8 buffer as fp32 [count] (cloned: offsets need not be aligned).
torch::Tensor floats_at(const torch::Tensor& bytes, int64_t at, int64_t count) {
  return bytes.narrow(0, at, 4 * count).clone().view(torch::kFloat);
}

}  // namespace

// ---- the shared sequence ------------------------------------------------------------------------

ElementwiseReducer::ElementwiseReducer(std::string kind, bool error_feedback, int64_t min_numel)
    : kind_(std::move(kind)), error_feedback_(error_feedback), min_numel_(min_numel) {}

void ElementwiseReducer::reduce(std::vector<torch::Tensor>& grads, Communicator& dp, int64_t step) {
  torch::NoGradGuard no_grad;
  bind_tensors(grads);  // the same list as the state's, before anything changes
  begin_records(grads);
  if (grads.empty()) return;
  // 1. Non-finite on any rank -> all ranks skip, before anything is modified.
  auto bad = torch::zeros({1}, grads[0].options().dtype(torch::kFloat));
  for (const auto& g : grads) bad = torch::maximum(bad, torch::logical_not(torch::isfinite(g)).any().to(torch::kFloat).reshape({1}));
  dp.all_reduce(bad, Traffic::kControl, /*max=*/true);
  if (bad.item<float>() > 0) {
    throw NonFiniteGradients(fmt::format("{}: non-finite gradient on some rank of {} (step {}); gradients and "
                                         "error feedback left untouched, skip this step",
                                         kind_, dp.name(), step));
  }
  // 2.-3. Classify; compensate the compressed ones in fp32.
  if (ef_.size() < grads.size()) ef_.resize(grads.size());
  std::vector<size_t> raw;
  std::vector<Item> items;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t n = grads[i].numel();
    if (n == 0 || n < min_numel_ || compressed_bytes(n) >= 4 * n) {
      raw.push_back(i);
      continue;
    }
    Item it;
    it.index = i;
    it.c = grads[i].reshape({-1}).to(torch::kFloat, false, /*copy=*/true);  // [N] fp32
    if (error_feedback_ && ef_[i].defined()) {
      if (ef_[i].numel() != n) {
        throw std::invalid_argument(fmt::format("{}: {} has {} elements but its error feedback has {} (did the "
                                                "gradient list change since the state was saved?)",
                                                kind_, records_[i].name, n, ef_[i].numel()));
      }
      it.c.add_(ef_[i].to(it.c.device()));
    }
    items.push_back(std::move(it));
  }
  // 4. Compressed tensors: one collective for all of them.
  if (!items.empty()) exchange(items, dp, step);
  // 5. Raw tensors: one flat fp32 all-reduce, ÷ dp.
  if (!raw.empty()) {
    std::vector<torch::Tensor> parts;
    for (size_t i : raw) parts.push_back(grads[i]);
    auto buf = flatten_fp32(parts);  // [Σ N] fp32
    dp.all_reduce(buf, traffic_class());
    buf.div_(dp.size());
    unflatten_into(buf, parts);
    for (size_t i : raw) records_[i].sent_bytes = grads[i].numel() * 4;
  }
  // 6. Write the means back; local residual.
  for (auto& it : items) {
    auto& g = grads[it.index];
    g.copy_(it.out.view(g.sizes()));
    if (error_feedback_) ef_[it.index] = it.c - it.own;
    records_[it.index].compressed = true;
    records_[it.index].sent_bytes = compressed_bytes(g.numel());
  }
}

void ElementwiseReducer::save(torch::serialize::OutputArchive& archive) const {
  archive.write(kind_ + ".state", torch::tensor({static_cast<int64_t>(ef_.size())}));
  save_tensors(archive, kind_ + ".tensors");
  for (size_t i = 0; i < ef_.size(); ++i) {
    if (ef_[i].defined()) archive.write(kind_ + ".ef." + std::to_string(i), ef_[i].cpu());
  }
}

void ElementwiseReducer::load(torch::serialize::InputArchive& archive) {
  torch::Tensor meta;
  if (!archive.try_read(kind_ + ".state", meta)) {
    throw std::invalid_argument(fmt::format("{}: the checkpoint has no '{}.state' entry (written by another reducer?)",
                                            kind_, kind_));
  }
  load_tensors(archive, kind_ + ".tensors", /*has_state=*/meta[0].item<int64_t>() > 0);  // before any change
  ef_.assign(static_cast<size_t>(meta[0].item<int64_t>()), torch::Tensor());
  for (size_t i = 0; i < ef_.size(); ++i) {
    torch::Tensor t;
    if (archive.try_read(kind_ + ".ef." + std::to_string(i), t)) ef_[i] = t.clone();
  }
}

// ---- topk ---------------------------------------------------------------------------------------

TopKOptions TopKOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "topk", {"fraction", "count", "error_feedback", "min_numel"});
  TopKOptions p;
  read_k(o, "topk", p);
  p.error_feedback = option<bool>(o, "topk", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "topk", "min_numel", p.min_numel, "an integer");
  validate_k(p, "topk");
  return p;
}

TopKReducer::TopKReducer(TopKOptions options)
    : ElementwiseReducer("topk", options.error_feedback, options.min_numel), opt_(options) {
  validate_k(opt_, "topk");
}

std::string TopKReducer::name() const {
  const auto k = opt_.count > 0 ? fmt::format("count={}", opt_.count) : fmt::format("fraction={}", opt_.fraction);
  return fmt::format("topk({}, error_feedback={}, min_numel={})", k, opt_.error_feedback, opt_.min_numel);
}

int64_t TopKReducer::k_for(int64_t numel) const { return k_of(opt_.fraction, opt_.count, numel); }

void TopKReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  std::vector<int64_t> ks, offs;
  int64_t total = 0;  // Σk
  for (const auto& it : items) {
    if (it.c.numel() > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument(fmt::format("topk: {} has {} elements; int32 indices allow at most 2^31 - 1",
                                              records_[it.index].name, it.c.numel()));
    }
    ks.push_back(k_for(it.c.numel()));
    offs.push_back(total);
    total += ks.back();
  }
  // [Σk value bits | Σk indices] int32: one all-gather for every tensor.
  auto msg = torch::empty({2 * total}, items[0].c.options().dtype(torch::kInt));
  auto values = msg.narrow(0, 0, total).view(torch::kFloat);
  auto indices = msg.narrow(0, total, total);
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    auto idx = std::get<1>(torch::topk(it.c.abs(), ks[j], 0, /*largest=*/true, /*sorted=*/false));  // [k] int64
    auto v = it.c.index_select(0, idx);                                                             // [k] fp32
    values.narrow(0, offs[j], ks[j]).copy_(v);
    indices.narrow(0, offs[j], ks[j]).copy_(idx);
    it.own = torch::zeros_like(it.c).index_copy_(0, idx, v);
  }
  auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·2Σk] int32, rank order
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    it.out = torch::zeros_like(it.c);
    for (int r = 0; r < dp.size(); ++r) {  // rank order: the same sum on every rank
      auto part = all.narrow(0, r * 2 * total, 2 * total);
      it.out.index_add_(0, part.narrow(0, total + offs[j], ks[j]).to(torch::kLong),
                        part.narrow(0, offs[j], ks[j]).view(torch::kFloat));
    }
    it.out.div_(dp.size());
  }
}

// ---- randomk ------------------------------------------------------------------------------------

RandomKOptions RandomKOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "randomk", {"fraction", "count", "error_feedback", "min_numel", "seed"});
  RandomKOptions p;
  read_k(o, "randomk", p);
  p.error_feedback = option<bool>(o, "randomk", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "randomk", "min_numel", p.min_numel, "an integer");
  p.seed = option<int64_t>(o, "randomk", "seed", p.seed, "an integer");
  validate_k(p, "randomk");
  return p;
}

RandomKReducer::RandomKReducer(RandomKOptions options)
    : ElementwiseReducer("randomk", options.error_feedback, options.min_numel), opt_(options) {
  validate_k(opt_, "randomk");
}

std::string RandomKReducer::name() const {
  const auto k = opt_.count > 0 ? fmt::format("count={}", opt_.count) : fmt::format("fraction={}", opt_.fraction);
  return fmt::format("randomk({}, error_feedback={}, min_numel={}, seed={})", k, opt_.error_feedback, opt_.min_numel,
                     opt_.seed);
}

int64_t RandomKReducer::k_for(int64_t numel) const { return k_of(opt_.fraction, opt_.count, numel); }

torch::Tensor RandomKReducer::indices(int64_t step, size_t tensor, int64_t numel) const {
  const int64_t k = k_for(numel);
  auto gen = generator_for(static_cast<uint64_t>(opt_.seed), step, tensor);
  auto* g = gen.get<at::CPUGeneratorImpl>();
  std::unordered_set<int64_t> chosen;  // Floyd: k draws, no rejection loop
  chosen.reserve(static_cast<size_t>(2 * k));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(k));
  for (int64_t j = numel - k; j < numel; ++j) {
    int64_t t = uniform_below(*g, static_cast<uint64_t>(j + 1));
    if (chosen.count(t)) t = j;
    chosen.insert(t);
    out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return torch::tensor(out, torch::kLong);
}

void RandomKReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  std::vector<torch::Tensor> idx;
  std::vector<int64_t> offs;
  int64_t total = 0;
  for (const auto& it : items) {
    idx.push_back(indices(step, it.index, it.c.numel()).to(it.c.device()));
    offs.push_back(total);
    total += idx.back().numel();
  }
  auto values = torch::empty({total}, items[0].c.options());  // [Σk] fp32
  for (size_t j = 0; j < items.size(); ++j) {
    auto v = items[j].c.index_select(0, idx[j]);
    values.narrow(0, offs[j], v.numel()).copy_(v);
    items[j].own = torch::zeros_like(items[j].c).index_copy_(0, idx[j], v);
  }
  dp.all_reduce(values, traffic_class());
  values.div_(dp.size());
  for (size_t j = 0; j < items.size(); ++j) {
    items[j].out = torch::zeros_like(items[j].c).index_copy_(0, idx[j], values.narrow(0, offs[j], idx[j].numel()));
  }
}

// ---- qsgd ---------------------------------------------------------------------------------------

namespace {

void validate_qsgd(const QsgdOptions& p) {
  require(p.levels >= 1 && p.levels <= 127, "qsgd", "levels", p.levels, "in [1, 127] (int8 codes)");
  require(p.bucket_size >= 1, "qsgd", "bucket_size", p.bucket_size, ">= 1");
  require(p.min_numel >= 0, "qsgd", "min_numel", p.min_numel, ">= 0");
}

}  // namespace

QsgdOptions QsgdOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "qsgd", {"levels", "bucket_size", "error_feedback", "min_numel", "seed"});
  QsgdOptions p;
  p.levels = option<int64_t>(o, "qsgd", "levels", p.levels, "an integer");
  p.bucket_size = option<int64_t>(o, "qsgd", "bucket_size", p.bucket_size, "an integer");
  p.error_feedback = option<bool>(o, "qsgd", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "qsgd", "min_numel", p.min_numel, "an integer");
  p.seed = option<int64_t>(o, "qsgd", "seed", p.seed, "an integer");
  validate_qsgd(p);
  return p;
}

QsgdReducer::QsgdReducer(QsgdOptions options)
    : ElementwiseReducer("qsgd", options.error_feedback, options.min_numel), opt_(options) {
  validate_qsgd(opt_);
}

std::string QsgdReducer::name() const {
  return fmt::format("qsgd(levels={}, bucket_size={}, error_feedback={}, min_numel={}, seed={})", opt_.levels,
                     opt_.bucket_size, opt_.error_feedback, opt_.min_numel, opt_.seed);
}

int64_t QsgdReducer::compressed_bytes(int64_t numel) const {
  return numel + 4 * ((numel + opt_.bucket_size - 1) / opt_.bucket_size);
}

namespace {

// x [N] -> [⌈N/B⌉, B], zero-padded.
torch::Tensor buckets(const torch::Tensor& x, int64_t b) {
  const int64_t nb = (x.numel() + b - 1) / b;
  return torch::constant_pad_nd(x, {0, nb * b - x.numel()}).view({nb, b});
}

// norms [nb] fp32, codes [N] int8 -> fp32 [N]: norm·code/s (in this order: exact on the grid).
torch::Tensor qsgd_decode(const torch::Tensor& norms, const torch::Tensor& codes, int64_t b, int64_t s) {
  auto q = buckets(codes.to(torch::kFloat), b).mul(norms.unsqueeze(1)).div(static_cast<double>(s));
  return q.view({-1}).narrow(0, 0, codes.numel());
}

}  // namespace

void QsgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  const int64_t b = opt_.bucket_size, s = opt_.levels;
  std::vector<int64_t> nbs, norm_offs, code_offs;
  int64_t norms_total = 0, codes_total = 0;
  for (const auto& it : items) {
    nbs.push_back((it.c.numel() + b - 1) / b);
    norm_offs.push_back(norms_total), code_offs.push_back(codes_total);
    norms_total += nbs.back(), codes_total += it.c.numel();
  }
  // [4·Σnb bytes of fp32 norms | ΣN int8 codes] uint8: one all-gather for every tensor.
  const int64_t x = 4 * norms_total + codes_total;
  auto msg = torch::empty({x}, items[0].c.options().dtype(torch::kByte));
  auto norms = torch::empty({norms_total}, items[0].c.options());  // [Σnb] fp32
  auto codes = msg.narrow(0, 4 * norms_total, codes_total).view(torch::kChar);
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    auto v = buckets(it.c, b);                                   // [nb, B]
    auto norm = v.square().sum(1);                               // [nb]
    norm.sqrt_();
    auto safe = torch::where(norm > 0, norm, torch::ones_like(norm)).unsqueeze(1);
    auto r = v.abs().mul(static_cast<double>(s)).div(safe);      // [nb, B] in [0, s]
    auto gen = generator_for(static_cast<uint64_t>(opt_.seed) + static_cast<uint64_t>(dp.rank()), step, it.index);
    auto u = buckets(torch::rand({n}, gen, torch::kFloat).to(it.c.device()), b);  // U[0, 1)
    auto level = r.floor();
    level.add_(u.lt(r - level).to(torch::kFloat)).clamp_(0, static_cast<double>(s));
    auto code = level.mul_(v.sign()).view({-1}).narrow(0, 0, n).to(torch::kChar);  // [N] int8
    norms.narrow(0, norm_offs[j], nbs[j]).copy_(norm);
    codes.narrow(0, code_offs[j], n).copy_(code);
    it.own = qsgd_decode(norm, code, b, s);
  }
  msg.narrow(0, 0, 4 * norms_total).copy_(norms.view(torch::kByte));
  auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·x] uint8, rank order
  for (size_t j = 0; j < items.size(); ++j) {
    auto& it = items[j];
    it.out = torch::zeros_like(it.c);
    for (int r = 0; r < dp.size(); ++r) {
      auto part = all.narrow(0, r * x, x);
      auto norm_r = floats_at(part, 4 * norm_offs[j], nbs[j]);
      auto code_r = part.narrow(0, 4 * norms_total + code_offs[j], it.c.numel()).view(torch::kChar);
      it.out.add_(qsgd_decode(norm_r, code_r, b, s));
    }
    it.out.div_(dp.size());
  }
}

// ---- signsgd ------------------------------------------------------------------------------------

SignSgdOptions SignSgdOptions::from_yaml(const YAML::Node& o) {
  check_option_keys(o, "signsgd", {"error_feedback", "min_numel"});
  SignSgdOptions p;
  p.error_feedback = option<bool>(o, "signsgd", "error_feedback", p.error_feedback, "a bool");
  p.min_numel = option<int64_t>(o, "signsgd", "min_numel", p.min_numel, "an integer");
  require(p.min_numel >= 0, "signsgd", "min_numel", p.min_numel, ">= 0");
  return p;
}

SignSgdReducer::SignSgdReducer(SignSgdOptions options)
    : ElementwiseReducer("signsgd", options.error_feedback, options.min_numel), opt_(options) {
  require(opt_.min_numel >= 0, "signsgd", "min_numel", opt_.min_numel, ">= 0");
}

std::string SignSgdReducer::name() const {
  return fmt::format("signsgd(error_feedback={}, min_numel={})", opt_.error_feedback, opt_.min_numel);
}

void SignSgdReducer::exchange(std::vector<Item>& items, Communicator& dp, int64_t step) {
  const int64_t t = static_cast<int64_t>(items.size());
  std::vector<int64_t> offs;
  int64_t bits_total = 0;
  for (const auto& it : items) {
    offs.push_back(bits_total);
    bits_total += (it.c.numel() + 7) / 8;
  }
  // [4·T bytes of fp32 scales | Σ⌈N/8⌉ sign bytes] uint8: one all-gather for every tensor.
  const int64_t x = 4 * t + bits_total;
  auto msg = torch::empty({x}, items[0].c.options().dtype(torch::kByte));
  auto scales = torch::empty({t}, items[0].c.options());  // [T] fp32
  for (int64_t j = 0; j < t; ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    auto scale = scales.narrow(0, j, 1);
    scale.copy_(it.c.abs().sum().div(static_cast<double>(n)).reshape({1}));  // ‖c‖₁ / N
    auto packed = pack_bits(it.c.ge(0));                                       // sign(0) = +1
    msg.narrow(0, 4 * t + offs[j], packed.numel()).copy_(packed);
    it.own = unpack_signs(packed, n).mul_(scale);
  }
  msg.narrow(0, 0, 4 * t).copy_(scales.view(torch::kByte));
  auto all = dp.all_gather(msg, traffic_class(), 0);  // [n·x] uint8, rank order
  for (int64_t j = 0; j < t; ++j) {
    auto& it = items[j];
    const int64_t n = it.c.numel();
    it.out = torch::zeros_like(it.c);
    for (int r = 0; r < dp.size(); ++r) {
      auto part = all.narrow(0, r * x, x);
      auto scale_r = floats_at(part, 4 * j, 1);
      it.out.add_(unpack_signs(part.narrow(0, 4 * t + offs[j], (n + 7) / 8), n).mul_(scale_r));
    }
    it.out.div_(dp.size());
  }
}

}  // namespace optcc
