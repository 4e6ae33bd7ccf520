#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "scalesweep/io/safetensors.h"  // IoError

namespace scalesweep::io {
namespace {

std::string errno_str() { return std::strerror(errno); }

// Splits "a/b/c.x" into ("a/b", "c.x"); a trailing '/' is ignored.
void split_path(std::string path, std::string* dir, std::string* base) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    dir->assign(1, '.');
    *base = path;
  } else {
    if (slash == 0) {
      dir->assign(1, '/');
    } else {
      dir->assign(path, 0, slash);
    }
    *base = path.substr(slash + 1);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse
  (void)::fsync(fd);
  ::close(fd);
}

// fsyncs every regular file under dir, and the directories themselves.
void fsync_tree(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) {
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        (void)::fsync(fd);
        ::close(fd);
      }
    } else if (it->is_directory(ec)) {
      fsync_dir(it->path());
    }
  }
  fsync_dir(dir);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  std::string dir, base;
  split_path(path_, &dir, &base);
  if (base.empty() || base == "." || base == "..") {
    throw IoError(path_ + ": not a file name");
  }
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw IoError(path_ + ": is a directory");
  }
  std::string templ = (dir == "/" ? "" : dir) + "/." + base + ".tmp.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd_ < 0) throw IoError(path_ + ": cannot create a file in '" + dir + "': " + errno_str());
  tmp_ = buf.data();
  ::fchmod(
      fd_, 0644 & ~[] {
        const mode_t m = ::umask(0);
        ::umask(m);
        return m;
      }());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw IoError(path_ + ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(path_ + ": write failed: " + errno_str());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (committed_) return;
  if (::fsync(fd_) != 0) throw IoError(path_ + ": fsync failed: " + errno_str());
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw IoError(path_ + ": close failed: " + errno_str());
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    throw IoError(path_ + ": cannot rename the temp file into place: " + errno_str());
  }
  committed_ = true;
  std::string dir, base;
  split_path(path_, &dir, &base);
  fsync_dir(dir);
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

void write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

AtomicDir::AtomicDir(std::string path, bool overwrite)
    : path_(std::move(path)), overwrite_(overwrite) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  std::string dir, base;
  split_path(path_, &dir, &base);
  if (base.empty() || base == "." || base == "..") throw IoError(path_ + ": not a directory name");
  struct stat st {};
  if (!overwrite_ && ::stat(path_.c_str(), &st) == 0) {
    throw IoError(path_ + ": already exists (refusing to overwrite)");
  }
  std::string templ = (dir == "/" ? "" : dir) + "/." + base + ".tmp.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw IoError(path_ + ": cannot create a directory in '" + dir + "': " + errno_str());
  }
  tmp_ = buf.data();
  ::chmod(
      tmp_.c_str(), 0755 & ~[] {
        const mode_t m = ::umask(0);
        ::umask(m);
        return m;
      }());
}

AtomicDir::~AtomicDir() {
  if (!committed_ && !tmp_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
  }
}

void AtomicDir::commit() {
  if (committed_) return;
  fsync_tree(tmp_);
  std::string dir, base;
  split_path(path_, &dir, &base);
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    if (!overwrite_) throw IoError(path_ + ": already exists (refusing to overwrite)");
    // Move the old one aside, put the new one in place, then delete the old one.
    const std::string old = tmp_ + ".old";
    if (::rename(path_.c_str(), old.c_str()) != 0) {
      throw IoError(path_ + ": cannot move the existing output aside: " + errno_str());
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string err = errno_str();
      (void)::rename(old.c_str(), path_.c_str());
      throw IoError(path_ + ": cannot rename the temp directory into place: " + err);
    }
    committed_ = true;
    std::error_code ec;
    std::filesystem::remove_all(old, ec);
  } else {
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      throw IoError(path_ + ": cannot rename the temp directory into place: " + errno_str());
    }
    committed_ = true;
  }
  fsync_dir(dir);
}

}  // namespace scalesweep::io
