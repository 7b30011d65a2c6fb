#include "harness/records/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <type_traits>
#include <vector>

#include "compat/torch_compat.h"

namespace optcc {
namespace fs = std::filesystem;

namespace {

// 2: compressor state under state/<name>; 3: stateful compressors store the (name, shape) list
// their per-tensor state belongs to (compression/state_manifest.h).
constexpr int64_t kFormatVersion = 3;

std::string rank_file(const fs::path& ckpt_dir, int64_t rank) {
  return (ckpt_dir / fmt::format("rank_{:05d}.pt", rank)).string();
}

// SHA-256 of a file's bytes, lowercase hex (OpenSSL's EVP interface).
std::string sha256_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("checkpoint: cannot open {} to check it: {}", path, std::strerror(errno)));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("checkpoint: OpenSSL cannot initialise SHA-256");
  }
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw std::runtime_error(fmt::format("checkpoint: read error in {}: {}", path, std::strerror(errno)));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    out.flush();
    if (!out) {
      const int e = errno;
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error(fmt::format("checkpoint: cannot write {}: {}", tmp.string(), std::strerror(e)));
    }
  }
  fs::rename(tmp, path);
}

// Writes `ar` to `path` through write(2), then fsync and close. Throws std::runtime_error naming the
// path and the OS error (a full disk, a file-size limit, a quota) and removes what it wrote. The
// bytes go through our own writer because LibTorch's file writer, failing, aborts the process from
// its destructor; ours never reports an error to LibTorch (it keeps the first and skips the rest).
void write_archive(torch::serialize::OutputArchive& ar, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::runtime_error(fmt::format("checkpoint: cannot create {}: {}", path, std::strerror(errno)));
  }
  int error = 0;
  const auto writer = [&](const void* data, size_t n) -> size_t {
    const char* p = static_cast<const char*>(data);
    size_t left = n;
    while (error == 0 && left > 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w < 0) {
        if (errno != EINTR) error = errno;
        continue;
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
    return n;
  };
  std::string failure;
  try {
    ar.save_to(writer);
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  }
  if (error == 0 && failure.empty() && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && failure.empty()) return;
  ::unlink(path.c_str());
  throw std::runtime_error(fmt::format(
      "checkpoint: cannot write {}: {}. Nothing of this checkpoint is used (`latest`, if there is one, still "
      "names the last complete checkpoint). Fix: free space on that file system (or raise the quota / file-size "
      "limit), or set checkpoint.dir to another one; then --resume auto continues from the last complete "
      "checkpoint, or starts over when there is none",
      path, error != 0 ? fmt::format("{} (errno {})", std::strerror(error), error) : failure));
}

