// Shared pieces of the libFuzzer harnesses (fuzz/*_fuzz.cc).
//
// Every harness feeds the bytes to the library's real entry point. Parsers that take a path
// get an anonymous in-memory file (memfd) named by /proc/self/fd/N, so they run exactly the
// code a file on disk runs (open, fstat, mmap or ifstream).
//
// Verdicts: a clear refusal (std::runtime_error, which covers io::IoError, or
// std::invalid_argument) is the expected answer to bad bytes. Any other exception escaping
// the library (std::out_of_range / std::length_error from a container, std::bad_alloc,
// a JSON library exception with its own wording) is a finding: the harness aborts naming it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <typeinfo>

namespace ss_fuzz {

class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("ss_fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

  // A path that ends in `name` (for parsers that dispatch on the extension): a symbolic link
  // to this file in a per-process folder under the temp directory, replaced on each call.
  std::string named(const std::string& name) const {
    static const std::string dir = [] {
      char tmpl[] = "/tmp/ss_fuzz_XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) std::abort();
      return std::string(tmpl);
    }();
    const std::string link = dir + "/" + name;
    ::unlink(link.c_str());
    if (::symlink(path_.c_str(), link.c_str()) != 0) std::abort();
    return link;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// Runs `f`; a runtime_error / invalid_argument is a refusal (fine), anything else aborts.
template <class F>
void expect_clear_refusal(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error& e) {
    // std::range_error / overflow_error / underflow_error are runtime_errors too, but only
    // std::runtime_error itself and the project's IoError carry a message naming the input.
    const std::type_info& t = typeid(e);
    if (t == typeid(std::range_error) || t == typeid(std::overflow_error) ||
        t == typeid(std::underflow_error)) {
      std::fprintf(stderr, "ss_fuzz: unexpected %s: %s\n", t.name(), e.what());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ss_fuzz: unexpected exception %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

// Bounds what the harnesses ask a parsed file to decode (dequantize, read_f32): the parsers
// validate sizes against the file, so this only keeps each run quick.
inline constexpr int64_t kMaxDecodeElems = 1 << 20;

}  // namespace ss_fuzz
