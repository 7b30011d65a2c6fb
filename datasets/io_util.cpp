#include "datasets/io_util.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace optcc::data {
namespace {

std::string base64(const unsigned char* data, size_t size) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  for (size_t i = 0; i < size; i += 3) {
    uint32_t v = uint32_t(data[i]) << 16;
    if (i + 1 < size) v |= uint32_t(data[i + 1]) << 8;
    if (i + 2 < size) v |= uint32_t(data[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < size ? kAlphabet[v & 63] : '=';
  }
  return out;
}

using MdCtx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

}  // namespace

std::string sha512_integrity_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot open {} to hash it: {}", path, std::strerror(errno)));
  MdCtx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha512(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: cannot initialise SHA-512");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), size_t(in.gcount()));
  }
  if (in.bad()) throw std::runtime_error(fmt::format("read error while hashing {}", path));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return "sha512-" + base64(md, len);
}

std::string sha256_hex(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: SHA-256 failed");
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string temp_path_for(const std::string& final_path) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.tmp.{}.{}", final_path, ::getpid(), counter++);
}

void commit_file(const std::string& tmp_path, const std::string& final_path) {
  if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0)
    throw std::runtime_error(
        fmt::format("cannot rename {} to {}: {}", tmp_path, final_path, std::strerror(errno)));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = temp_path_for(path);
  RemoveOnExit guard(tmp);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    if (!out) throw std::runtime_error(write_error(tmp));
  }
  commit_file(tmp, path);
  guard.release();
}

std::string write_error(const std::string& path) {
  const int e = errno;
  return fmt::format("write error on {}: {} (errno {}){}. Fix: free space on that file system (or raise the quota or "
                     "file-size limit), or point data.dir elsewhere, and run again",
                     path, e != 0 ? std::strerror(e) : "unknown error", e,
                     e == ENOSPC || e == EFBIG || e == EDQUOT ? ": the disk is full or a quota or file-size limit is reached"
                                                               : "");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(fmt::format("read error on {}", path));
  return s;
}

RemoveOnExit::~RemoveOnExit() {
  if (path_.empty()) return;
  std::error_code ec;  // best effort: never throw from a destructor
  std::filesystem::remove_all(path_, ec);
}

}  // namespace optcc::data