// `ar` as `file`: through `file`.tmp, with its checksum beside it before it takes its name (a file
// that exists has one). "" when written, else why not (nothing of it is left under its name).
std::string write_rank_file(torch::serialize::OutputArchive& ar, const std::string& file) {
  const std::string tmp = file + ".tmp";
  try {
    write_archive(ar, tmp);
    write_text_atomically(checkpoint_checksum_file(file),
                          sha256_of_file(tmp) + "  " + fs::path(file).filename().string() + "\n");
    fs::rename(tmp, file);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The step of a checkpoint directory name "iter_<digits>", or nullopt for any other name.
std::optional<int64_t> iter_step(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "iter_"
  if (name.rfind("iter_", 0) != 0 || name.size() == kPrefix || name.size() > kPrefix + 18) return std::nullopt;
  for (size_t i = kPrefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  }
  return std::stoll(name.substr(kPrefix));
}

torch::Tensor scalar(int64_t v) { return torch::tensor({v}, torch::kLong); }

int64_t read_scalar(torch::serialize::InputArchive& ar, const std::string& key) {
  torch::Tensor t;
  ar.read(key, t);
  return t.item<int64_t>();
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const TrainState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer, const CheckpointLayout& layout,
                            const std::string& config_yaml, int64_t keep,
                            const std::function<bool(bool)>& all_written,
                            const std::map<std::string, at::Generator>& generators,
                            const std::vector<CheckpointPart>& parts) {
  const fs::path ckpt_dir = fs::path(dir) / fmt::format("iter_{:07d}", state.step);
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec) throw std::runtime_error(fmt::format("checkpoint: cannot create {}: {}", ckpt_dir.string(), ec.message()));

  torch::serialize::OutputArchive ar;
  ar.write("meta/format_version", scalar(kFormatVersion));
  ar.write("meta/step", scalar(state.step));
  ar.write("meta/consumed_samples", scalar(state.consumed_samples));
  ar.write("meta/layout", torch::tensor({layout.tp, layout.pp, layout.dp, layout.rank}, torch::kLong));
  ar.write("meta/config", c10::IValue(config_yaml));
  for (const auto& p : model.named_parameters()) ar.write("model/" + p.key(), p.value());
  for (const auto& b : model.named_buffers()) ar.write("model/" + b.key(), b.value(), /*is_buffer=*/true);
  torch::serialize::OutputArchive opt_ar;
  optimizer.save(opt_ar);
  ar.write("optimizer", opt_ar);
  ar.write("rng/cpu", at::detail::getDefaultCPUGenerator().get_state());
  for (const auto& [name, gen] : generators) ar.write("rng/" + name, gen.get_state());
  for (const auto& part : parts) {
    torch::serialize::OutputArchive sub;
    part.save(sub);
    ar.write("state/" + part.name, sub);
    ar.write("meta/state/" + part.name, c10::IValue(part.identity));
  }

  const std::string file = rank_file(ckpt_dir, layout.rank);
  const std::string problem = write_rank_file(ar, file);
  if (!all_written(problem.empty())) {
    // Some rank could not write its file: nothing of this step's checkpoint stays (`latest` keeps
    // naming the previous one), and every rank stops.
    std::error_code ec;
    for (const auto& f : {file + ".tmp", file, checkpoint_checksum_file(file), checkpoint_checksum_file(file) + ".tmp"}) {
      fs::remove(f, ec);
    }
    all_written(true);  // every rank's files are gone: the directory is empty of rank files
    if (layout.rank == 0) fs::remove_all(ckpt_dir, ec);
    throw std::runtime_error(problem.empty()
                                 ? fmt::format("checkpoint: another rank could not write its file of {} (its error "
                                               "names the file); nothing of this checkpoint is used",
                                               ckpt_dir.string())
                                 : problem);
  }
  if (layout.rank == 0) {
    write_text_atomically(fs::path(dir) / "latest", ckpt_dir.filename().string() + "\n");
    if (keep > 0) prune_checkpoints(dir, state.step, keep);
  }
  return ckpt_dir.string();
}

std::string checkpoint_checksum_file(const std::string& file) { return file + ".sha256"; }

std::string checkpoint_checksum_problem(const std::string& file) {
  const std::string sum_file = checkpoint_checksum_file(file);
  std::ifstream in(sum_file);
  std::string expected;
  if (!(in >> expected)) {
    return fmt::format("{} has no checksum ({} is missing or empty: the file was not written completely by this "
                       "optcc, or the checksum was removed)",
                       file, sum_file);
  }
  const std::string actual = sha256_of_file(file);
  if (actual == expected) return "";
  return fmt::format("{} is corrupt: its SHA-256 is {}, but {}, written with it, says {}", file, actual, sum_file,
                     expected);
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t written_step, int64_t keep) {
  // iter_* directories by step (not by name: iter_10000000 sorts before iter_9999999 as text).
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto step = iter_step(e.path().filename().string());
    if (!e.is_directory() || !step || *step == written_step) continue;
    older.emplace_back(*step, e.path());
  }
  std::sort(older.begin(), older.end(), std::greater<>());  // newest step first
  std::vector<std::string> removed;
  int64_t kept = 1;  // the checkpoint just written
  std::error_code ec;
  for (const auto& [step, path] : older) {
    // Later steps than the one just written are an abandoned timeline: always removed.
    if (step < written_step && kept < keep) {
      kept += 1;
      continue;
    }
    fs::remove_all(path, ec);
    if (ec) throw std::runtime_error(fmt::format("checkpoint: cannot remove {}: {}", path.string(), ec.message()));
    removed.push_back(path.string());
  }
  return removed;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  std::string name;
  if (!(in >> name)) return std::nullopt;
  return (fs::path(dir) / name).string();
}

std::optional<std::string> find_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "latest")) {
    const auto named = latest_checkpoint(path);
    if (!named || !fs::exists(rank_file(*named, 0))) {
      throw std::runtime_error(fmt::format(
          "checkpoint: {}/latest names {}, which holds no rank_00000.pt (removed or never completed). Fix: "
          "point --resume at an existing iter_NNNNNNN directory under {}, or remove {}/latest to start over.",
          path, named ? *named : std::string("nothing"), path, path));
    }
    return named;
  }
  if (fs::exists(rank_file(path, 0))) return path;
  return std::nullopt;
}

