// Small file and hashing helpers shared by the datasets/ code (no LibTorch, no SentencePiece).
#pragma once

#include <cstddef>
#include <string>

namespace optcc::data {

// "sha512-<base64>" of a file's bytes: the form npm publishes as `dist.integrity`.
// Throws std::runtime_error naming the path when the file cannot be read.
std::string sha512_integrity_of_file(const std::string& path);

// Lower-case hex SHA-256 of a byte range (64 characters).
std::string sha256_hex(const void* data, size_t size);

// A sibling of `final_path` that no other process or call uses: "<final_path>.tmp.<pid>.<n>".
// Write there, then `commit_file` it, so readers see either the old file or the complete new one.
std::string temp_path_for(const std::string& final_path);

// rename(tmp, final); throws std::runtime_error naming both paths on failure.
void commit_file(const std::string& tmp_path, const std::string& final_path);

// Writes `bytes` to `path` atomically (temp file + rename). Throws std::runtime_error on I/O errors.
void write_file_atomic(const std::string& path, const std::string& bytes);

// The message of a failed write to `path` (a stream's or write(2)'s), with the OS error in errno
// now: "write error on PATH: File too large (errno 27): the disk is full or a quota or file-size limit
// is reached. Fix: ...". For the caller to throw as std::runtime_error.
std::string write_error(const std::string& path);

// Whole file as a string. Throws std::runtime_error naming the path when it cannot be read.
std::string read_file(const std::string& path);

// Removes a file or directory tree when destroyed, unless released (for temp outputs on error paths).
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  ~RemoveOnExit();
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  void release() { path_.clear(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace optcc::data
