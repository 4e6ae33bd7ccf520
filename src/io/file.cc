// The io layer's shared file pieces (include/scalesweep/io/file.h).
#include "scalesweep/io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/atomic_file.h"

namespace scalesweep::io {

// ---------------------------------------------------------------------------- MappedFile

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    throw IoError(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      throw IoError(path + ": cannot map: " + err);
    }
    data_ = static_cast<const uint8_t*>(p);
    guard_mapping(data_, size_, path_);  // SIGBUS (truncated while mapped): one clear message
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) {
    unguard_mapping(data_);
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) {
      unguard_mapping(data_);
      ::munmap(const_cast<uint8_t*>(data_), size_);
    }
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

}  // namespace scalesweep::io