namespace {

// The newest iter_* directory of the same checkpoint.dir older than `ckpt_dir` whose file of `rank` is
// there and matches its checksum, or "" when there is none.
std::string newest_intact_older(const fs::path& ckpt_dir, const std::string& rank_name) {
  const auto own = iter_step(ckpt_dir.filename().string());
  std::vector<std::pair<int64_t, fs::path>> older;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckpt_dir.parent_path(), ec)) {
    const auto step = iter_step(e.path().filename().string());
    if (step && own && *step < *own) older.emplace_back(*step, e.path());
  }
  std::sort(older.begin(), older.end(), std::greater<>());
  for (const auto& [step, dir] : older) {
    const std::string f = (dir / rank_name).string();
    if (!fs::exists(f) || !fs::exists(checkpoint_checksum_file(f))) continue;
    if (checkpoint_checksum_problem(f).empty()) return dir.string();
  }
  return "";
}

// Up to five names, then how many more.
std::string describe_tensor_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 5) out += fmt::format(" and {} more", names.size() - 5);
  return out;
}

// The archive of `file`, checked against its checksum and for this build's format.
torch::serialize::InputArchive open_archive(const std::string& file) {
  if (const std::string problem = checkpoint_checksum_problem(file); !problem.empty()) {
    const fs::path dir = fs::path(file).parent_path();
    const std::string older = newest_intact_older(dir, fs::path(file).filename().string());
    throw std::runtime_error(fmt::format(
        "checkpoint: {}. Nothing of it was loaded. Fix: {}", problem,
        older.empty() ? fmt::format("no older intact checkpoint of this rank is in {}; start over without --resume "
                                    "(or restore the file from a copy)",
                                    dir.parent_path().string())
                      : fmt::format("resume from the newest intact older checkpoint: --resume {}", older)));
  }
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(file, torch::Device(torch::kCPU));  // device-agnostic (checkpoint.h)
  } catch (const c10::Error& e) {
    throw std::runtime_error(fmt::format("checkpoint: cannot read {}: {}", file, e.what_without_backtrace()));
  }
  if (const int64_t v = read_scalar(ar, "meta/format_version"); v != kFormatVersion) {
    throw std::runtime_error(fmt::format("checkpoint: {} has format version {}, this build reads {}. Fix: resume "
                                         "with the build that wrote it, or start fresh without --resume.",
                                         file, v, kFormatVersion));
  }
  return ar;
}

CheckpointLayout saved_layout(torch::serialize::InputArchive& ar) {
  torch::Tensor t;
  ar.read("meta/layout", t);
  auto l = t.accessor<int64_t, 1>();
  return CheckpointLayout{l[0], l[1], l[2], l[3]};
}

// The archive of `file`, checked for this build's format and this run's layout.
torch::serialize::InputArchive open_checkpoint(const std::string& file, const CheckpointLayout& layout) {
  torch::serialize::InputArchive ar = open_archive(file);
  const CheckpointLayout l = saved_layout(ar);
  if (l.tp != layout.tp || l.pp != layout.pp || l.dp != layout.dp) {
    throw std::runtime_error(fmt::format(
        "checkpoint: {} was written with layout tp={} pp={} dp={}, but this run uses tp={} pp={} "
        "dp={}. Fix: resume with the checkpoint's layout (training does not re-shard; `optcc eval --checkpoint` "
        "evaluates a checkpoint under any layout).",
        file, l.tp, l.pp, l.dp, layout.tp, layout.pp, layout.dp));
  }
  return ar;
}

void load_parameters(torch::serialize::InputArchive& ar, const std::string& file, torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    torch::Tensor t;
    try {
      ar.read("model/" + p.key(), t);
    } catch (const c10::Error&) {
      throw std::runtime_error(fmt::format("checkpoint: {} lacks parameter '{}'", file, p.key()));
    }
    if (!t.sizes().equals(p.value().sizes())) {
      throw std::runtime_error(fmt::format("checkpoint: {}: parameter '{}' has shape {} but the model "
                                           "has {}. Fix: resume with the same model config.",
                                           file, p.key(), fmt::join(t.sizes(), "x"),
                                           fmt::join(p.value().sizes(), "x")));
    }
    p.value().copy_(t);
  }
}

// The default CPU generator, then the named ones.
void load_generators(torch::serialize::InputArchive& ar, const std::string& file,
                     const std::map<std::string, at::Generator>& generators) {
  torch::Tensor rng;
  ar.read("rng/cpu", rng);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rng);
  for (auto [name, g] : generators) {
    torch::Tensor state;
    try {
      ar.read("rng/" + name, state);
    } catch (const c10::Error&) {
      throw std::runtime_error(fmt::format("checkpoint: {} lacks the '{}' generator state", file, name));
    }
    g.set_state(state);
  }
}

