// What every file format of the io layer shares: the error type its readers and writers throw,
// and a read-only memory map of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

namespace scalesweep::io {

// Error in a file (format, bounds, missing tensor, unsupported dtype, I/O failure).
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Read-only memory map of a whole file (empty files map to an empty span).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws IoError
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace scalesweep::io