// Each part's state, after checking that it was written by the same compressor (identity).
void load_parts(torch::serialize::InputArchive& ar, const std::string& file, const std::vector<CheckpointPart>& parts) {
  for (const auto& part : parts) {
    c10::IValue saved_identity;
    torch::serialize::InputArchive sub;
    try {
      ar.read("meta/state/" + part.name, saved_identity);
      ar.read("state/" + part.name, sub);
    } catch (const c10::Error&) {
      throw std::runtime_error(fmt::format("checkpoint: {} holds no '{}' state ({}). Fix: resume with "
                                           "the compression settings the checkpoint was written with.",
                                           file, part.name, part.identity));
    }
    if (saved_identity.toStringRef() != part.identity) {
      throw std::runtime_error(fmt::format("checkpoint: {} was written with {} = {}, but this run uses {}. "
                                           "Fix: resume with the same compressor.",
                                           file, part.name, saved_identity.toStringRef(), part.identity));
    }
    try {
      part.load(sub);
    } catch (const std::invalid_argument& e) {  // e.g. state kept for other tensors (StateMismatch)
      throw std::runtime_error(fmt::format(
          "checkpoint: {}: the '{}' state ({}) does not fit this run: {}. Fix: resume with the compression "
          "settings the checkpoint was written with (compression.*, and train.micro_batch_size / "
          "global_batch_size for pipeline codec state), or start fresh without --resume.",
          file, part.name, part.identity, e.what()));
    }
  }
}

}  // namespace

// The optimizer's state was read on the host: its tensors go to the parameters' device (one per rank).
static void place_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& model) {
  const auto params = model.parameters();
  if (params.empty() || params[0].is_cpu()) return;
  const torch::Device device = params[0].device();
  for (auto& entry : optimizer.state()) {
    auto* s = dynamic_cast<torch::optim::AdamWParamState*>(entry.second.get());
    TORCH_CHECK(s, "checkpoint: only AdamW's state can be placed on ", device.str());
    s->exp_avg(s->exp_avg().to(device));
    s->exp_avg_sq(s->exp_avg_sq().to(device));
    if (s->max_exp_avg_sq().defined()) s->max_exp_avg_sq(s->max_exp_avg_sq().to(device));
  }
}

TrainState load_checkpoint(const std::string& ckpt, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, const CheckpointLayout& layout,
                           const std::map<std::string, at::Generator>& generators,
                           const std::vector<CheckpointPart>& parts) {
  const fs::path ckpt_dir = find_checkpoint(ckpt).value_or(ckpt);
  const std::string file = rank_file(ckpt_dir, layout.rank);
  if (!fs::exists(file)) {
    throw std::runtime_error(fmt::format(
        "checkpoint: {} does not exist. Fix: point --resume at a checkpoint directory "
        "(iter_NNNNNNN or its parent holding `latest`) written by a run with the same layout.",
        file));
  }
  torch::serialize::InputArchive ar = open_checkpoint(file, layout);
  if (const auto bad = non_finite_tensors(ar); !bad.empty()) {
    const std::string older = newest_intact_older(ckpt_dir, fs::path(file).filename().string());
    throw std::runtime_error(fmt::format(
        "checkpoint: {} (rank {}) holds NaN or infinite values in {} tensor{}: {}. A run resumed from it would skip "
        "every step. Nothing of it was loaded. Fix: {}",
        file, layout.rank, bad.size(), bad.size() == 1 ? "" : "s", describe_tensor_names(bad),
        older.empty() ? "start over without --resume (no older checkpoint of this rank is intact)"
                      : "resume from an older checkpoint: --resume " + older));
  }
  torch::NoGradGuard no_grad;
  load_parameters(ar, file, model);
  torch::serialize::InputArchive opt_ar;
  ar.read("optimizer", opt_ar);
  optimizer.load(opt_ar);
  place_optimizer_state(optimizer, model);
  load_generators(ar, file, generators);
  load_parts(ar, file, parts);
  return TrainState{read_scalar(ar, "meta/step"), read_scalar(ar, "meta/consumed_samples")};
}

std::vector<std::string> non_finite_tensors(torch::serialize::InputArchive& ar, const std::string& prefix) {
  std::vector<std::string> bad;
  for (const std::string& key : ar.keys()) {
    torch::Tensor t;
    torch::serialize::InputArchive sub;
    if (ar.try_read(key, t)) {
      if (t.defined() && t.is_floating_point() && !torch::isfinite(t).all().item<bool>()) bad.push_back(prefix + key);
    } else if (ar.try_read(key, sub)) {
      for (auto& name : non_finite_tensors(sub, prefix + key + "/")) bad.push_back(std::move(name));
    }
  }
  return bad;
}

namespace {

// non_finite_tensors of what `save` writes, under `prefix` (one archive at a time: the peak is one
// part's state on the host).
std::vector<std::string> non_finite_saved(const std::string& prefix,
                                          const std::function<void(torch::serialize::OutputArchive&)>& save) {
  torch::serialize::OutputArchive out;
  save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes, torch::Device(torch::kCPU));
  return non_finite_tensors(in, prefix);
}

// AdamW's (or Adam's) moments, checked where they live (no copy); nullopt for another optimizer.
std::optional<std::vector<std::string>> non_finite_adam_moments(torch::optim::Optimizer& optimizer) {
  std::vector<std::string> bad;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto& state = optimizer.state();
      const auto it = state.find(optimizer_state_key(state, groups[g].params()[i].unsafeGetTensorImpl()));
      if (it == state.end()) continue;
      std::vector<std::pair<std::string, torch::Tensor>> moments;
      if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
        moments.emplace_back("exp_avg", w->exp_avg());
        moments.emplace_back("exp_avg_sq", w->exp_avg_sq());
        moments.emplace_back("max_exp_avg_sq", w->max_exp_avg_sq());
      } else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get())) {
        moments.emplace_back("exp_avg", a->exp_avg());
        moments.emplace_back("exp_avg_sq", a->exp_avg_sq());
        moments.emplace_back("max_exp_avg_sq", a->max_exp_avg_sq());
      } else {
        return std::nullopt;
      }
      for (const auto& [name, t] : moments) {
        if (t.defined() && t.numel() > 0 && !torch::isfinite(t).all().item<bool>()) {
          bad.push_back(fmt::format("optimizer/group {} parameter {}/{}", g, i, name));
        }
      }
    }
  }
  return bad;
}

}  // namespace

std::vector<std::string> non_finite_state(torch::optim::Optimizer& optimizer, const std::vector<CheckpointPart>& parts) {
  auto moments = non_finite_adam_moments(optimizer);
  std::vector<std::string> bad =
      moments ? std::move(*moments) : non_finite_saved("optimizer/", [&](auto& a) { optimizer.save(a); });
  for (const auto& part : parts) {
    for (auto& name : non_finite_saved("state/" + part.name + "/", part.save)) bad.push_back(std::move(name));
  }
  return bad;
}

std::optional<torch::Tensor> read_checkpoint_tensor(const std::string& ckpt, int64_t rank, const std::string& name,
                                                    const std::string& key) {
  const auto ckpt_dir = find_checkpoint(ckpt);
  if (!ckpt_dir) return std::nullopt;
  const std::string file = rank_file(*ckpt_dir, rank);
  if (!fs::exists(file)) return std::nullopt;
  try {
    torch::serialize::InputArchive ar, sub;
    ar.load_from(file, torch::Device(torch::kCPU));
    ar.read("state/" + name, sub);
    torch::Tensor t;
    sub.read(key, t);
    return t;
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

CheckpointFile read_checkpoint_file(const std::string& ckpt, int64_t rank, bool with_parameters) {
  const auto dir = find_checkpoint(ckpt);
  if (!dir) {
    throw std::runtime_error(fmt::format("checkpoint: no checkpoint at {} (no `latest` file, no rank_00000.pt). Fix: "
                                         "pass a checkpoint.dir holding `latest` or one of its iter_NNNNNNN "
                                         "directories.",
                                         ckpt));
  }
  CheckpointFile out;
  out.path = rank_file(*dir, rank);
  if (!fs::exists(out.path)) {
    throw std::runtime_error(fmt::format("checkpoint: {} does not exist (the checkpoint in {} is incomplete, or was "
                                         "written by fewer ranks)",
                                         out.path, *dir));
  }
  torch::serialize::InputArchive ar = open_archive(out.path);
  out.step = read_scalar(ar, "meta/step");
  out.consumed_samples = read_scalar(ar, "meta/consumed_samples");
  out.layout = saved_layout(ar);
  c10::IValue config;
  ar.read("meta/config", config);
  out.config_yaml = config.toStringRef();
  if (!with_parameters) return out;
  const std::string prefix = "model/";
  for (const auto& key : ar.keys()) {
    if (key.rfind(prefix, 0) != 0) continue;
    torch::Tensor t;
    ar.read(key, t);
    out.parameters[key.substr(prefix.size())] = t;
  }
  return out;
}

}  // namespace optcc
